"""The backoff's decisions without a JVM or Redis: decide() on plain events, and a pass
over a partition's records (Pass.decide) with the pending entries it reads given as a
function. Checks that each event schedules its redelivery in the index at once, at the
absolute PIP-130 / PIP-106 time, that acks, nacks and newer deliveries cancel what is
pending, the dead-letter decisions (a nack due at once, an unacked delivery at its
timeout), the registry fallback for events that carry no settings (plain Kafka
consumers), the order of a batch's events, that an entry past its grace is gone, and
that a record the pass cannot use is set aside while the others go on."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from dwell.core import invalid
from dwell.core.backoff import ExponentialRedeliveryBackoff
from dwell.core.subscriptions import SubscriptionSettings
from dwell.index.redelivery import PendingEntry
from dwell_spark import decisions
from dwell_spark.backoff import DEFAULT_GRACE_MS, WARM_UP_TOPIC, Decided, Pass
from dwell_spark.decisions import (
    ACK,
    CANCEL,
    DEAD,
    SCHEDULE,
    Decision,
    decide,
    decide_or_fail,
    fill_settings,
)

TOPIC, SUB = "persistent://t/ns/x", "sub"
MID = "dwell.delayed:0:7"
BACKOFF = ExponentialRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=4000, multiplier=2)
OBJ = BACKOFF.to_json()  # as an event carries it
RAW = json.dumps(OBJ)  # as text, which decide() takes too
TICK = 100
NOW = 1_700_000_000_000  # the pass's clock; events near it are within the grace period
Pending = dict[str, PendingEntry]
Lookup = Callable[[str, str], SubscriptionSettings | None]


def sdk_event(event: str, ts: int, count: int = 0, mid: str = MID, sub: str = SUB,
              **kw: Any) -> dict[str, Any]:
    return {"event": event, "topic": TOPIC, "subscription": sub, "messageId": mid,
            "redeliveryCount": count, "ts": ts, "ackTimeoutMs": 0, **kw}


def bare_event(event: str, ts: int, mid: str = MID, **kw: Any) -> dict[str, Any]:
    """A plain Kafka consumer's event: no settings, no redelivery count."""
    return {"event": event, "topic": TOPIC, "subscription": SUB, "messageId": mid,
            "ts": ts, **kw}


def run(pending: Pending, *events: dict[str, Any]) -> list[tuple[Any, ...]]:
    """decide() on ``events`` of MID in their order: (action, at, bucket, count)."""
    out: list[Decision] = []
    for ev in events:
        decide(ev, pending, out, TICK)
    assert {d[0] for d in out} <= {MID}
    return [d[1:] for d in out]


def unregistered(topic: str, sub: str) -> SubscriptionSettings | None:
    return None


def work(lookup: Lookup = unregistered) -> Pass:
    """The pass with authentication off and any subscription taken as registered."""
    return Pass(redis_url="redis://unused", bootstrap="unused", compression_type="none",
                tick_ms=TICK, grace_ms=DEFAULT_GRACE_MS, max_bytes=65536,
                write_timeout_s=1.0, auth=None, subscriptions=None,  # type: ignore[arg-type]
                lookup=lookup)  # type: ignore[arg-type]


def cols(*records: dict[str, Any] | bytes | None, partition: int = 2,
         first: int = 40) -> dict[str, list[Any]]:
    """One partition's records (an event, or a raw value) as the pass reads them."""
    values = [json.dumps(r).encode() if isinstance(r, dict) else r for r in records]
    n = len(values)
    return {"partition": [partition] * n, "offset": list(range(first, first + n)),
            "ts": [NOW] * n, "tsType": [1] * n, "key": [f"{TOPIC}/{SUB}".encode()] * n,
            "value": values, "auths": [[] for _ in range(n)]}


