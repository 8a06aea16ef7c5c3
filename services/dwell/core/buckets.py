"""PIP-448 bucket arithmetic: which time bucket a delayed message belongs to, and which
buckets (and messages) are due at a given ``now``."""

from __future__ import annotations

import numpy as np

# np.unique imports numpy.ma (thousands of objects that then live for good) on its first
# call. Imported at start, they do not land among a burst's short-lived objects, where
# each would keep one of Python's object arenas resident after the burst.
import numpy.ma
import numpy.typing as npt


def _check_tick(tick_time_ms: int) -> None:
    if tick_time_ms < 1:
        raise ValueError(f"tick_time_ms must be >= 1, got {tick_time_ms}")


def bucket_start(deliver_at: int, tick_time_ms: int) -> int:
    """The bucket holding ``deliver_at``: ``deliver_at`` floored to a multiple of the tick."""
    _check_tick(tick_time_ms)
    # Python's % floors, so negative times land in the bucket below, not above.
    return deliver_at - deliver_at % tick_time_ms


def bucket_starts(deliver_at: npt.NDArray[np.int64],
                  tick_time_ms: npt.NDArray[np.int64] | int) -> npt.NDArray[np.int64]:
    """`bucket_start` of each ``deliver_at``, vectorised; ``tick_time_ms`` is one tick or
    one per position. numpy's % floors like Python's."""
    if np.any(np.asarray(tick_time_ms) < 1):
        raise ValueError("tick_time_ms must be >= 1")
    return deliver_at - deliver_at % tick_time_ms


def delivery_cutoff(now: int, tick_time_ms: int, strict: bool) -> int:
    """A message with ``deliver_at <= cutoff`` is delivered at once instead of delayed."""
    _check_tick(tick_time_ms)
    return now if strict else now + tick_time_ms


def bucket_due_cutoff(now: int, tick_time_ms: int, strict: bool) -> int:
    """The largest bucket start that is due at ``now``.

    Non-strict applies PIP-448's message cutoff (``deliverAt <= now + tick``) to every
    message the bucket can hold: its last one, ``bucketStart + tick - 1``, must be within
    it, so ``bucketStart <= now + 1`` and nothing is more than one tick early (comparing
    the bucket start itself with ``now + tick`` would let messages out two ticks early).
    Strict waits until the bucket's last millisecond has passed
    (``bucketStart + tick - 1 <= now``), so no message in a due bucket is ever early.
    """
    _check_tick(tick_time_ms)
    return now - tick_time_ms + 1 if strict else now + 1


def is_bucket_due(bucket_start: int, tick_time_ms: int, now: int, strict: bool) -> bool:
    return bucket_start <= bucket_due_cutoff(now, tick_time_ms, strict)
