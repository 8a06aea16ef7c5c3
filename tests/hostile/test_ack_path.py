"""The ack path as an attacker uses it, on the real Kafka and Redis: an ack event whose
messageId names another topic's record (another tenant's ready topic, the delay log,
dwell.publish with its tokens, dwell.acks, Kafka's own topics) copies nothing into the
sender's retry or dead-letter topic; no copy dwell writes carries a client's
`dwell-authorization`; and an event whose numbers overflow the backoff's arithmetic is
set aside while the real Spark app goes on delivering."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dwell import headers as hdr
from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import invalid
from dwell.core import topics as names
from dwell.core.invalid import MAX_TS_MS
from dwell.core.positions import format_message_id
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName, dlq_topic, retry_topic
from dwell.index import subscriptions
from dwell_dev import devstack
from dwell_dev.testkit import local_spark, now_ms, read_until, redis_db_url, spark_app_env, wait_for
from dwell_spark import metrics
from dwell_spark.backoff import WARM_UP_TOPIC, Decided, Pass
from dwell_spark.decisions import DEAD, SCHEDULE, Decision, decide
from dwell_spark.drain import Drainer
from dwell_spark.invalid import check_records
from dwell_spark.settings import SparkSettings
from e2e.conftest import SparkApp

# This module's own Redis database: its drainer and Spark app claim every due bucket there.
DB = 3
TICK_MS = 100
FAST_NACK = {"minDelayMs": 100, "maxDelayMs": 100, "multiplier": 2.0}
MAX_EVENT_BYTES = 65536


def event(topic: str, sub: str, message_id: str, **extra: Any) -> dict[str, Any]:
    return {"event": "nack", "topic": topic, "subscription": sub, "messageId": message_id,
            "ts": now_ms()} | extra


def checked(ev: dict[str, Any]) -> tuple[str | None, str | None]:
    """(kind, reason) the Spark app's check gives the event (both None: good)."""
    [(kind, reason, _)] = check_records([json.dumps(ev).encode()], [None], MAX_EVENT_BYTES,
                                        frozenset({WARM_UP_TOPIC}))
    return kind, reason


def send(p: kafka.Producer, topic: str, value: bytes, owner: str,
         key: bytes | None = None) -> str:
    """Write a record of Pulsar topic ``owner`` as admission would, plus a client token
    (as a dwell.publish request carries one); its messageId."""
    part, off = p.send(topic, value, key, {hdr.TOPIC: owner.encode(),
                                           hdr.AUTHORIZATION: b"Bearer token-of-a-client"}
                       ).result(15)
    return format_message_id(topic, part, off)


def read_all(bootstrap: str, topic: str, want: int, timeout: float = 30) -> list[kafka.Record]:
    return read_until(bootstrap, topic, {}, lambda got: len(got) >= want, timeout)


@pytest.mark.parametrize("named", [
    "other tenant's ready topic", "same namespace's other topic", "dwell.publish",
    "dwell.acks", "__consumer_offsets", "own DLQ", "other subscription's retry topic",
    "dwell.invalid"])
def test_an_event_naming_a_kafka_topic_not_its_own_is_set_aside(named: str) -> None:
    a = "persistent://ta/ns/a"
    kafka_topic = {"other tenant's ready topic": "tb.ns.a",
                   "same namespace's other topic": "ta.ns.b",
                   "dwell.publish": names.PUBLISH, "dwell.acks": names.ACKS,
                   "__consumer_offsets": "__consumer_offsets",
                   "own DLQ": dlq_topic(TopicName.parse(a), "s"),
                   "other subscription's retry topic": retry_topic(TopicName.parse(a), "t"),
                   "dwell.invalid": names.INVALID}[named]
    kind, reason = checked(event(a, "s", f"{kafka_topic}:0:0", maxRedeliverCount=1))
    assert kind == invalid.FIELD and reason is not None
    assert reason.startswith("messageId: ") and "is not a Kafka topic of" in reason, reason
    # The system topic's events skip authentication, not this check.
    kind, _ = checked(event(WARM_UP_TOPIC, "x", f"{kafka_topic}:0:0"))
    assert kind == invalid.FIELD


def test_an_event_naming_its_own_topics_records_is_good() -> None:
    a = TopicName.parse("persistent://ta/ns/a")
    for topic, mid in [(a, "ta.ns.a:3:7"), (a, f"{retry_topic(a, 's')}:0:1"),
                       (a, "dwell.delayed:2:9"), (a, "dwell.delayed.refiled:0:4"),
                       (a.partition(2), "ta.ns.a:2:5")]:
        assert checked(event(str(topic), "s", mid)) == (None, None), (topic, mid)