class Store:
    """Pending entries per subscription, read as the pass reads them, and each read."""

    def __init__(self, held: dict[tuple[str, str], Pending] | None = None) -> None:
        self.held = held or {}
        self.reads: list[tuple[str, str, list[str]]] = []

    def __call__(self, topic: str, sub: str, mids: list[str]) -> Pending:
        self.reads.append((topic, sub, mids))
        have = self.held.get((topic, sub), {})
        return {m: have[m] for m in mids if m in have}

    def apply(self, decided: Decided) -> None:
        for key, touched in decided.pending.items():
            have = self.held.setdefault(key, {})
            for mid, entry in touched.items():
                if entry is None:
                    have.pop(mid, None)
                else:
                    have[mid] = entry


def decided_by(store: Store, *records: dict[str, Any] | bytes | None,
               lookup: Lookup = unregistered) -> Decided:
    return work(lookup).decide(cols(*records), store, NOW)


def test_ack_timeout_is_scheduled_at_once_on_pip130_schedule() -> None:
    """ackTimeout 2 s, min 1 s, max 4 s, ×2: the delivered event itself puts the
    redelivery in the index, 3, 4, 6, 6 s after the delivery before each; its backoff as
    the JSON object an event carries or as JSON text alike."""
    gaps = []
    for count in range(4):
        for raw in (OBJ, RAW):
            pending: Pending = {}
            delivered = NOW + count * 10_033
            [(action, at, bucket, n)] = run(pending, sdk_event(
                "delivered", delivered, count, ackTimeoutMs=2000,
                ackTimeoutRedeliveryBackoff=raw))
            assert (action, n, bucket) == (SCHEDULE, count + 1, at - at % TICK)
            assert pending == {MID: (at, bucket, count + 1)}
        gaps.append(at - delivered)
    assert gaps == [3000, 4000, 6000, 6000]


def test_ack_cancels_the_pending_redelivery() -> None:
    t = NOW
    pending: Pending = {}
    rows = run(pending, sdk_event("delivered", t, ackTimeoutMs=2000), sdk_event("ack", t + 10))
    due = t + 2000
    b = due - due % TICK
    assert rows == [(SCHEDULE, due, b, 1), (CANCEL, due, b, 1), (ACK, t + 10, None, 0)]
    assert pending == {}
    # In a later batch: the ack cancels the entry read back.
    pending = {MID: (due, b, 1)}
    assert run(pending, sdk_event("ack", t + 20)) == [(CANCEL, due, b, 1),
                                                      (ACK, t + 20, None, 0)]
    assert pending == {}


def test_newer_delivery_and_nack_supersede_the_pending_entry() -> None:
    t = NOW
    pending: Pending = {MID: (t + 3010, t + 3000, 1)}
    rows = run(pending, sdk_event("delivered", t + 3020, 1, ackTimeoutMs=2000,
                                  ackTimeoutRedeliveryBackoff=RAW),
               sdk_event("nack", t + 3500, 1, negativeAckRedeliveryBackoff=RAW))
    assert rows == [(CANCEL, t + 3010, t + 3000, 1), (SCHEDULE, t + 7020, t + 7000, 2),
                    (CANCEL, t + 7020, t + 7000, 2), (SCHEDULE, t + 5500, t + 5500, 2)]
    assert pending == {MID: (t + 5500, t + 5500, 2)}


def test_nack_backoff_then_dead_letter_due_at_the_nack() -> None:
    """Past maxRedeliverCount a nack is a dead letter due at once (the drain sends it to
    the DLQ on its next round): in the index at the nack's own ts, its count stored as
    -(count + 1)."""
    got = []
    for c in range(3):
        pending: Pending = {}
        [row] = run(pending, sdk_event("nack", 5030, c, maxRedeliverCount=2,
                                       negativeAckRedeliveryBackoff=RAW))
        got.append((row, pending))
    assert got == [((SCHEDULE, 6030, 6000, 1), {MID: (6030, 6000, 1)}),
                   ((SCHEDULE, 7030, 7000, 2), {MID: (7030, 7000, 2)}),
                   ((DEAD, 5030, 5000, 2), {MID: (5030, 5000, -3)})]


