"""Giving memory back to the system after a burst.

CPython frees a burst's objects, but glibc's allocator keeps the freed pages in its arenas
(one per thread that allocated) for reuse, and so does librdkafka's prefetch buffers once
consumed: a process that once held a burst's records kept its peak RSS for good.
`release()` asks glibc to return whatever it holds free (`malloc_trim(0)`, which also
unmaps free pages inside the heap). It is cheap when there is nothing to return and is
called after large work only: an ingest batch stream going idle, a restage round, a
large drain round. Elsewhere than glibc it does nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("dwell.memory")


def _malloc_trim() -> object | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _malloc_trim()


def release() -> None:
    """Return the allocator's free memory to the system (glibc), if it can."""
    if _TRIM is not None:
        _TRIM(0)  # type: ignore[operator]
