"""dwell.memory: what the allocator holds, and the releaser giving a burst's freed memory
back (glibc, this process: dwell's images and the local stack run on Debian)."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

from dwell import memory

SERVICES = Path(memory.__file__).resolve().parents[1]


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_the_releaser_gives_back_what_a_thread_freed() -> None:
    """64 MiB of 64 KiB blocks (below the mmap threshold: they live in an arena) freed,
    every other one kept so that nothing can be trimmed from the top alone: the RSS stays
    up until the releaser's look, which gives the free pages back."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    assert not memory.Releaser(min_free=1 << 40).check()  # less free than that: no release
    rel = memory.Releaser(interval_s=3600, min_free=32 << 20)
    blocks = [libc.malloc(64 << 10) for _ in range(2048)]
    for b in blocks:
        libc.memset(b, 1, 64 << 10)
    for b in blocks[::2]:
        libc.free(b)
    before = _rss_kib()
    assert memory.allocator_bytes()["free"] >= 60 << 20
    assert rel.check()
    after = _rss_kib()
    for b in blocks[1::2]:
        libc.free(b)
    assert before - after >= 48 << 10, (before, after)


_MAPPED_AFTER_A_LARGER_FREE = """
import ctypes
from dwell import memory
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if CONFIGURE:
    memory.configure()
libc.free(libc.malloc(4 << 20))
before = memory.allocator_bytes()["mapped"]
block = libc.malloc(2 << 20)
grew = memory.allocator_bytes()["mapped"] - before
libc.free(block)
print(grew, memory.allocator_bytes()["mapped"] - before)
"""


def _mapped_after_a_larger_free(configure: bool) -> list[int]:
    """In a fresh process (as at a service's start: no large free blocks in the arenas
    yet): how much a 2 MiB block adds to the mapped bytes after a 4 MiB one was freed,
    and what is left mapped once it is freed too."""
    code = f"CONFIGURE = {configure}\n" + _MAPPED_AFTER_A_LARGER_FREE
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=os.environ | {"PYTHONPATH": str(SERVICES)}).stdout
    return [int(x) for x in out.split()]


def test_large_blocks_keep_mappings_of_their_own() -> None:
    """glibc raises its mmap threshold when a mapped block is freed, so that the next
    blocks that size come from the arenas and stay resident. After `configure` a 2 MiB
    block is mapped, and unmapped when freed, even after a 4 MiB one was freed."""
    assert _mapped_after_a_larger_free(configure=False)[0] == 0  # glibc's default
    grew, left = _mapped_after_a_larger_free(configure=True)
    assert grew >= 2 << 20 and left == 0



_ALLOCATOR = """
import os, sys
from dwell import memory
memory.use_system_allocator()
print(os.getpid(), os.environ.get("PYTHONMALLOC"), ",".join(sys.argv[1:]) or "-",
      sys.getallocatedblocks() == 0)
"""


def _allocator(env: dict[str, str], *args: str) -> list[str]:
    """What the child printed, and its pid checked against the one started."""
    proc = subprocess.Popen([sys.executable, "-c", _ALLOCATOR, *args], env=env,
                            stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.count("\n") == 1, out  # what ran before the exec ran once
    pid, *rest = out.split()
    assert int(pid) == proc.pid
    return rest


def test_the_tracker_runs_on_glibcs_allocator_unless_told_otherwise() -> None:
    """`use_system_allocator` runs the same process again (same pid, same arguments) on
    PYTHONMALLOC=malloc, where Python's own allocator hands out no block; a PYTHONMALLOC
    already set is kept."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    assert _allocator(env, "a", "b c") == ["malloc", "a,b", "c", "True"]
    assert _allocator(env | {"PYTHONMALLOC": "pymalloc"}) == ["pymalloc", "-", "False"]


def test_cycles_paused_blocks_overlap_and_the_collector_comes_back_as_it_was() -> None:
    """Two threads' blocks overlap: the collector stays off until the last one ends, then
    is on again; a process that had it off keeps it off; an exception ends a block too."""
    assert gc.isenabled()
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with memory.cycles_paused():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other)
    with memory.cycles_paused():
        t.start()
        assert inside.wait(5)
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    t.join(5)
    assert gc.isenabled()

    try:
        with memory.cycles_paused():
            raise ValueError("a copy failed")
    except ValueError:
        pass
    assert gc.isenabled()

    gc.disable()
    try:
        with memory.cycles_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