def test_unacked_past_max_goes_into_the_index_as_a_dead_letter_unless_acked() -> None:
    t = NOW
    pending: Pending = {}
    assert run(pending, sdk_event("delivered", t + 100, 2, ackTimeoutMs=2000,
                                  maxRedeliverCount=2)) == [(DEAD, t + 2100, t + 2100, 2)]
    # Kept as the index stores the count, -(count + 1) for a dead letter, so that a
    # rebuild puts back the entry and its count from the pending entry alone
    # (dwell_spark.recovery).
    assert pending == {MID: (t + 2100, t + 2100, -3)}
    assert run(pending, sdk_event("ack", t + 200, 2)) == [
        (CANCEL, t + 2100, t + 2100, -3), (ACK, t + 200, None, 2)]
    assert pending == {}


def test_events_without_settings_take_the_registry() -> None:
    registered = SubscriptionSettings(2000, BACKOFF, None, 3)
    asked = []

    def lookup(topic: str, sub: str) -> SubscriptionSettings:
        asked.append((topic, sub))
        return registered

    t = NOW
    dead = "dwell.delayed:0:8"
    store = Store()
    decided = decided_by(store, bare_event("delivered", t + 7000),
                         bare_event("delivered", t + 7001, dead, redeliveryCount=3),
                         lookup=lookup)
    # Once per subscription and batch, whatever its number of events.
    assert asked == [(TOPIC, SUB)]
    assert decided.decisions == {(TOPIC, SUB): [
        (MID, SCHEDULE, t + 10_000, t + 10_000, 1),
        (dead, DEAD, t + 13_001, t + 13_000, 3)]}  # maxRedeliverCount 3, from the registry
    assert decided.pending == {(TOPIC, SUB): {MID: (t + 10_000, t + 10_000, 1),
                                              dead: (t + 13_001, t + 13_000, -4)}}
    assert decided.events == 2 and decided.aside == []


def test_sdk_events_keep_their_own_settings() -> None:
    events = [sdk_event("delivered", 1, ackTimeoutMs=0), bare_event("nack", 2)]
    nack = ExponentialRedeliveryBackoff(min_delay_ms=100)
    filled = fill_settings(events, SubscriptionSettings(5000, None, nack, 1))
    assert [e["ackTimeoutMs"] for e in filled] == [0, 5000]
    assert filled[1]["negativeAckRedeliveryBackoff"] == nack.to_json()
    assert filled[1]["maxRedeliverCount"] == 1
    assert "ackTimeoutMs" not in events[1]  # the events read are left as they were
    assert fill_settings(events, None) == events

    def not_asked(topic: str, sub: str) -> SubscriptionSettings:
        raise AssertionError("the registry was read for events that carry settings")

    t = NOW
    decided = decided_by(Store(), sdk_event("nack", t + 100, negativeAckRedeliveryBackoff=OBJ),
                         lookup=not_asked)
    assert decided.decisions == {(TOPIC, SUB): [(MID, SCHEDULE, t + 1100, t + 1100, 1)]}
    # A registered subscription's SDK event beside a plain consumer's: only the latter
    # takes the registry's settings.
    other = "dwell.delayed:0:8"
    decided = decided_by(Store(), sdk_event("nack", t + 100, negativeAckRedeliveryBackoff=OBJ),
                         bare_event("nack", t + 100, other),
                         lookup=lambda topic, sub: SubscriptionSettings(0, None, nack, None))
    assert decided.decisions == {(TOPIC, SUB): [(MID, SCHEDULE, t + 1100, t + 1100, 1),
                                                (other, SCHEDULE, t + 200, t + 200, 1)]}
    # Unregistered subscription: nothing to fill, Pulsar's defaults apply (no ack
    # timeout; a nack comes back after the fixed 60 s delay).
    decided = decided_by(Store(), bare_event("nack", t + 100))
    assert decided.decisions == {(TOPIC, SUB): [(MID, SCHEDULE, t + 60_100, t + 60_100, 1)]}


