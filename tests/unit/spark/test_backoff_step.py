"""The backoff state function without a JVM: Spark's GroupState is a plain Python object,
so step() runs here on hand-made event frames. Checks that each event schedules its
redelivery in the index at once, at the absolute PIP-130 / PIP-106 time, that acks, nacks
and newer deliveries cancel what is pending, the dead-letter decisions (a nack at once,
an unacked delivery at its timeout), the registry fallback for events that carry no
settings (plain Kafka consumers), and that one shard's state keeps each of its messages
apart and drops an entry once no ack can matter to it."""

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
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    SCHEDULE,
    SET_ASIDE,
    fill_settings,
    group_events,
    pending_of,
    step,
)
from dwell_spark.state import STATE_SCHEMA, StateEntry, decode_pending, encode_pending

TOPIC, SUB = "persistent://t/ns/x", "sub"
KEY = (TOPIC, SUB, 3)  # shard 3
MID = "dwell.delayed:0:7"
BACKOFF = ExponentialRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=4000, multiplier=2)
RAW = json.dumps(BACKOFF.to_json())
TICK = 100


def group_state(pending: dict[str, StateEntry] | None = None,
                timed_out: bool = False) -> GroupState:
    """A shard's GroupState holding ``pending`` (messageId -> entry)."""
    now = int(time.time() * 1000)
    value = (encode_pending(pending),) if pending else None
    return GroupState(value, now, -1, GroupStateTimeout.ProcessingTimeTimeout, timed_out,
                      False, value is not None, False, False, -1, b"", STATE_SCHEMA)


def events(*rows: dict[str, Any]) -> pd.DataFrame:
    cols = [f.name for f in EVENT_SCHEMA.fields]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)


def run_rows(state: GroupState, frame: pd.DataFrame | None = None, lookup=None,
             grace_ms: int = DEFAULT_STATE_GRACE_MS) -> list[tuple]:
    """The decisions as (messageId, action, at, bucket, count)."""
    batches = iter([] if frame is None else [frame])
    out = pd.concat(list(step(KEY, batches, state, lookup, TICK, grace_ms)))
    return [tuple(None if pd.isna(v) else v for v in r)[2:7]
            for r in out.itertuples(index=False)]


def run(state: GroupState, frame: pd.DataFrame | None = None, lookup=None) -> list[tuple]:
    """The decisions of events about MID, as (action, at, bucket, count)."""
    rows = run_rows(state, frame, lookup)
    assert {r[0] for r in rows} <= {MID}
    return [r[1:] for r in rows]


def sdk_event(event: str, ts: int, count: int = 0, mid: str = MID, **kw: Any) -> dict[str, Any]:
    return {"event": event, "topic": TOPIC, "subscription": SUB, "messageId": mid,
            "redeliveryCount": count, "ts": ts, "ackTimeoutMs": 0, **kw}


def recent() -> int:
    """A timestamp whose entries are still within the state's grace period."""
    return int(time.time() * 1000)


def test_ack_timeout_is_scheduled_at_once_on_pip130_schedule() -> None:
    """ackTimeout 2 s, min 1 s, max 4 s, ×2: the delivered event itself puts the
    redelivery in the index, 3, 4, 6, 6 s after the delivery before each."""
    gaps = []
    for count in range(4):
        s = group_state()
        delivered = recent() + count * 10_033
        [(action, at, bucket, n)] = run(s, events(sdk_event(
            "delivered", delivered, count, ackTimeoutMs=2000, ackTimeoutRedeliveryBackoff=RAW)))
        assert (action, n, bucket) == (SCHEDULE, count + 1, at - at % TICK)
        assert pending_of(s) == {MID: (at, bucket, count + 1)}
        gaps.append(at - delivered)
    assert gaps == [3000, 4000, 6000, 6000]


def test_state_timer_only_cleans_up_a_scheduled_redelivery() -> None:
    now = recent()
    s = group_state()
    [(_, at, _, _)] = run(s, events(sdk_event("delivered", now, ackTimeoutMs=2000)))
    # Spark's timer is set well past the due time: the index does the redelivery; the
    # state only waits for late acks (timeout = batch time + duration).
    assert s._timeout_timestamp >= at + DEFAULT_STATE_GRACE_MS - 1000  # ms of test runtime
    # When it fires, the entries past their grace go; the others stay, and the timer is
    # set again for the earliest of them.
    gone = now - DEFAULT_STATE_GRACE_MS - 10_000
    fired = group_state({"dwell.delayed:0:1": (gone, gone - gone % TICK, 1),
                         MID: (at, at - at % TICK, 1)}, timed_out=True)
    assert run_rows(fired) == []
    assert pending_of(fired) == {MID: (at, at - at % TICK, 1)}
    assert fired._timeout_timestamp >= at + DEFAULT_STATE_GRACE_MS - 1000
    expired = group_state({"dwell.delayed:0:1": (gone, gone - gone % TICK, 1)}, timed_out=True)
    assert run_rows(expired) == [] and not expired.exists


