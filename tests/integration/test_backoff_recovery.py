"""Putting the backoff state's pending redeliveries back into a lost redelivery index (real
Redis and Kafka; the Spark read of the state is exercised end to end in
tests/e2e/test_redis_loss_redelivery.py): entries not yet claimable go back as they are,
entries already due go back unless their copy is on the retry (or dead-letter) topic."""

from __future__ import annotations

import time

import pytest

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core.positions import format_message_id
from dwell.core.topics import TopicName, dlq_topic, retry_topic
from dwell.index.redelivery import SubscriptionIndex
from dwell_spark.recovery import Pending, restore

pytestmark = pytest.mark.integration

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