def test_delivery_without_ack_timeout_keeps_a_pending_nack() -> None:
    """A repeat of a nacked copy (e.g. after a consumer-group rebalance) must not cancel
    the nack's redelivery."""
    t = NOW
    nacked = {MID: (t + 5500, t + 5500, 1)}
    pending = dict(nacked)
    assert run(pending, sdk_event("delivered", t + 3600, 0, ackTimeoutMs=0)) == []
    assert run(pending, bare_event("delivered", t + 3700)) == []
    assert pending == nacked
    # Through the pass, for a plain consumer of an unregistered subscription: the entry
    # is read, and left as it is.
    store = Store({(TOPIC, SUB): dict(nacked)})
    decided = decided_by(store, bare_event("delivered", t + 3700))
    assert store.reads == [(TOPIC, SUB, [MID])]
    assert decided.decisions == {} and decided.pending == {}


def test_a_subscriptions_messages_are_kept_apart() -> None:
    """One batch decides for many messages: each message's events in their order, an ack
    of one cancels only its own entry, and the pending entries hold the rest."""
    t = NOW
    a, b, c = (f"dwell.delayed:1:{o}" for o in (1, 2, 3))
    store = Store({(TOPIC, SUB): {c: (t + 9000, t + 9000, 1)}})
    decided = decided_by(
        store,
        sdk_event("delivered", t + 10, mid=a, ackTimeoutMs=2000),
        sdk_event("delivered", t + 11, mid=b, ackTimeoutMs=5000),
        sdk_event("ack", t + 30, mid=a),
        sdk_event("nack", t + 20, 1, mid=c, negativeAckRedeliveryBackoff=OBJ))
    # One read of the batch's messages, each once.
    assert store.reads == [(TOPIC, SUB, [a, b, c])]
    # Ordered by the events' own timestamps.
    assert decided.decisions == {(TOPIC, SUB): [
        (a, SCHEDULE, t + 2010, t + 2000, 1),
        (b, SCHEDULE, t + 5011, t + 5000, 1),
        (c, CANCEL, t + 9000, t + 9000, 1),
        (c, SCHEDULE, t + 2020, t + 2000, 2),
        (a, CANCEL, t + 2010, t + 2000, 1),
        (a, ACK, t + 30, None, 0),
    ]}
    # Only what changed: ``a`` had no entry before and has none after.
    assert decided.pending == {(TOPIC, SUB): {b: (t + 5011, t + 5000, 1),
                                              c: (t + 2020, t + 2000, 2)}}
    assert decided.lead_ms(NOW) == 2010
    store.apply(decided)
    # The next batch starts from those entries.
    decided = decided_by(store, sdk_event("ack", t + 40, mid=b))
    assert decided.decisions == {(TOPIC, SUB): [(b, CANCEL, t + 5011, t + 5000, 1),
                                                (b, ACK, t + 40, None, 0)]}
    assert decided.pending == {(TOPIC, SUB): {b: None}}
    store.apply(decided)
    assert store.held == {(TOPIC, SUB): {c: (t + 2020, t + 2000, 2)}}


def test_many_messages_of_one_subscription_in_one_batch() -> None:
    """10,000 messages of one subscription in one batch: every one scheduled, then every
    one acked in the next, leaving no entry."""
    t = NOW
    mids = [f"dwell.delayed:2:{o}" for o in range(10_000)]
    store = Store()
    decided = decided_by(store, *(sdk_event("delivered", t, mid=m, ackTimeoutMs=1000)
                                  for m in mids))
    rows = decided.decisions[(TOPIC, SUB)]
    assert [r[0] for r in rows] == mids and {r[1] for r in rows} == {SCHEDULE}
    assert len(decided.pending[(TOPIC, SUB)]) == 10_000
    store.apply(decided)
    decided = decided_by(store, *(sdk_event("ack", t + 1, mid=m) for m in mids))
    assert len(decided.decisions[(TOPIC, SUB)]) == 20_000
    store.apply(decided)
    assert store.held == {(TOPIC, SUB): {}}