@pytest.mark.parametrize(("field", "value", "words"), [
    ("ts", 2**63 - 1, "9999-12-31T23:59:59.999Z"),
    ("ts", MAX_TS_MS + 1, str(MAX_TS_MS)),
    ("redeliveryCount", 2**63 - 1, str(2**31 - 1)),
    ("maxRedeliverCount", 2**31, str(2**31 - 1)),
    ("ackTimeoutMs", 2**62, "100 years"),
    ("negativeAckRedeliveryBackoff", {"minDelayMs": 2**62, "maxDelayMs": 2**62},
     "maxDelayMs must be at most"),
    ("ackTimeoutRedeliveryBackoff", {"multiplier": 1e300}, "multiplier must be at most"),
])
def test_numbers_an_event_could_overflow_with_are_refused_naming_the_bound(
        field: str, value: Any, words: str) -> None:
    for topic in ("persistent://ta/ns/a", WARM_UP_TOPIC):
        kind, reason = checked(event(topic, "x", "dwell.delayed:0:0", **{field: value}))
        assert kind == invalid.FIELD and reason is not None and words in reason, reason


@pytest.fixture()
def drain_env(stack: devstack.Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Any, SparkSettings, Any]]:
    with local_spark(stack, DB, tmp_path_factory.mktemp("ck"),
                     redelivery_tick_ms=TICK_MS) as env:
        yield env


def decisions(topic: str, sub: str, events: list[dict[str, Any]]) -> Decided:
    """The backoff's decisions on ``events`` of one subscription with nothing pending, as
    the pass makes them past its check."""
    pending: dict[str, Any] = {}
    out: list[Decision] = []
    for ev in events:
        decide(ev, pending, out, TICK_MS)
    return Decided(decisions={(topic, sub): out}, pending={(topic, sub): dict(pending)})


def test_the_drain_copies_no_record_of_another_topic_and_no_token(
        drain_env: tuple[Any, SparkSettings, Any], unique: str) -> None:
    """Past the event check (an event read before it existed, a delay-log position that
    names another topic's record): the dead-letter and redelivery copies read the record
    and copy only those of the event's topic, without the client's token."""
    spark, settings, r = drain_env
    bootstrap = settings.kafka_bootstrap
    a, b = f"persistent://{unique}/ns/a", f"persistent://{unique}/ns/b"
    other = f"persistent://{unique}x/ns/a"
    for t in (a, b, other):
        kafka.ensure_topic(bootstrap, TopicName.parse(t).kafka_topic, 1)
    p = kafka.Producer(bootstrap, linger_ms=0)
    secret_b = send(p, TopicName.parse(b).kafka_topic, b"secret-of-b", b)
    secret_other = send(p, TopicName.parse(other).kafka_topic, b"secret-of-other", other)
    delayed_b = send(p, names.DELAYED, b"delayed-of-b", b, b.encode())
    own = send(p, TopicName.parse(a).kafka_topic, b"own-of-a", a)
    delayed_own = send(p, names.DELAYED, b"delayed-of-a", a, a.encode())
    p.close()
    foreign = [secret_b, secret_other, delayed_b]
    before = metrics.FOREIGN_RECORDS._value.get()
    work = Pass.of(settings)

    # Dead letters due at once: a nack past maxRedeliverCount 1.
    dead = decisions(a, "s", [event(a, "s", mid, maxRedeliverCount=1, redeliveryCount=1)
                              for mid in [*foreign, own]])
    assert [row[1] for row in dead.decisions[(a, "s")]] == [DEAD] * 4
    work.write(dead)
    # Redeliveries through the subscription's index and the drain.
    later = decisions(a, "s2", [event(a, "s2", mid, negativeAckRedeliveryBackoff=FAST_NACK)
                                for mid in [*foreign, own, delayed_own]])
    assert [row[1] for row in later.decisions[(a, "s2")]] == [SCHEDULE] * 5
    work.write(later)
    time.sleep(2 * TICK_MS / 1000)
    drainer = Drainer(spark, settings, r)
    wait_for(lambda: drainer.run_once() >= 0 and not r.zcard(keys.DUE_SUBSCRIPTIONS), 30,
             "redeliveries drained")

    dlq = read_all(bootstrap, dlq_topic(TopicName.parse(a), "s"), 1)
    retry = read_all(bootstrap, retry_topic(TopicName.parse(a), "s2"), 2)
    assert [x.value for x in dlq] == [b"own-of-a"]
    assert sorted(x.value for x in retry) == [b"delayed-of-a", b"own-of-a"]
    for rec in [*dlq, *retry]:
        assert rec.header(hdr.AUTHORIZATION) is None, rec
        assert rec.header(hdr.TOPIC) == a
    assert metrics.FOREIGN_RECORDS._value.get() - before == 6
    # The entries of another topic's records are dropped, not left to retry.
    counts = {m.decode() for m in r.hkeys(keys.sub_counts(a, "s2"))}
    assert not counts & set(foreign), counts


