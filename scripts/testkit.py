"""The small helpers the tests, the benches and the stack scripts share: the wall clock
in dwell's milliseconds, a free local port, and a poll with a deadline. Standard library
only, like devstack.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TimedOut(AssertionError):
    """`wait_for` gave up; an AssertionError, so a test fails on it as on an assert."""


def now_ms() -> int:
    """The wall clock in epoch milliseconds, as dwell's due times are written."""
    return time.time_ns() // 1_000_000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], T | None], timeout: float, what: str,
             interval: float = 0.05) -> T:
    """Poll ``pred`` (at least once) until it returns something truthy (returned), or
    raise TimedOut after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimedOut(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
