"""Rebuilding lost redelivery indexes (real Redis and Kafka; the whole rebuild in the Spark
app is exercised end to end in tests/e2e/test_redis_loss_redelivery.py): the replay of
dwell.acks finds what is still pending, and putting it back restores entries not yet
claimable as they are and entries already due unless their copy is on the retry (or
dead-letter) topic."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics as names
from dwell.core.backoff import DEFAULT_NACK_DELAY_MS, ExponentialRedeliveryBackoff
from dwell.core.positions import format_message_id
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName, dlq_topic, retry_topic
from dwell.index import subscriptions
from dwell.index.redelivery import SubscriptionIndex
from dwell.tracker.registry import record_key
from dwell_dev.testkit import redis_db_url
from dwell_spark import metrics
from dwell_spark.backoff import Pass, send_warm_up
from dwell_spark.recovery import (
    IndexKeeper,
    Pending,
    redelivery_horizon_ms,
    replay,
    replay_window_ms,
    restore,
)
from dwell_spark.settings import SparkSettings

pytestmark = pytest.mark.integration

# A Redis database of its own: the applied marker is one key per database.
LAG_DB = 1

TICK = 100


def _copy(bootstrap: str, target: str, mid: str, count: int) -> None:
    p = kafka.Producer(bootstrap)
    try:
        p.send(target, b"payload", headers={"dwell-message-id": mid,
                                            "dwell-redelivery-count": str(count)}).result(30)
    finally:
        p.close()


def test_restore_skips_only_redeliveries_already_on_their_topic(redis_url: str,
                                                                kafka_bootstrap: str,
                                                                unique: str) -> None:
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    retry = retry_topic(TopicName.parse(topic), "s")
    dlq = dlq_topic(TopicName.parse(topic), "s")
    kafka.ensure_topic(kafka_bootstrap, retry, 4)
    now = int(time.time() * 1000)
    now -= now % TICK  # bucket starts
    past, future = now - 5000, now + 60_000
    ids = {name: format_message_id("dwell.delayed", 1, off)
           for name, off in (("pending", 10), ("sent", 11), ("older_sent", 12), ("dead", 13))}
    entries = [
        Pending(topic, "s", ids["pending"], future + 7, future, 1),
        Pending(topic, "s", ids["sent"], past + 7, past, 1),
        # A copy of its previous redelivery (count 1) is not this one (count 2).
        Pending(topic, "s", ids["older_sent"], past + 7, past, 2),
        # A dead letter (count 2, stored as -3) with nothing on the DLQ (which does not
        # exist yet).
        Pending(topic, "s", ids["dead"], past + 7, past, -3),
    ]
    _copy(kafka_bootstrap, retry, ids["sent"], 1)
    _copy(kafka_bootstrap, retry, ids["older_sent"], 1)

    assert restore(r, kafka_bootstrap, entries, TICK, now) == (1, 2, 1)

    idx = SubscriptionIndex(r, topic, "s")
    assert sorted(idx.buckets()) == [past, future]
    assert {f: set(bm) for f, bm in idx.read_bucket(future).items()} == {
        "dwell.delayed:1": {10}}
    assert {f: set(bm) for f, bm in idx.read_bucket(past).items()} == {
        "dwell.delayed:1": {12, 13}}
    counts = r.hgetall(keys.sub_counts(topic, "s"))
    assert counts == {ids["pending"].encode(): b"1", ids["older_sent"].encode(): b"2",
                      ids["dead"].encode(): b"-3"}

    # Once the dead letter is on the DLQ too, a second loss skips it as well.
    kafka.ensure_topic(kafka_bootstrap, dlq, 4)
    _copy(kafka_bootstrap, dlq, ids["dead"], 2)
    idx.drop()
    assert restore(r, kafka_bootstrap, entries, TICK, now) == (1, 1, 2)
    assert {f: set(bm) for f, bm in idx.read_bucket(past).items()} == {
        "dwell.delayed:1": {12}}


def test_replay_rebuilds_what_is_still_pending_from_dwell_acks(redis_url: str,
                                                               kafka_bootstrap: str,
                                                               unique: str) -> None:
    """The events of the replay window, decided as the backoff decides them: an acked
    delivery leaves nothing, an unacked one and a nack leave their redeliveries, and what
    the checks refuse (an unregistered subscription, a record that is not JSON, another
    topic's record) leaves nothing, whatever it claims."""
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    subscriptions.put(r, topic, "s", SubscriptionSettings(60_000))
    kafka.ensure_dwell_topics(kafka_bootstrap)
    since = int(time.time() * 1000) - 1000
    now = int(time.time() * 1000)
    mids = [format_message_id("dwell.delayed", 0, o) for o in range(4)]
    base = {"topic": topic, "subscription": "s", "ts": now}
    events = [base | {"event": "delivered", "messageId": mids[0]},
              base | {"event": "delivered", "messageId": mids[1]},
              base | {"event": "ack", "messageId": mids[1], "ts": now + 1},
              base | {"event": "nack", "messageId": mids[2], "ackTimeoutMs": 60_000,
                      "negativeAckRedeliveryBackoff": {"minDelayMs": 5000,
                                                       "maxDelayMs": 5000}},
              base | {"event": "delivered", "messageId": mids[3], "subscription": "ghost",
                      "ackTimeoutMs": 1000},
              base | {"event": "delivered", "ackTimeoutMs": 1000,
                      "messageId": f"persistent://{unique}-other/ns/y:0:5"}]
    p = kafka.Producer(kafka_bootstrap)
    try:
        futures = [p.send(names.ACKS, orjson.dumps(ev), key=f"{topic}/s".encode())
                   for ev in events]
        futures.append(p.send(names.ACKS, b"{not json", key=f"{topic}/s".encode()))
        for f in futures:
            f.result(30)
    finally:
        p.close()
    ends = kafka.end_offsets(kafka_bootstrap, names.ACKS)
    work = Pass.of(SparkSettings(redis_url=redis_url, kafka_bootstrap=kafka_bootstrap,
                                 redelivery_tick_ms=TICK))
    # The registry is whole (the tracker's marker): an unregistered subscription is unknown.
    made_marker = r.set(keys.SUBSCRIPTIONS_APPLIED, 0, nx=True)
    try:
        found = [p for p in replay(kafka_bootstrap, work, since, ends, now + 10)
                 if p.topic == topic]
    finally:
        if made_marker:
            r.delete(keys.SUBSCRIPTIONS_APPLIED)
    due_ack, due_nack = now + 60_000, now + 5000
    assert sorted((p.message_id, p.subscription, p.due_at, p.stored) for p in found) == [
        (mids[0], "s", due_ack, 1), (mids[2], "s", due_nack, 1)]
    assert all(p.bucket == p.due_at - p.due_at % TICK for p in found)
    # Put back, with their pending entries (which a later ack cancels).
    assert restore(r, kafka_bootstrap, found, TICK, now + 10) == (2, 0, 0)
    idx = SubscriptionIndex(r, topic, "s")
    assert idx.pending([mids[0], mids[1], mids[2]]) == [
        (due_ack, due_ack - due_ack % TICK, 1), None, (due_nack, due_nack - due_nack % TICK, 1)]


def test_the_replay_goes_back_as_far_as_a_registered_subscription_reaches(
        kafka_bootstrap: str, unique: str) -> None:
    """The window is the longest redelivery horizon on `dwell.subscriptions` plus the
    grace, capped by backoff_replay_window_ms."""
    assert redelivery_horizon_ms(SubscriptionSettings(0)) == DEFAULT_NACK_DELAY_MS
    slow = SubscriptionSettings(90_000, ExponentialRedeliveryBackoff(1000, 30_000, 2))
    assert redelivery_horizon_ms(slow) == 120_000
    assert redelivery_horizon_ms(SubscriptionSettings(
        0, None, ExponentialRedeliveryBackoff(1000, 300_000, 2))) == 300_000
    kafka.ensure_dwell_topics(kafka_bootstrap)
    p = kafka.Producer(kafka_bootstrap)
    try:
        p.send(names.SUBSCRIPTIONS, json.dumps(slow.to_json()).encode(),
               key=record_key(f"persistent://{unique}/ns/x", "slow")).result(30)
    finally:
        p.close()
    grace = 60_000
    settings = SparkSettings(kafka_bootstrap=kafka_bootstrap, backoff_state_grace_ms=grace)
    # Other tests' subscriptions on the shared log may reach further, never less far.
    assert replay_window_ms(kafka_bootstrap, settings) >= 120_000 + grace
    capped = settings.model_copy(update={"backoff_replay_window_ms": 100_000})
    assert replay_window_ms(kafka_bootstrap, capped) == 100_000


def test_the_lag_is_what_dwell_acks_holds_beyond_the_marker(stack: Any,
                                                            kafka_bootstrap: str) -> None:
    r = redis_adapter.connect(redis_db_url(stack, LAG_DB))
    r.flushdb()
    settings = SparkSettings(kafka_bootstrap=kafka_bootstrap)
    keeper = IndexKeeper(settings, r, Pass.of(settings), lambda: None)
    try:
        assert keeper.measure_lag() is None  # no marker: Redis holds nothing to measure
        kafka.ensure_dwell_topics(kafka_bootstrap)
        ends = kafka.end_offsets(kafka_bootstrap, names.ACKS)
        behind = {p: min(end, 3) for p, end in ends.items()}
        r.hset(keys.BACKOFF_APPLIED, mapping={str(p): ends[p] - n for p, n in behind.items()})
        assert keeper.measure_lag() == sum(behind.values())
        assert metrics.BACKOFF_LAG._value.get() == sum(behind.values())
    finally:
        r.flushdb()


def test_read_to_is_now_where_the_backoff_is_level_and_its_last_event_where_behind(
        stack: Any, kafka_bootstrap: str) -> None:
    """What the drain asks before it claims redeliveries (Drainer.acks_read_to): a
    partition with events the backoff has not applied holds it at the last event applied
    there, or at 0 before any."""
    r = redis_adapter.connect(redis_db_url(stack, LAG_DB))
    r.flushdb()
    settings = SparkSettings(kafka_bootstrap=kafka_bootstrap)
    keeper = IndexKeeper(settings, r, Pass.of(settings), lambda: None)
    p = kafka.Producer(kafka_bootstrap)
    try:
        kafka.ensure_dwell_topics(kafka_bootstrap)
        send_warm_up(p)  # an event the backoff passes over: no other app minds it
        ends = kafka.end_offsets(kafka_bootstrap, names.ACKS)
        r.hset(keys.BACKOFF_APPLIED, mapping={str(q): end for q, end in ends.items()})
        before = int(time.time() * 1000)
        assert before <= keeper.read_to() <= int(time.time() * 1000)
        part = next(q for q, end in ends.items() if end > 0)
        r.hset(keys.BACKOFF_APPLIED, str(part), ends[part] - 1)
        assert keeper.read_to() == 0  # nothing applied in this process yet
        keeper.saw([SimpleNamespace(partition=part, next=ends[part] - 1, last_ts=before - 5000,
                                    lost=False)])
        assert keeper.read_to() == before - 5000
        r.hset(keys.BACKOFF_APPLIED, str(part), ends[part])  # caught up again
        assert keeper.read_to() >= before
    finally:
        p.close()
        r.flushdb()
