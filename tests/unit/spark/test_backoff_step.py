"""The backoff state function without a JVM: Spark's GroupState is a plain Python object,
so step() runs here on hand-made event frames. Checks that each event schedules its
redelivery in the index at once, at the absolute PIP-130 / PIP-106 time, that acks, nacks
and newer deliveries cancel what is pending, the dead-letter decisions (a nack at once,
an unacked delivery at its timeout) and the registry fallback for events that carry no
settings (plain Kafka consumers)."""

from __future__ import annotations

import json
import time
from typing import Any

import pandas as pd
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from dwell.core.backoff import ExponentialRedeliveryBackoff
from dwell.core.subscriptions import SubscriptionSettings
from dwell_spark.backoff import (
    ACK,
    CANCEL,
    DEAD,
    DEFAULT_STATE_GRACE_MS,
    DLQ,
    EVENT_SCHEMA,
    SCHEDULE,
    STATE_SCHEMA,
    fill_settings,
    group_events,
    step,
)

KEY = ("persistent://t/ns/x", "sub", "dwell.delayed:0:7")
BACKOFF = ExponentialRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=4000, multiplier=2)
RAW = json.dumps(BACKOFF.to_json())
TICK = 100


def group_state(value: tuple | None = None, timed_out: bool = False) -> GroupState:
    now = int(time.time() * 1000)
    return GroupState(value, now, -1, GroupStateTimeout.ProcessingTimeTimeout, timed_out,
                      False, value is not None, False, False, -1, b"", STATE_SCHEMA)


def events(*rows: dict[str, Any]) -> pd.DataFrame:
    cols = [f.name for f in EVENT_SCHEMA.fields]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)


def run(state: GroupState, frame: pd.DataFrame | None = None, lookup=None) -> list[tuple]:
    batches = iter([] if frame is None else [frame])
    out = pd.concat(list(step(KEY, batches, state, lookup, TICK)))
    return [tuple(None if pd.isna(v) else v for v in r)[3:]
            for r in out.itertuples(index=False)]


def sdk_event(event: str, ts: int, count: int = 0, **kw: Any) -> dict[str, Any]:
    return {"event": event, "topic": KEY[0], "subscription": KEY[1], "messageId": KEY[2],
            "redeliveryCount": count, "ts": ts, "ackTimeoutMs": 0, **kw}


def test_ack_timeout_is_scheduled_at_once_on_pip130_schedule() -> None:
    """ackTimeout 2 s, min 1 s, max 4 s, ×2: the delivered event itself puts the
    redelivery in the index, 3, 4, 6, 6 s after the delivery before each."""
    gaps = []
    for count in range(4):
        s = group_state()
        delivered = 1_000_000 + count * 10_033
        [(action, at, bucket, n)] = run(s, events(sdk_event(
            "delivered", delivered, count, ackTimeoutMs=2000, ackTimeoutRedeliveryBackoff=RAW)))
        assert (action, n, bucket) == (SCHEDULE, count + 1, at - at % TICK)
        assert s.exists and s.get == (at, bucket, count + 1)
        gaps.append(at - delivered)
    assert gaps == [3000, 4000, 6000, 6000]


def test_state_timer_only_cleans_up_a_scheduled_redelivery() -> None:
    now = int(time.time() * 1000)
    s = group_state()
    [(_, at, _, _)] = run(s, events(sdk_event("delivered", now, ackTimeoutMs=2000)))
    # Spark's timer is set well past the due time: the index does the redelivery; the
    # state only waits for late acks (timeout = batch time + duration).
    assert s._timeout_timestamp >= at + DEFAULT_STATE_GRACE_MS - 1000  # ms of test runtime
    fired = group_state(s.get, timed_out=True)
    assert run(fired) == [] and not fired.exists


def test_ack_cancels_the_pending_redelivery() -> None:
    s = group_state()
    rows = run(s, events(sdk_event("delivered", 10, ackTimeoutMs=2000), sdk_event("ack", 20)))
    assert rows == [(SCHEDULE, 2010, 2000, 1), (CANCEL, 2010, 2000, 1), (ACK, 20, None, 0)]
    assert not s.exists
    # In a later batch: the ack cancels what the state remembers.
    s = group_state((2010, 2000, 1))
    assert run(s, events(sdk_event("ack", 30))) == [(CANCEL, 2010, 2000, 1), (ACK, 30, None, 0)]
    assert not s.exists


