"""Retry and dead-letter topics as an attacker would make them, on the real Kafka and Redis
and the real Spark app: ack events naming subscriptions nobody registered (so past
maxSubscriptionsPerTopic and the tracker) make no Kafka topic; they are set aside on
dwell.invalid, and the registered subscription's redeliveries go on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dwell import headers as hdr
from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import invalid
from dwell.core import topics as names
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName, retry_topic
from dwell.index import subscriptions
from dwell_dev import devstack
from dwell_dev.testkit import read_until, redis_db_url, spark_app_env
from dwell_spark.backoff import WARM_UP_TOPIC
from dwell_spark.invalid import SubscriptionCheck, check_records
from e2e.conftest import SparkApp
from hostile.test_ack_path import FAST_NACK, MAX_EVENT_BYTES, TICK_MS, event, send

# This module's own Redis database: its registry, and its Spark app's indexes.
DB = 2
INVENTED = 12


@pytest.fixture(scope="module")
def spark_app(stack: devstack.Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        SparkApp]:
    redis_url = redis_db_url(stack, DB)
    r = redis_adapter.connect(redis_url)
    r.flushdb()
    # The tracker's rebuild leaves this marker: the registry is whole.
    r.set(keys.SUBSCRIPTIONS_APPLIED, 0)
    env = spark_app_env(stack, redis_url, tmp_path_factory.mktemp("app-ck"), TICK_MS)
    app = SparkApp(env, Path(str(tmp_path_factory.mktemp("app-logs"))))
    try:
        app.start()
        yield app
    finally:
        app.stop()
        r.flushdb()


def test_events_of_unregistered_subscriptions_make_no_topics(
        spark_app: SparkApp, stack: devstack.Stack, unique: str) -> None:
    bootstrap = stack.kafka_bootstrap
    topic = f"persistent://{unique}/ns/x"
    t = TopicName.parse(topic)
    subscriptions.put(redis_adapter.connect(redis_db_url(stack, DB)), topic, "s",
                      SubscriptionSettings.from_json({}))
    for name in (t.kafka_topic, retry_topic(t, "s")):  # as the tracker makes them
        kafka.ensure_topic(bootstrap, name, 1)
    invalid_ends = kafka.end_offsets(bootstrap, names.INVALID)
    p = kafka.Producer(bootstrap, linger_ms=0)
    mid = send(p, t.kafka_topic, b"payload", topic)
    invented = [f"invented-{i}" for i in range(INVENTED)]
    sent = set()
    for i, sub in enumerate(invented):
        # Half dead-letter at once, half go through the redelivery index and the drain.
        extra = ({"maxRedeliverCount": 1, "redeliveryCount": 1} if i % 2 else
                 {"negativeAckRedeliveryBackoff": FAST_NACK})
        sent.add(p.send(names.ACKS, json.dumps(event(topic, sub, mid, **extra)).encode(),
                        f"{topic}/{sub}".encode()).result(15))
    # Then the registered subscription's own nack: the drain copies it in the same round
    # as (or after) any redelivery of the events before it.
    p.send(names.ACKS, json.dumps(event(topic, "s", mid, negativeAckRedeliveryBackoff=FAST_NACK)
                                  ).encode(), f"{topic}/s".encode()).result(15)
    p.close()
    assert [x.value for x in read_until(bootstrap, retry_topic(t, "s"), {},
                                        lambda got: bool(got), 120)] == [b"payload"]

    def set_aside(got: list[kafka.Record]) -> dict[tuple[int, int], kafka.Record]:
        return {(int(x.header(hdr.SOURCE_PARTITION) or -1),
                 int(x.header(hdr.SOURCE_OFFSET) or -1)): x
                for x in got if x.header(hdr.SOURCE_TOPIC) == names.ACKS}
    found = set_aside(read_until(bootstrap, names.INVALID, invalid_ends,
                                 lambda got: sent <= set_aside(got).keys(), 60))
    assert sent <= found.keys()
    for pos in sent:
        assert found[pos].header(hdr.INVALID_KIND) == invalid.UNKNOWN_SUBSCRIPTION
        assert "is not registered" in (found[pos].header(hdr.INVALID_REASON) or "")
    made = {name for name in kafka.topic_names(bootstrap) if name.startswith(t.kafka_topic)}
    assert made == {t.kafka_topic, retry_topic(t, "s")}, sorted(made)


def test_the_check_reads_the_registry_only_once_it_is_whole(
        stack: devstack.Stack, unique: str) -> None:
    """Before the tracker has rebuilt a lost registry (no marker) no subscription can be
    told unknown: events are kept, as losing Redis may cost time, never a redelivery."""
    redis_url = redis_db_url(stack, DB)
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    subscriptions.put(r, topic, "s", SubscriptionSettings.from_json({}))
    check = SubscriptionCheck(redis_url, ttl_ms=0)

    def kinds() -> list[str | None]:
        values = [json.dumps(event(topic, sub, "dwell.delayed:0:0")).encode()
                  for sub in ("s", "other")] + [json.dumps(event(
                      WARM_UP_TOPIC, "w", "dwell.delayed:0:0")).encode()]
        return [kind for kind, _, _ in check_records(
            values, [None] * 3, MAX_EVENT_BYTES, frozenset({WARM_UP_TOPIC}),
            subscriptions=check)]
    r.delete(keys.SUBSCRIPTIONS_APPLIED)
    assert kinds() == [None, None, None]
    r.set(keys.SUBSCRIPTIONS_APPLIED, 0)
    try:
        assert kinds() == [None, invalid.UNKNOWN_SUBSCRIPTION, None]
    finally:
        r.delete(keys.SUBSCRIPTIONS_APPLIED, keys.subscriptions(topic))