def test_ack_cancels_the_pending_redelivery() -> None:
    t = recent()
    s = group_state()
    rows = run(s, events(sdk_event("delivered", t, ackTimeoutMs=2000), sdk_event("ack", t + 10)))
    due = t + 2000
    b = due - due % TICK
    assert rows == [(SCHEDULE, due, b, 1), (CANCEL, due, b, 1), (ACK, t + 10, None, 0)]
    assert not s.exists
    # In a later batch: the ack cancels what the state remembers.
    s = group_state({MID: (due, b, 1)})
    assert run(s, events(sdk_event("ack", t + 20))) == [(CANCEL, due, b, 1),
                                                        (ACK, t + 20, None, 0)]
    assert not s.exists


def test_newer_delivery_and_nack_supersede_the_pending_entry() -> None:
    t = recent() // 1000 * 1000
    s = group_state({MID: (t + 3010, t + 3000, 1)})
    rows = run(s, events(sdk_event("delivered", t + 3020, 1, ackTimeoutMs=2000,
                                   ackTimeoutRedeliveryBackoff=RAW),
                         sdk_event("nack", t + 3500, 1, negativeAckRedeliveryBackoff=RAW)))
    assert rows == [(CANCEL, t + 3010, t + 3000, 1), (SCHEDULE, t + 7020, t + 7000, 2),
                    (CANCEL, t + 7020, t + 7000, 2), (SCHEDULE, t + 5500, t + 5500, 2)]
    assert pending_of(s) == {MID: (t + 5500, t + 5500, 2)}


def test_nack_backoff_then_dead_letter_at_once() -> None:
    out = [run(group_state(), events(sdk_event("nack", 5000, c, maxRedeliverCount=2,
                                               negativeAckRedeliveryBackoff=RAW)))[0]
           for c in range(3)]
    assert [(a, at - 5000, n) for a, at, _, n in out] == [
        (SCHEDULE, 1000, 1), (SCHEDULE, 2000, 2), (DLQ, 4000, 2)]


def test_unacked_past_max_goes_into_the_index_as_a_dead_letter_unless_acked() -> None:
    t = recent() // 1000 * 1000
    s = group_state()
    assert run(s, events(sdk_event("delivered", t + 100, 2, ackTimeoutMs=2000,
                                   maxRedeliverCount=2))) == [(DEAD, t + 2100, t + 2100, 2)]
    # The state keeps the count as the index stores it, -(count + 1) for a dead letter, so
    # that a lost index can be rebuilt from the state alone (dwell_spark.recovery).
    assert pending_of(s) == {MID: (t + 2100, t + 2100, -3)}
    acked = group_state(pending_of(s))
    assert run(acked, events(sdk_event("ack", t + 200, 2))) == [
        (CANCEL, t + 2100, t + 2100, -3), (ACK, t + 200, None, 2)]
    assert not acked.exists


def test_events_without_settings_take_the_registry() -> None:
    registered = SubscriptionSettings(2000, BACKOFF, None, 3)
    asked = []

    def lookup(topic: str, sub: str) -> SubscriptionSettings:
        asked.append((topic, sub))
        return registered

    # A plain Kafka consumer's event: no settings, no redelivery count.
    t = recent() // 1000 * 1000
    bare = {"event": "delivered", "topic": TOPIC, "subscription": SUB, "messageId": MID,
            "ts": t + 7000}
    s = group_state()
    assert run(s, events(bare), lookup) == [(SCHEDULE, t + 10_000, t + 10_000, 1)]
    assert asked == [(TOPIC, SUB)]
    assert pending_of(s) == {MID: (t + 10_000, t + 10_000, 1)}


def test_sdk_events_keep_their_own_settings() -> None:
    frame = events(sdk_event("delivered", 1, ackTimeoutMs=0),
                   {"event": "nack", "topic": TOPIC, "subscription": SUB,
                    "messageId": MID, "ts": 2})
    nack = ExponentialRedeliveryBackoff(min_delay_ms=100)
    filled = fill_settings(group_events(iter([frame])), SubscriptionSettings(5000, None, nack, 1))
    assert [e["ackTimeoutMs"] for e in filled] == [0, 5000]
    assert json.loads(filled[1]["negativeAckRedeliveryBackoff"]) == nack.to_json()
    # Unregistered subscription: nothing to fill, Pulsar's defaults apply (no ack
    # timeout; a nack comes back after the fixed 60 s delay).
    t = recent() // 1000 * 1000
    s = group_state()
    rows = run(s, events({"event": "nack", "topic": TOPIC, "subscription": SUB,
                          "messageId": MID, "ts": t + 100}), lambda t, sub: None)
    assert rows == [(SCHEDULE, t + 60_100, t + 60_100, 1)]