def test_newer_delivery_and_nack_supersede_the_pending_entry() -> None:
    s = group_state((3010, 3000, 1))
    rows = run(s, events(sdk_event("delivered", 3020, 1, ackTimeoutMs=2000,
                                   ackTimeoutRedeliveryBackoff=RAW),
                         sdk_event("nack", 3500, 1, negativeAckRedeliveryBackoff=RAW)))
    assert rows == [(CANCEL, 3010, 3000, 1), (SCHEDULE, 7020, 7000, 2),
                    (CANCEL, 7020, 7000, 2), (SCHEDULE, 5500, 5500, 2)]
    assert s.get == (5500, 5500, 2)


def test_nack_backoff_then_dead_letter_at_once() -> None:
    out = [run(group_state(), events(sdk_event("nack", 5000, c, maxRedeliverCount=2,
                                               negativeAckRedeliveryBackoff=RAW)))[0]
           for c in range(3)]
    assert [(a, at - 5000, n) for a, at, _, n in out] == [
        (SCHEDULE, 1000, 1), (SCHEDULE, 2000, 2), (DLQ, 4000, 2)]


def test_unacked_past_max_goes_into_the_index_as_a_dead_letter_unless_acked() -> None:
    s = group_state()
    assert run(s, events(sdk_event("delivered", 100, 2, ackTimeoutMs=2000,
                                   maxRedeliverCount=2))) == [(DEAD, 2100, 2100, 2)]
    # The state keeps the count as the index stores it, -(count + 1) for a dead letter, so
    # that a lost index can be rebuilt from the state alone (dwell_spark.recovery).
    assert s.get == (2100, 2100, -3)
    # The timer only drops the state; the drain sends the dead letter.
    expired = group_state(s.get, timed_out=True)
    assert run(expired) == [] and not expired.exists
    acked = group_state(s.get)
    assert run(acked, events(sdk_event("ack", 200, 2))) == [(CANCEL, 2100, 2100, -3),
                                                          (ACK, 200, None, 2)]
    assert not acked.exists


def test_events_without_settings_take_the_registry() -> None:
    registered = SubscriptionSettings(2000, BACKOFF, None, 3)
    asked = []

    def lookup(topic: str, sub: str) -> SubscriptionSettings:
        asked.append((topic, sub))
        return registered

    # A plain Kafka consumer's event: no settings, no redelivery count.
    bare = {"event": "delivered", "topic": KEY[0], "subscription": KEY[1],
            "messageId": KEY[2], "ts": 7000}
    s = group_state()
    assert run(s, events(bare), lookup) == [(SCHEDULE, 10_000, 10_000, 1)]
    assert asked == [KEY[:2]]
    assert s.get == (10_000, 10_000, 1)


def test_sdk_events_keep_their_own_settings() -> None:
    frame = events(sdk_event("delivered", 1, ackTimeoutMs=0),
                   {"event": "nack", "topic": KEY[0], "subscription": KEY[1],
                    "messageId": KEY[2], "ts": 2})
    nack = ExponentialRedeliveryBackoff(min_delay_ms=100)
    filled = fill_settings(group_events(iter([frame])), SubscriptionSettings(5000, None, nack, 1))
    assert [e["ackTimeoutMs"] for e in filled] == [0, 5000]
    assert json.loads(filled[1]["negativeAckRedeliveryBackoff"]) == nack.to_json()
    # Unregistered subscription: nothing to fill, Pulsar's defaults apply (no ack
    # timeout; a nack comes back after the fixed 60 s delay).
    s = group_state()
    rows = run(s, events({"event": "nack", "topic": KEY[0], "subscription": KEY[1],
                          "messageId": KEY[2], "ts": 100}), lambda t, sub: None)
    assert rows == [(SCHEDULE, 60_100, 60_100, 1)]


def test_delivery_without_ack_timeout_keeps_a_pending_nack() -> None:
    """A repeat of a nacked copy (e.g. after a consumer-group rebalance) must not cancel
    the nack's redelivery."""
    s = group_state((5500, 5500, 1))
    assert run(s, events(sdk_event("delivered", 3600, 0, ackTimeoutMs=0))) == []
    assert s.get == (5500, 5500, 1)