@pytest.fixture(scope="module")
def spark_app(stack: devstack.Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[SparkApp, str]]:
    redis_url = redis_db_url(stack, DB)
    redis_adapter.connect(redis_url).flushdb()
    env = spark_app_env(stack, redis_url, tmp_path_factory.mktemp("app-ck"), TICK_MS)
    app = SparkApp(env, Path(str(tmp_path_factory.mktemp("app-logs"))))
    try:
        app.start()
        yield app, redis_url
    finally:
        app.stop()
        redis_adapter.connect(redis_url).flushdb()


def test_an_overflowing_ack_event_does_not_stop_delivery(
        spark_app: tuple[SparkApp, str], stack: devstack.Stack, unique: str) -> None:
    app, redis_url = spark_app
    bootstrap = stack.kafka_bootstrap
    topic = f"persistent://{unique}/ns/c"
    # Registered, as the SDK does: events of unknown subscriptions are set aside.
    subscriptions.put(redis_adapter.connect(redis_url), topic, "s",
                      SubscriptionSettings.from_json({}))
    ready, retry = TopicName.parse(topic).kafka_topic, retry_topic(TopicName.parse(topic), "s")
    for name in (ready, retry):  # as the SDK's consumer makes them
        kafka.ensure_topic(bootstrap, name, 1)
    invalid_ends = kafka.end_offsets(bootstrap, names.INVALID)
    p = kafka.Producer(bootstrap, linger_ms=0)
    # No token: events on the warm-up topic skip authentication.
    poison = [
        {"event": "nack", "topic": WARM_UP_TOPIC, "subscription": "x",
         "messageId": "dwell.delayed:0:0", "ts": 2**63 - 1},
        event(topic, "s", f"{ready}:0:0", ts=MAX_TS_MS,
              negativeAckRedeliveryBackoff={"minDelayMs": 2**62, "maxDelayMs": 2**62}),
    ]
    sent = {p.send(names.ACKS, json.dumps(ev).encode(), b"poison").result(15)
            for ev in poison}
    # Then a consumer's nack on another topic: still redelivered.
    mid = send(p, ready, b"still-delivered", topic)
    p.send(names.ACKS, json.dumps(event(topic, "s", mid, negativeAckRedeliveryBackoff=FAST_NACK)
                                  ).encode(), f"{topic}/s".encode()).result(15)
    p.close()
    copies = read_until(bootstrap, retry, {},
                        lambda got: bool(got) or not app.running(),
                        120)
    assert app.running(), "the Spark app exited"
    assert [x.value for x in copies] == [b"still-delivered"]
    assert copies[0].header(hdr.AUTHORIZATION) is None

    def set_aside(got: list[kafka.Record]) -> dict[tuple[int, int], kafka.Record]:
        return {(int(x.header(hdr.SOURCE_PARTITION) or -1),
                 int(x.header(hdr.SOURCE_OFFSET) or -1)): x
                for x in got if x.header(hdr.SOURCE_TOPIC) == names.ACKS}
    found = set_aside(read_until(bootstrap, names.INVALID, invalid_ends,
                                 lambda got: sent <= set_aside(got).keys(), 60))
    assert sent <= found.keys()
    assert all(found[pos].header(hdr.INVALID_KIND) == invalid.FIELD for pos in sent)
    url = f"http://127.0.0.1:{app.metrics_port}/healthz"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200


OVERFLOWING_REGISTRATIONS = [
    ({"ackTimeoutMs": 2**63 - 1}, "ackTimeoutMs: Ack timeout should be at most"),
    ({"negativeAckRedeliveryBackoff": {"minDelayMs": 2**62, "maxDelayMs": 2**62}},
     "negativeAckRedeliveryBackoff: maxDelayMs must be at most"),
    ({"ackTimeoutRedeliveryBackoff": {"multiplier": 1e300}},
     "ackTimeoutRedeliveryBackoff: multiplier must be at most"),
    ({"maxRedeliverCount": 2**63 - 1}, "maxRedeliverCount: must be at most"),
]


def test_a_registration_whose_numbers_could_overflow_is_a_400(
        services: Any, stack: devstack.Stack, unique: str) -> None:
    """The backoff reads the registry for events that carry no settings: what the
    tracker stores must fit the same bounds as an event's own."""
    redis_url = redis_db_url(stack, DB)
    delayed = f"test.delayed.{unique}"
    kafka.ensure_topic(stack.kafka_bootstrap, delayed, 1)
    svc = services.start("tracker", env={"DWELL_REDIS_URL": redis_url,
                                         "DWELL_DELAYED_TOPIC": delayed,
                                         "DWELL_TRACKER_GROUP_ID": f"dwell-tracker-{unique}"})
    try:
        for body, reason in OVERFLOWING_REGISTRATIONS:
            resp = httpx.put(f"{svc.url}/v1/topics/persistent/{unique}/ns/x/subscriptions/s",
                             json=body, timeout=10)
            assert resp.status_code == 400, (body, resp.text)
            assert resp.json()["reason"].startswith(reason), resp.json()
    finally:
        svc.stop()