def test_a_batch_takes_each_subscriptions_events_by_their_ts() -> None:
    """Within a batch a subscription's events go by ``ts``, ties in offset order; each
    subscription's apart from the others'."""
    t = NOW
    due = t + 1000
    deliver = sdk_event("delivered", t, ackTimeoutMs=1000)
    scheduled = (MID, SCHEDULE, due, due, 1)
    cancelled = [(MID, CANCEL, due, due, 1)]
    # The ack read first, yet sent after the delivery: it cancels it.
    late = decided_by(Store(), sdk_event("ack", t + 5), deliver)
    assert late.decisions == {(TOPIC, SUB): [scheduled, *cancelled, (MID, ACK, t + 5, None, 0)]}
    assert late.pending == {(TOPIC, SUB): {}}  # nothing left pending, nothing to change
    # Same ts: the offsets decide.
    tie = decided_by(Store(), deliver, sdk_event("ack", t))
    assert tie.decisions == {(TOPIC, SUB): [scheduled, *cancelled, (MID, ACK, t, None, 0)]}
    tie = decided_by(Store(), sdk_event("ack", t), deliver)
    assert tie.decisions == {(TOPIC, SUB): [(MID, ACK, t, None, 0), scheduled]}
    assert tie.pending == {(TOPIC, SUB): {MID: (due, due, 1)}}
    # Another subscription's earlier event does not move this one's.
    both = decided_by(Store(), sdk_event("ack", t + 5), deliver,
                      sdk_event("delivered", t - 50, sub="other", ackTimeoutMs=1000))
    assert both.decisions == {
        (TOPIC, SUB): [scheduled, *cancelled, (MID, ACK, t + 5, None, 0)],
        (TOPIC, "other"): [(MID, SCHEDULE, t + 950, t + 900, 1)]}


def test_a_pending_entry_past_its_grace_is_gone() -> None:
    """An entry read whose due time plus backoff_state_grace_ms has passed is one the
    drain claimed (or a late ack no longer matters to): nothing cancels it, and it is
    deleted, even when the batch decides nothing for its message."""
    t = NOW
    stale = (t - DEFAULT_GRACE_MS, t - DEFAULT_GRACE_MS - 100, 1)
    decided = decided_by(Store({(TOPIC, SUB): {MID: stale}}), sdk_event("ack", t + 1))
    assert decided.decisions == {(TOPIC, SUB): [(MID, ACK, t + 1, None, 0)]}
    assert decided.pending == {(TOPIC, SUB): {MID: None}}
    decided = decided_by(Store({(TOPIC, SUB): {MID: stale}}), bare_event("delivered", t))
    assert decided.decisions == {}
    assert decided.pending == {(TOPIC, SUB): {MID: None}}
    # A millisecond later it would still be live: the ack cancels it.
    live = (stale[0] + 1, stale[1], 1)
    decided = decided_by(Store({(TOPIC, SUB): {MID: live}}), sdk_event("ack", t + 1))
    assert decided.decisions == {(TOPIC, SUB): [(MID, CANCEL, *live),
                                                (MID, ACK, t + 1, None, 0)]}
    assert decided.pending == {(TOPIC, SUB): {MID: None}}


def test_an_event_decide_fails_on_leaves_nothing_decided() -> None:
    """Past the event check (a check an older version lacked, a value it missed): a nack
    whose due time does not fit a signed 64-bit integer, or whose backoff is no JSON
    object, decides nothing and changes no pending entry; why is the answer."""
    t = NOW
    entry = (t + 5000, t + 5000, 1)
    for ev, words in [
            (sdk_event("nack", 2**63 - 1, negativeAckRedeliveryBackoff=RAW),
             "does not fit a signed 64-bit integer"),
            (sdk_event("nack", t, negativeAckRedeliveryBackoff="{not json"),
             "JSONDecodeError"),
            (sdk_event("nack", t, negativeAckRedeliveryBackoff=[1000]),
             "backoff must be a JSON object")]:
        for before in ({}, {MID: entry}):
            pending: Pending = dict(before)
            out: list[Decision] = [("dwell.delayed:0:1", ACK, t, None, 0)]
            why = decide_or_fail(ev, pending, out, TICK)
            assert why is not None and words in why, why
            assert len(why) <= invalid.MAX_REASON_CHARS
            assert out == [("dwell.delayed:0:1", ACK, t, None, 0)]
            assert pending == before
    pending = {MID: entry}
    out = []
    assert decide_or_fail(sdk_event("nack", t, negativeAckRedeliveryBackoff=RAW),
                          pending, out, TICK) is None
    assert out == [(MID, CANCEL, *entry), (MID, SCHEDULE, t + 1000, t + 1000, 1)]


