"""The backoff's decision rule: what one event on dwell.acks calls for, given what is
pending for its message (PIP-130's ack-timeout and PIP-106's negative-ack redeliveries,
dead letters past maxRedeliverCount). Pure: the backoff pass (dwell_spark.backoff) reads
the pending entries, decides its batch with these functions and writes the outcome."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from dwell.core import invalid as invalid_core
from dwell.core import subscriptions as subs
from dwell.core.backoff import (
    ExponentialRedeliveryBackoff,
    ack_timeout_redelivery_at,
    nack_redelivery_at,
)
from dwell.core.buckets import bucket_start
from dwell.core.subscriptions import SubscriptionSettings
from dwell.index.redelivery import PendingEntry

SCHEDULE, DEAD, CANCEL, ACK = "schedule", "dead", "cancel", "ack"
# What every decision's numbers must fit in (Redis's and Kafka's signed 64-bit integers).
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_MAX_PARTITION_DIGITS, _MAX_OFFSET_DIGITS = 9, 18

Event = dict[str, Any]
# A decision: (messageId, action, at, bucket, stored count). ``at`` is the due time (the
# event's ts for an ack); ``bucket`` None for an ack.
Decision = tuple[str, str, int, "int | None", int]


@functools.lru_cache(maxsize=1024)
def _parse_backoff(items: tuple[tuple[str, Any], ...]) -> ExponentialRedeliveryBackoff:
    # A subscription's events all carry the same backoff: built once per worker.
    return ExponentialRedeliveryBackoff.from_json(dict(items))


def _backoff(raw: Any) -> ExponentialRedeliveryBackoff | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = json.loads(raw)
    if not isinstance(raw, Mapping):
        raise ValueError("backoff must be a JSON object")
    return _parse_backoff(tuple(sorted(raw.items())))


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def fill_settings(events: list[Event], settings: SubscriptionSettings | None) -> list[Event]:
    """``events`` with the registered ``settings`` on every one that carries none
    (``ackTimeoutMs`` missing); events that carry settings keep theirs."""
    if settings is None:
        return events
    values = settings.to_json()
    return [ev | values if ev.get(subs.ACK_TIMEOUT_MS) is None else ev for ev in events]


def decide(ev: Event, pending: dict[str, PendingEntry], out: list[Decision],
           tick_ms: int) -> None:
    """One event's decisions, appended to ``out``; ``pending`` (messageId -> entry) is
    updated in place."""
    mid = ev["messageId"]
    # Plain Kafka consumers may leave out the count of a first delivery.
    count = _opt_int(ev.get("redeliveryCount")) or 0
    kind = ev["event"]
    ts = int(ev["ts"])
    if kind == "delivered":
        ack_timeout = _opt_int(ev.get(subs.ACK_TIMEOUT_MS)) or 0
        # Without an ack timeout a delivery schedules nothing and leaves what is pending
        # alone (a repeat of a nacked copy must not cancel its nack); with one, the new
        # delivery restarts the clock.
        if ack_timeout > 0:
            _cancel(mid, pending, out)
            at = ack_timeout_redelivery_at(ts, ack_timeout,
                                           _backoff(ev.get(subs.ACK_TIMEOUT_BACKOFF)), count)
            _schedule(mid, at, count, _opt_int(ev.get(subs.MAX_REDELIVER_COUNT)), pending,
                      out, tick_ms)
    elif kind == "ack":
        _cancel(mid, pending, out)
        out.append((mid, ACK, ts, None, count))
    elif kind == "nack":
        _cancel(mid, pending, out)
        max_r = _opt_int(ev.get(subs.MAX_REDELIVER_COUNT))
        if max_r is not None and count >= max_r:
            # Past the limit: to the dead-letter topic at once (the drain's next round).
            _schedule(mid, ts, count, max_r, pending, out, tick_ms)
        else:
            _schedule(mid, nack_redelivery_at(ts, _backoff(ev.get(subs.NACK_BACKOFF)), count),
                      count, max_r, pending, out, tick_ms)


def _cancel(mid: str, pending: dict[str, PendingEntry], out: list[Decision]) -> None:
    """Whatever is pending for ``mid`` is superseded (a newer delivery, a nack, an ack)."""
    cur = pending.pop(mid, None)
    if cur is not None:
        out.append((mid, CANCEL, cur[0], cur[1], cur[2]))


def _schedule(mid: str, at: int, count: int, max_r: int | None,
              pending: dict[str, PendingEntry], out: list[Decision], tick_ms: int) -> None:
    """A redelivery of ``mid`` at ``at``, or its dead letter past ``max_r``."""
    bucket = bucket_start(at, tick_ms)
    if max_r is not None and count >= max_r:
        out.append((mid, DEAD, at, bucket, count))
        pending[mid] = (at, bucket, -count - 1)
        return
    out.append((mid, SCHEDULE, at, bucket, count + 1))
    pending[mid] = (at, bucket, count + 1)


def decide_or_fail(ev: Event, pending: dict[str, PendingEntry], out: list[Decision],
                   tick_ms: int) -> str | None:
    """:func:`decide`, or, when it fails on the event (or a decision would not fit a
    64-bit integer), nothing decided and why: an event that passed the checks yet fails
    would otherwise fail its batch on every restart, and with it every topic's
    redeliveries."""
    n = len(out)
    mid = ev["messageId"]
    before = pending.get(mid)
    try:
        # The index keeps offsets as 64-bit integers (and partitions as 32-bit ones).
        _, part, off = mid.rsplit(":", 2)
        if len(part) > _MAX_PARTITION_DIGITS or len(off) > _MAX_OFFSET_DIGITS:
            raise OverflowError(f"messageId {mid[:100]}: partition or offset too large")
        decide(ev, pending, out, tick_ms)
        for row in out[n:]:
            for v in row[2:]:
                if v is not None and not _LONG_MIN <= v <= _LONG_MAX:
                    raise OverflowError(f"decision {row[1]} for {mid}: {v} does not fit a "
                                        "signed 64-bit integer")
    except Exception as exc:
        del out[n:]
        if before is None:
            pending.pop(mid, None)
        else:
            pending[mid] = before
        return f"{type(exc).__name__}: {exc}"[:invalid_core.MAX_REASON_CHARS]
    return None
