"""Giving memory back to the system after a burst.

CPython frees a burst's objects, but glibc's allocator keeps the freed pages in its arenas
(one per thread that allocated) for reuse, and so does librdkafka's prefetch buffers once
consumed: a process that once held a burst's records kept its peak RSS for good.
`release()` asks glibc to return whatever it holds free (`malloc_trim(0)`, which also
unmaps free pages inside the heap, in every arena). It is called after large work (an
ingest batch stream going idle, a restage round, a large drain round), and by
`Releaser`, every process's watch on its allocator: memory freed later, or by threads
that are not dwell's (librdkafka's, Py4J's), goes back too. Elsewhere than glibc it does
nothing.

`cycles_paused()` keeps the cyclic garbage collector from running over a copy that holds
many objects at once (a restage round, a drain round, a backoff batch)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import threading
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("dwell.memory")


def _libc(name: str, argtypes: list[type], restype: type) -> object | None:
    """glibc's function ``name``, or None elsewhere."""
    lib = ctypes.util.find_library("c")
    if not lib:
        return None
    try:
        fn = getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


_TRIM = _libc("malloc_trim", [ctypes.c_size_t], ctypes.c_int)


# mallopt(3) parameter: allocations this large or larger get mappings of their own.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20


def configure() -> None:
    """At a process's start: allocations of 1 MiB or more (Kafka fetch and produce
    buffers, large lists and arrays) get mappings of their own, unmapped when freed.
    glibc's default threshold starts at 128 KiB and rises to 32 MiB as such blocks are
    freed, after which they are carved from the arenas and stay resident there."""
    mallopt = _libc("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)  # type: ignore[operator]


def use_system_allocator() -> None:
    """At the start of a process that passes bursts of small objects through (the
    tracker): run again, the same process (same pid, same arguments), with
    ``PYTHONMALLOC=malloc``, unless PYTHONMALLOC is set already (``pymalloc`` keeps
    Python's own allocator). Python's allocator keeps a 1 MiB arena resident while any
    of its blocks lives, so the few objects that outlive a burst pinned tens of MiB;
    glibc's arenas give back every free page on `release`."""
    if "PYTHONMALLOC" in os.environ:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              os.environ | {"PYTHONMALLOC": "malloc"})


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_MALLINFO = _libc("mallinfo2", [], _Mallinfo2)


def allocator_bytes() -> dict[str, int]:
    """What glibc's allocator holds, over all its arenas: ``in_use`` (allocated, arenas),
    ``free`` (freed, kept in the arenas: what `release` gives back), ``mapped`` (large
    blocks with mappings of their own). Empty elsewhere than glibc."""
    if _MALLINFO is None:
        return {}
    mi = _MALLINFO()  # type: ignore[operator]
    return {"in_use": int(mi.uordblks), "free": int(mi.fordblks), "mapped": int(mi.hblkhd)}


class AllocatorCollector(Collector):
    """`dwell_process_allocator_bytes{state}`: :func:`allocator_bytes` at scrape time, and
    `dwell_process_python_blocks`, the blocks Python's own allocator has handed out. With
    the process's RSS they tell whether memory after a burst is still in use, kept free
    by the allocator, or held by Python's object arenas."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("dwell_process_allocator_bytes", "Bytes glibc's allocator "
                              "holds, by state (in_use, free, mapped)", labels=["state"])
        for state, n in allocator_bytes().items():
            g.add_metric([state], n)
        yield g
        yield GaugeMetricFamily("dwell_process_python_blocks", "Memory blocks allocated by "
                                "Python's object allocator", value=sys.getallocatedblocks())


ALLOCATOR = AllocatorCollector()


def release() -> None:
    """Return the allocator's free memory to the system (glibc), if it can."""
    if _TRIM is not None:
        _TRIM(0)  # type: ignore[operator]


_paused = 0
_paused_lock = threading.Lock()
_was_enabled = True


@contextlib.contextmanager
def cycles_paused() -> Iterator[None]:
    """No cyclic collection while the block runs (in any thread: the collector is the
    process's). For work that makes a few containers per record and no cycles, all alive
    until it ends: each collection would walk them again for nothing, and reference
    counting frees them when the work drops them.
    Blocks may overlap, in one thread or several: the collector comes back as it was when
    the last one ends."""
    global _paused, _was_enabled
    with _paused_lock:
        if not _paused:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if not _paused and _was_enabled:
                gc.enable()


class Releaser:
    """Every ``interval_s``: when the allocator holds ``min_free`` bytes or more free
    (a burst's memory was freed, wherever and by whichever thread), `release` it. Freed
    memory that was given back and used again since is resident again, so the look does
    not go by what changed: a release with nothing to give back costs a few ms at most
    (it walks the free blocks), and a process that keeps little free (a quiet admission)
    never pays it. Without mallinfo2 it releases every interval."""

    def __init__(self, interval_s: float = 10.0, min_free: int = 16 << 20) -> None:
        self.interval_s = interval_s
        self.min_free = min_free
        self.stopping = threading.Event()

    def check(self) -> bool:
        """One look; True when it released."""
        free = allocator_bytes().get("free")
        if free is not None and free < self.min_free:
            return False
        release()
        return True

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self.check()

    def start(self) -> Releaser:
        threading.Thread(target=self.run, name="dwell-memory-releaser", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