def test_an_event_decide_fails_on_is_set_aside_and_the_rest_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It becomes a FAILED record of dwell.invalid, with its position; the batch's other
    events, of its message and of others, are decided as ever."""
    t = NOW
    poison = "dwell.delayed:0:66"
    real = decisions.decide

    def failing(ev: dict[str, Any], pending: Pending, out: list[Decision],
                tick_ms: int) -> None:
        real(ev, pending, out, tick_ms)
        if ev["messageId"] == poison and ev["event"] == "nack":
            raise RuntimeError("no decision for this one")

    monkeypatch.setattr(decisions, "decide", failing)
    records = [sdk_event("delivered", t, mid=poison, ackTimeoutMs=1000),
               sdk_event("nack", t + 1, mid=poison, negativeAckRedeliveryBackoff=OBJ),
               sdk_event("nack", t + 2, negativeAckRedeliveryBackoff=OBJ)]
    c = cols(*records, partition=2, first=40)
    decided = work().decide(c, Store(), NOW)
    assert decided.aside == [(invalid.FAILED, "RuntimeError: no decision for this one", 2,
                              41, c["key"][1], c["value"][1])]
    assert decided.decisions == {(TOPIC, SUB): [
        (poison, SCHEDULE, t + 1000, t + 1000, 1), (MID, SCHEDULE, t + 1002, t + 1000, 1)]}
    # The failed nack cancelled nothing: the delivery's entry stands.
    assert decided.pending == {(TOPIC, SUB): {poison: (t + 1000, t + 1000, 1),
                                              MID: (t + 1002, t + 1000, 1)}}
    assert decided.events == 3


def test_malformed_records_are_set_aside_with_their_kind() -> None:
    t = NOW
    foreign = sdk_event("ack", t, mid="other.ns.y:0:1")
    good = sdk_event("nack", t, negativeAckRedeliveryBackoff=OBJ)
    c = cols(b"nope", None, b"x" * 70_000, foreign, good, sdk_event("ack", t, mid="d:0:1"),
             partition=5, first=10)
    c["auths"][5] = [b"\xff"]
    decided = work().decide(c, Store(), NOW)
    kinds = [(kind, part, off, key, value) for kind, _, part, off, key, value
             in decided.aside]
    assert kinds == [(kind, 5, 10 + i, c["key"][i], c["value"][i]) for i, kind in [
        (0, invalid.NOT_JSON), (1, invalid.NOT_JSON), (2, invalid.OVERSIZED),
        (3, invalid.FIELD), (5, invalid.HEADER)]]
    assert "is not a Kafka topic of" in decided.aside[3][1]
    assert all(reason for _, reason, *_ in decided.aside)
    assert decided.decisions == {(TOPIC, SUB): [(MID, SCHEDULE, t + 1000, t + 1000, 1)]}
    assert decided.events == 1


def test_the_warm_up_event_is_ignored() -> None:
    def not_asked(topic: str, sub: str) -> SubscriptionSettings:
        raise AssertionError("the registry was read for the warm-up event")

    store = Store()
    warm = {"event": ACK, "topic": WARM_UP_TOPIC, "subscription": "warm-up",
            "messageId": "dwell.delayed:0:0", "ts": NOW}
    decided = decided_by(store, warm, lookup=not_asked)
    assert decided == Decided()
    assert store.reads == []


def test_a_delivery_with_ack_timeout_zero_is_ignored() -> None:
    """The SDK's delivery of a subscription without an ack timeout: nothing read, nothing
    decided, not counted."""
    store = Store({(TOPIC, SUB): {MID: (NOW + 5500, NOW + 5500, 1)}})
    decided = decided_by(store, sdk_event("delivered", NOW, ackTimeoutMs=0))
    assert decided == Decided()
    assert store.reads == []