def test_delivery_without_ack_timeout_keeps_a_pending_nack() -> None:
    """A repeat of a nacked copy (e.g. after a consumer-group rebalance) must not cancel
    the nack's redelivery."""
    t = recent() // 1000 * 1000
    s = group_state({MID: (t + 5500, t + 5500, 1)})
    assert run(s, events(sdk_event("delivered", t + 3600, 0, ackTimeoutMs=0))) == []
    assert pending_of(s) == {MID: (t + 5500, t + 5500, 1)}


def test_a_shard_keeps_its_messages_apart() -> None:
    """One call decides for many messages: each message's events in their order, an ack
    of one cancels only its own entry, and the state holds the rest."""
    t = recent() // 1000 * 1000
    a, b, c = (f"dwell.delayed:1:{o}" for o in (1, 2, 3))
    s = group_state({c: (t + 9000, t + 9000, 1)})
    rows = run_rows(s, events(
        sdk_event("delivered", t + 10, mid=a, ackTimeoutMs=2000),
        sdk_event("delivered", t + 11, mid=b, ackTimeoutMs=5000),
        sdk_event("ack", t + 30, mid=a),
        sdk_event("nack", t + 20, 1, mid=c, negativeAckRedeliveryBackoff=RAW)))
    # Ordered by the events' own timestamps.
    assert rows == [
        (a, SCHEDULE, t + 2010, t + 2000, 1),
        (b, SCHEDULE, t + 5011, t + 5000, 1),
        (c, CANCEL, t + 9000, t + 9000, 1),
        (c, SCHEDULE, t + 2020, t + 2000, 2),
        (a, CANCEL, t + 2010, t + 2000, 1),
        (a, ACK, t + 30, None, 0),
    ]
    assert pending_of(s) == {b: (t + 5011, t + 5000, 1), c: (t + 2020, t + 2000, 2)}
    # The next batch starts from that state.
    assert run_rows(s, events(sdk_event("ack", t + 40, mid=b))) == [
        (b, CANCEL, t + 5011, t + 5000, 1), (b, ACK, t + 40, None, 0)]
    assert pending_of(s) == {c: (t + 2020, t + 2000, 2)}


def test_a_shard_of_many_messages_in_one_call() -> None:
    """10,000 messages of one shard in one call: every one scheduled, then every one acked
    in the next, leaving no state."""
    t = recent()
    mids = [f"dwell.delayed:2:{o}" for o in range(10_000)]
    s = group_state()
    rows = run_rows(s, events(*(sdk_event("delivered", t, mid=m, ackTimeoutMs=1000)
                                for m in mids)))
    assert [r[0] for r in rows] == mids and {r[1] for r in rows} == {SCHEDULE}
    assert len(pending_of(s)) == 10_000
    rows = run_rows(s, events(*(sdk_event("ack", t + 1, mid=m) for m in mids)))
    assert len(rows) == 20_000 and not s.exists


def test_the_state_text_keeps_any_message_id() -> None:
    """The state holds whatever messageId the events carried (dwell_spark.invalid checks
    its form, not its characters): quotes, separators and newlines round-trip."""
    pending = {'a"b:0:1': (1, 0, 1), "x\ny,z:1:2": (2, 0, -3), "ü\\:0:0": (3, 0, 2)}
    assert decode_pending(encode_pending(pending)) == pending
    s = group_state(pending)
    assert pending_of(s) == pending


def test_an_event_the_state_function_fails_on_is_set_aside_and_the_shard_goes_on() -> None:
    """Past the event check (a check an older version lacked, a value it missed): a nack
    whose due time does not fit a signed 64-bit integer failed the whole micro-batch,
    and the query on every restart. It becomes a SET_ASIDE row; the shard's other
    events are decided as ever."""
    ts = recent()
    huge = sdk_event("nack", 2**63 - 1, mid="dwell.delayed:0:1",
                     negativeAckRedeliveryBackoff=RAW) | {"partition": 2, "offset": 41}
    broken = sdk_event("nack", ts, mid="dwell.delayed:0:2",
                       negativeAckRedeliveryBackoff="{not json") | {"partition": 2,
                                                                    "offset": 42}
    good = sdk_event("nack", ts, mid="dwell.delayed:0:3", negativeAckRedeliveryBackoff=RAW)
    state = group_state()
    frame = pd.DataFrame([huge, broken, good], columns=[*EVENT_COLUMNS])
    out = pd.concat(list(step(KEY, iter([frame]), state, None, TICK)))
    rows = {r.messageId: r for r in out.itertuples(index=False)}
    assert rows["dwell.delayed:0:3"].action == SCHEDULE
    assert rows["dwell.delayed:0:3"].at == ts + 1000
    for mid, offset, words in [("dwell.delayed:0:1", 41, "does not fit a signed 64-bit"),
                               ("dwell.delayed:0:2", 42, "JSONDecodeError")]:
        row = rows[mid]
        assert (row.action, row.bucket, row.at) == (SET_ASIDE, 2, offset)
        assert words in row.reason, row.reason
        assert json.loads(row.event)["messageId"] == mid
    # Nothing of the set-aside events stays pending.
    assert set(pending_of(state)) == {"dwell.delayed:0:3"}
