"""The drain against real Redis, Kafka and Spark local: positions indexed with the
tracker's API come out on the ready topic and the retry topic with dwell's headers, and
the claims are completed. Runs in its own Redis database so that no other suite's index
is drained."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redislib
from pyspark.sql import Row

from dwell import keys
from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.positions import format_message_id, index_field
from dwell.core.topics import TopicName, dlq_topic, retry_topic
from dwell.index.redelivery import SubscriptionIndex
from dwell.index.topic import TopicIndex
from dwell_dev import devstack
from dwell_dev.testkit import configure_topic, free_port, local_spark, wait_for
from dwell_spark.backoff import Pass, send_warm_up
from dwell_spark.drain import Drainer
from dwell_spark.recovery import IndexKeeper
from dwell_spark.settings import SparkSettings

ROOT = Path(__file__).resolve().parents[2]

DB = 8


@pytest.fixture(scope="module")
def spark_env(stack: devstack.Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[object, SparkSettings, object]]:
    with local_spark(stack, DB, tmp_path_factory.mktemp("ck")) as env:
        yield env


@pytest.fixture(autouse=True)
def _index_emptied_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test leaves the index empty: a bucket a failed test left behind (one that
    cannot be delivered) never reaches the next test's drainer."""
    yield
    if "spark_env" in request.fixturenames:
        request.getfixturevalue("spark_env")[2].flushdb()


def delayed_record(p: kafka.Producer, topic: str, payload: bytes, key: str | None,
                   deliver_at: int) -> tuple[int, int]:
    headers = {"dwell-topic": topic, "dwell-publish-time": "1", "dwell-producer": "t",
               "dwell-deliver-at": str(deliver_at), "dwell-tick-time": "1000", "colour": "red"}
    if key is not None:
        headers["dwell-key"] = key
    return p.send(names.DELAYED, payload, key=topic, headers=headers).result(10)


def refiled_copies(p: kafka.Producer, topic: str, originals: list[tuple[int, int]],
                   deliver_at: int, **extra: str) -> list[tuple[int, int]]:
    """Copies of ``originals`` as the tracker's restage writes them to the re-file log
    (payload ``r<i>``, the original's origin and id, ``extra`` headers); their positions."""
    return [p.send(names.REFILED, f"r{i}".encode(), key=topic, headers={
        "dwell-topic": topic, "dwell-deliver-at": str(deliver_at), "dwell-tick-time": "1000",
        "dwell-origin": f"{part}:{off}",
        "dwell-message-id": format_message_id(names.DELAYED, part, off),
        **{k.replace("_", "-"): v.format(i=i) for k, v in extra.items()}}).result(10)
        for i, (part, off) in enumerate(originals)]


def read(bootstrap: str, topic: str, n: int, timeout: float = 15) -> list[kafka.Record]:
    c = kafka.Consumer(bootstrap, f"reader-{time.time_ns()}", [topic])
    out: list[kafka.Record] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            out += c.poll(100, 0.5)
    finally:
        c.close()
    return out


@pytest.mark.parametrize("local_max", [0, 2000], ids=["spark-job", "driver"])
def test_due_bucket_goes_to_ready_topic_with_headers(spark_env, unique: str,
                                                      local_max: int) -> None:
    spark, settings, r = spark_env
    settings = settings.model_copy(update={"drain_local_max_records": local_max})
    topic = f"persistent://{unique}/ns/x"
    ready = TopicName.parse(topic).kafka_topic
    kafka.ensure_topic(settings.kafka_bootstrap, ready, 2)
    p = kafka.Producer(settings.kafka_bootstrap)
    now = int(time.time() * 1000)
    due = [delayed_record(p, topic, f"m{i}".encode(), f"k{i}", now - 10) for i in range(5)]
    later = delayed_record(p, topic, b"later", None, now + 60_000)
    p.close()
    TopicIndex(r, topic).add([(part, off, now - 10, 1000) for part, off in due]
                             + [(later[0], later[1], now + 60_000, 1000)])
    drainer = Drainer(spark, settings, r)
    t0 = time.monotonic()
    assert drainer.run_once(now) == 5
    print(f"drain round with one bucket ({local_max=}): {time.monotonic() - t0:.2f}s")
    recs = read(settings.kafka_bootstrap, ready, 5)
    assert sorted(x.value for x in recs) == [f"m{i}".encode() for i in range(5)]
    for x in recs:
        i = int(x.value[1:])
        part, off = due[i]
        assert x.key == f"k{i}".encode()
        assert x.header("dwell-message-id") == format_message_id(names.DELAYED, part, off)
        assert x.header("dwell-origin") == f"{part}:{off}"
        assert x.header("colour") == "red" and x.header("dwell-topic") == topic
        assert x.header("dwell-key") is None
    # Claimed buckets are completed: only the later one is left, and a second round
    # emits nothing.
    assert TopicIndex(r, topic).buckets() == [(now + 60_000) - (now + 60_000) % 1000]
    assert drainer.run_once(now) == 0


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_a_bucket_in_both_delay_logs_drains_with_the_originals_ids(
        spark_env, unique: str, path: str) -> None:
    """Records the tracker re-filed (dwell.delayed.refiled, index fields from
    REFILED_FIELD_BASE) are drained beside originals, each with the id and origin of the
    record its producer wrote."""
    spark, settings, r = spark_env
    topic = f"persistent://{unique}/ns/x"
    ready = TopicName.parse(topic).kafka_topic
    kafka.ensure_topic(settings.kafka_bootstrap, ready, 2)
    kafka.ensure_topic(settings.kafka_bootstrap, names.REFILED, 4)
    p = kafka.Producer(settings.kafka_bootstrap)
    now = int(time.time() * 1000)
    plain = [delayed_record(p, topic, f"o{i}".encode(), f"k{i}", now - 10) for i in range(3)]
    originals = [delayed_record(p, topic, f"r{i}".encode(), f"k{i}", now - 10)
                 for i in range(3)]
    copies = refiled_copies(p, topic, originals, now - 10, dwell_key="k{i}", colour="red")
    p.close()
    TopicIndex(r, topic).add([(part, off, now - 10, 1000) for part, off in plain]
                             + [(index_field(part, True), off, now - 10, 1000)
                                for part, off in copies])
    assert Drainer(spark, settings, r).run_once(now, path=path) == 6
    recs = {x.value: x for x in read(settings.kafka_bootstrap, ready, 6)}
    assert sorted(recs) == [b"o0", b"o1", b"o2", b"r0", b"r1", b"r2"]
    for i in range(3):
        for value, (part, off) in ((b"o%d" % i, plain[i]), (b"r%d" % i, originals[i])):
            x = recs[value]
            assert x.key == f"k{i}".encode() and x.header("colour") == "red"
            assert x.header("dwell-message-id") == format_message_id(names.DELAYED, part, off)
            assert x.header("dwell-origin") == f"{part}:{off}"
            assert x.header("dwell-key") is None and x.header("dwell-tick-time") is None
    assert TopicIndex(r, topic).buckets() == []


def test_redelivery_goes_to_retry_topic_with_count(spark_env, unique: str) -> None:
    spark, settings, r = spark_env
    settings = settings.model_copy(update={"drain_local_max_records": 0})
    topic = f"persistent://{unique}/ns/x"
    ready = TopicName.parse(topic).kafka_topic
    kafka.ensure_topic(settings.kafka_bootstrap, ready, 1)
    p = kafka.Producer(settings.kafka_bootstrap)
    part, off = p.send(ready, b"immediate", key=b"kk", headers={"dwell-topic": topic}).result(10)
    p.close()
    mid = format_message_id(ready, part, off)
    sidx = SubscriptionIndex(r, topic, "sub")
    r.hset(keys.sub_counts(topic, "sub"), mid, 3)
    now = int(time.time() * 1000)
    sidx.add([(ready, part, off, now - 500)], settings.redelivery_tick_ms)
    drainer = Drainer(spark, settings, r)
    assert drainer.run_once(now) == 1
    recs = read(settings.kafka_bootstrap, retry_topic(TopicName.parse(topic), "sub"), 1)
    assert len(recs) == 1
    x = recs[0]
    assert (x.value, x.key) == (b"immediate", b"kk")
    assert x.header("dwell-redelivery-count") == "3"
    assert x.header("dwell-subscription") == "sub"
    assert x.header("dwell-message-id") == mid
    assert sidx.buckets() == []


def test_a_redelivery_waits_until_the_backoff_has_read_past_its_due_time(
        spark_env, unique: str, caplog: pytest.LogCaptureFixture) -> None:
    """An ack may sit unread on dwell.acks while the backoff is behind: the drain leaves a
    due redelivery until the backoff (its IndexKeeper, on this Kafka and Redis) has read
    every event before its due time, and leaves all of them while it cannot tell how far
    that is (its Redis not answering), saying so once."""
    spark, settings, r = spark_env
    topic = f"persistent://{unique}/ns/x"
    t = TopicName.parse(topic)
    kafka.ensure_topic(settings.kafka_bootstrap, t.kafka_topic, 1)
    kafka.ensure_dwell_topics(settings.kafka_bootstrap)
    p = kafka.Producer(settings.kafka_bootstrap)
    part, off = p.send(t.kafka_topic, b"late", headers={"dwell-topic": topic}).result(10)
    # Two events on one dwell.acks partition (one key): the backoff applies the first
    # and has not read the second.
    before = kafka.end_offsets(settings.kafka_bootstrap, names.ACKS)
    send_warm_up(p)
    send_warm_up(p)
    p.close()
    ends = kafka.end_offsets(settings.kafka_bootstrap, names.ACKS)
    [behind] = [q for q, end in ends.items() if end == before.get(q, 0) + 2]
    first = next(kafka.iter_from(settings.kafka_bootstrap, names.ACKS,
                                 {q: end - 2 if q == behind else end
                                  for q, end in ends.items()}))
    r.hset(keys.BACKOFF_APPLIED, mapping={str(q): end for q, end in ends.items()})
    r.hset(keys.BACKOFF_APPLIED, str(behind), first.offset)
    work = Pass.of(settings)
    summary = work.run({"partition": [behind], "offset": [first.offset],
                        "ts": [first.timestamp_ms], "tsType": [int(first.log_append_time)],
                        "key": [first.key], "value": [first.value], "auths": [[]]})
    keeper = IndexKeeper(settings, r, work, lambda: None)
    keeper.saw([Row(**summary)])
    tick = settings.redelivery_tick_ms
    due = summary["last_ts"] + 1  # after the last event the backoff applied
    SubscriptionIndex(r, topic, "sub").add([(t.kafka_topic, part, off, due)], tick)
    now = due + 2 * tick
    drainer = Drainer(spark, settings, r, keeper.read_to)
    assert drainer.run_once(now) == 0
    dead = redislib.Redis(port=free_port(), socket_connect_timeout=0.2)
    drainer.acks_read_to = IndexKeeper(settings, dead, Pass.of(settings), lambda: None).read_to
    with caplog.at_level(logging.INFO, logger="dwell.spark.drain"):
        assert drainer.run_once(now) == 0
        assert drainer.run_once(now) == 0
        assert len([m for m in caplog.messages if m.startswith("redeliveries wait")]) == 1
    r.hset(keys.BACKOFF_APPLIED, str(behind), ends[behind])  # the backoff caught up
    drainer.acks_read_to = keeper.read_to
    time.sleep(max(0.0, now / 1000 - time.time()))  # read_to is now: past the due bucket
    with caplog.at_level(logging.INFO, logger="dwell.spark.drain"):
        assert drainer.run_once(now) == 1
    assert ("redeliveries go again: how far the backoff has read is known"
            in caplog.messages)
    [x] = read(settings.kafka_bootstrap, retry_topic(t, "sub"), 1)
    assert x.value == b"late"


def test_a_redelivery_bucket_emptied_by_acks_drains_with_the_rest(spark_env,
                                                                 unique: str) -> None:
    """Acks leave a bucket's field empty (the entry is removed, the field stays): the
    round still drains the other entries of the bucket and completes it."""
    spark, settings, r = spark_env
    topic = f"persistent://{unique}/ns/x"
    t = TopicName.parse(topic)
    kafka.ensure_topic(settings.kafka_bootstrap, t.kafka_topic, 2)
    p = kafka.Producer(settings.kafka_bootstrap)
    kept = p.send(t.kafka_topic, b"kept", partition=0, headers={"dwell-topic": topic}).result(10)
    acked = p.send(t.kafka_topic, b"acked", partition=1, headers={"dwell-topic": topic}).result(10)
    p.close()
    now = int(time.time() * 1000)
    due = now - 500
    sidx = SubscriptionIndex(r, topic, "sub")
    sidx.add([(t.kafka_topic, *kept, due), (t.kafka_topic, *acked, due)],
             settings.redelivery_tick_ms)
    assert sidx.remove_many(due - due % settings.redelivery_tick_ms,
                            [(t.kafka_topic, *acked)]) == 1
    assert Drainer(spark, settings, r).run_once(now) == 1
    [x] = read(settings.kafka_bootstrap, retry_topic(t, "sub"), 1)
    assert x.value == b"kept"
    assert sidx.buckets() == []


@pytest.mark.parametrize("local_max", [0, 2000], ids=["spark-job", "driver"])
def test_dead_letters_in_a_redelivery_bucket_go_to_the_dlq(spark_env, unique: str,
                                                            local_max: int) -> None:
    """The backoff writes an unacked message past maxRedeliverCount into the index with
    its count stored as -(count + 1): the drain sends it to the DLQ with that count,
    the bucket's other entries to the retry topic, and forgets the dead letters' counts."""
    spark, settings, r = spark_env
    settings = settings.model_copy(update={"drain_local_max_records": local_max})
    topic = f"persistent://{unique}/ns/x"
    t = TopicName.parse(topic)
    kafka.ensure_topic(settings.kafka_bootstrap, t.kafka_topic, 1)
    p = kafka.Producer(settings.kafka_bootstrap)
    sent = [p.send(t.kafka_topic, f"m{i}".encode(), headers={"dwell-topic": topic}).result(10)
            for i in range(4)]
    p.close()
    mids = [format_message_id(t.kafka_topic, part, off) for part, off in sent]
    # m0 and m3 are redeliveries 1 and 2; m1 and m2 dead letters after 3 and 0 redeliveries.
    r.hset(keys.sub_counts(topic, "sub"), mapping={mids[0]: 1, mids[1]: -4, mids[2]: -1,
                                                   mids[3]: 2})
    now = int(time.time() * 1000)
    sidx = SubscriptionIndex(r, topic, "sub")
    sidx.add([(t.kafka_topic, part, off, now - 500) for part, off in sent],
             settings.redelivery_tick_ms)
    assert Drainer(spark, settings, r).run_once(now) == 4
    retry = read(settings.kafka_bootstrap, retry_topic(t, "sub"), 2)
    dead = read(settings.kafka_bootstrap, dlq_topic(t, "sub"), 2)
    assert sorted((x.value, x.header("dwell-redelivery-count")) for x in retry) == [
        (b"m0", "1"), (b"m3", "2")]
    assert sorted((x.value, x.header("dwell-redelivery-count")) for x in dead) == [
        (b"m1", "3"), (b"m2", "0")]
    assert {x.header("dwell-message-id") for x in dead} == {mids[1], mids[2]}
    assert sidx.buckets() == []
    # Redeliveries keep their counts until acked; dead letters' are gone.
    assert r.hmget(keys.sub_counts(topic, "sub"), mids) == [b"1", None, None, b"2"]


def test_bulk_producer_writes_everything_and_flush_raises_on_a_rejected_record(
        kafka_bootstrap: str, unique: str) -> None:
    """The drain's writer reports no delivered record, so a failed one must surface in
    flush: here the broker refuses records over the topic's max.message.bytes."""
    small = f"bulk-small-{unique}"
    kafka.ensure_topic(kafka_bootstrap, small, 1, config={"max.message.bytes": "2000"})
    # Batches under the topic's limit (records are uncompressed by default), so that
    # only the oversized record is refused.
    p = kafka.BulkProducer(kafka_bootstrap, **{"message.timeout.ms": 10000,
                                               "batch.size": 1500})
    try:
        p.send_unreported([(small, b"x" * 100, None, [("h", b"1")], None)] * 50)
        p.flush(15)
        assert sum(kafka.end_offsets(kafka_bootstrap, small).values()) == 50
        p.send_unreported([(small, b"x" * 100, None, None, None),
                           (small, os.urandom(5000), None, None, None)])
        with pytest.raises(kafka.KafkaUnavailable, match="records not written.*too large"):
            p.flush(15)
        p.send_unreported([(small, b"z", None, None, None)])
        p.flush(15)  # the failure was reported once, by the flush that covered it
    finally:
        p.close(1.0)


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_topics_interleaved_on_one_partition_each_get_only_their_records(
        spark_env, unique: str, path: str) -> None:
    """Two topics' records alternate on one partition of dwell.delayed, so each topic's
    bucket is a scattered span (a Range carrying its offsets): every path copies exactly
    the indexed offsets of each topic to that topic's ready topic."""
    spark, settings, r = spark_env
    topics = [f"persistent://{unique}/ns/a-{path}", f"persistent://{unique}/ns/b-{path}"]
    for t in topics:
        kafka.ensure_topic(settings.kafka_bootstrap, TopicName.parse(t).kafka_topic, 1)
    p = kafka.Producer(settings.kafka_bootstrap)
    now = int(time.time() * 1000)
    futs = [(i, p.send(names.DELAYED, f"{i}".encode(), key=topics[i % 2], partition=0, headers={
        "dwell-topic": topics[i % 2], "dwell-deliver-at": str(now - 10),
        "dwell-tick-time": "1000"})) for i in range(40)]
    p.flush()
    p.close()
    for k, t in enumerate(topics):
        TopicIndex(r, t).add([(*f.result(10), now - 10, 1000) for i, f in futs if i % 2 == k])
    assert Drainer(spark, settings, r).run_once(now, path=path) == 40
    for k, t in enumerate(topics):
        recs = read(settings.kafka_bootstrap, TopicName.parse(t).kafka_topic, 20)
        assert sorted(int(x.value) for x in recs) == list(range(k, 40, 2))
        assert {x.header("dwell-topic") for x in recs} == {t}


def _metric(name: str, **labels: str) -> float:
    from dwell_spark import metrics
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return value or 0.0


def test_a_topic_that_cannot_be_delivered_holds_no_other_back(spark_env,
                                                               unique: str) -> None:
    """The ready topic of one Pulsar topic refuses its records (its max.message.bytes is
    below their size, as an operator might set it): the other topic of the same rounds is
    delivered all the same, the failing one is retried alone with a growing wait and
    counted, and delivered in full once its ready topic takes the records."""
    spark, settings, r = spark_env
    settings = settings.model_copy(update={"drain_lease_ms": 1000})
    bad, good = f"persistent://{unique}/ns/bad", f"persistent://{unique}/ns/good"
    bad_ready = TopicName.parse(bad).kafka_topic
    kafka.ensure_topic(settings.kafka_bootstrap, bad_ready, 1,
                       config={"max.message.bytes": "2000"})
    kafka.ensure_topic(settings.kafka_bootstrap, TopicName.parse(good).kafka_topic, 1)
    p = kafka.Producer(settings.kafka_bootstrap)
    now = int(time.time() * 1000)

    def publish(topic: str, n: int, size: int, at: int) -> None:
        sent = [delayed_record(p, topic, os.urandom(size), None, at) for _ in range(n)]
        TopicIndex(r, topic).add([(part, off, at, 1000) for part, off in sent])

    publish(bad, 3, 5000, now - 10)
    publish(good, 4, 10, now - 10)
    drainer = Drainer(spark, settings, r)

    def took_ms(started: float) -> int:
        return int((time.monotonic() - started) * 1000)

    # A round renews its leases on the real clock while it runs (every third of a lease),
    # so its claims come back one lease after the round's real time: each call below
    # that needs them back adds the time the round before it took.
    started = time.monotonic()
    # Both topics in one copy: it fails, and each topic is tried alone from then on.
    with pytest.raises(kafka.KafkaUnavailable, match="too large"):
        drainer.run_once(now)
    assert set(drainer.failing) == {bad, good}
    # After the lease: the good topic is delivered, the bad one fails alone.
    t1 = now + took_ms(started) + 1100
    started = time.monotonic()
    assert drainer.run_once(t1) == 4
    spent = took_ms(started)
    assert set(drainer.failing) == {bad}
    assert drainer.failing[bad].retry_at_ms == t1 + 1000
    assert _metric("dwell_drain_failing_topics") == 1
    assert _metric("dwell_drain_topic_failures_total", topic=bad) == 2
    # While the bad topic waits, the good one's new messages go out at once.
    publish(good, 2, 10, t1 + 400)
    assert drainer.run_once(t1 + 900) == 2
    # Its wait doubles with each failure in a row.
    t2 = t1 + spent + 1100
    with pytest.raises(kafka.KafkaUnavailable, match="too large"):
        drainer.run_once(t2)  # the only topic due: the round fails
    assert drainer.failing[bad].rounds == 3
    assert drainer.failing[bad].retry_at_ms == t2 + 2000
    # The operator raises the limit: the topic is delivered in full and failing no more.
    configure_topic(settings.kafka_bootstrap, bad_ready, {"max.message.bytes": str(1 << 20)})
    p.close()
    deadline = time.monotonic() + 30
    delivered = 0
    at = t2
    while not delivered and time.monotonic() < deadline:
        at += 4000
        with contextlib.suppress(kafka.KafkaUnavailable):  # the new limit a moment later
            delivered = drainer.run_once(at)
    assert delivered == 3
    assert drainer.failing == {} and _metric("dwell_drain_failing_topics") == 0
    assert len(read(settings.kafka_bootstrap, bad_ready, 3)) == 3
    good_recs = read(settings.kafka_bootstrap, TopicName.parse(good).kafka_topic, 6)
    assert len({x.header("dwell-message-id") for x in good_recs}) == 6


SLOW_SEND_S = 0.25


@pytest.fixture()
def slow_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow Kafka: every batch the drain hands its producers waits SLOW_SEND_S before it
    goes (to the real broker), and the copy hands them 200 records at a time, so a round
    of a few thousand records runs for several seconds."""
    from dwell_spark import records

    send = kafka.BulkProducer.send_unreported

    def slow(self, out, *args, **kw):
        time.sleep(SLOW_SEND_S)
        return send(self, out, *args, **kw)

    monkeypatch.setattr(kafka.BulkProducer, "send_unreported", slow)
    monkeypatch.setattr(records, "SEND_CHUNK", 200)


def _due_bucket(settings: SparkSettings, r, topic: str, n: int) -> list[str]:
    """``n`` records of ``topic`` due now, indexed in one bucket; their message ids."""
    p = kafka.Producer(settings.kafka_bootstrap, linger_ms=20)
    at = int(time.time() * 1000) - 10
    futs = [p.send(names.DELAYED, b"%d" % i, key=topic, partition=0, headers={
        "dwell-topic": topic, "dwell-deliver-at": str(at), "dwell-tick-time": "1000"})
        for i in range(n)]
    p.flush()
    p.close()
    sent = [f.result(10) for f in futs]
    TopicIndex(r, topic).add([(part, off, at, 1000) for part, off in sent])
    return [format_message_id(names.DELAYED, part, off) for part, off in sent]


@contextlib.contextmanager
def _rival(spark, settings: SparkSettings, r, topic: str) -> Iterator[list[int]]:
    """A second drainer (another drain app) running rounds back to back once ``topic``'s
    bucket is claimed; yields what each of its rounds wrote."""
    rival, stop, written = Drainer(spark, settings, r), threading.Event(), []
    claims = TopicIndex(r, topic).keys.claims

    def run() -> None:
        while not r.zcard(claims) and not stop.wait(0.005):
            pass
        while not stop.is_set():
            with contextlib.suppress(Exception):
                written.append(rival.run_once(path="driver"))
            stop.wait(0.05)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield written
    finally:
        stop.set()
        t.join(60)


def _copies(settings: SparkSettings, topic: str) -> dict[str, int]:
    """message id → how many times it is on the topic's ready topic."""
    ready = TopicName.parse(topic).kafka_topic
    return dict(Counter(x.header("dwell-message-id")
                        for x in kafka.read_all(settings.kafka_bootstrap, ready)))


def test_a_round_longer_than_its_lease_delivers_each_record_once(
        spark_env, unique: str, slow_kafka: None) -> None:
    """A round that takes several leases (a slow Kafka) while another drainer claims every
    50 ms: its leases are renewed, so the other drainer never takes its bucket and each
    record reaches the ready topic once. Without renewal the other drainer claims the
    bucket again once the lease is over and copies it a second time."""
    spark, settings, r = spark_env
    settings = settings.model_copy(update={"drain_lease_ms": 1000})
    topic = f"persistent://{unique}/ns/slow"
    kafka.ensure_topic(settings.kafka_bootstrap, TopicName.parse(topic).kafka_topic, 1)
    n = 3000
    ids = _due_bucket(settings, r, topic, n)
    renewed = _metric("dwell_drain_lease_renewals_total")
    drainer = Drainer(spark, settings, r)
    with _rival(spark, settings, r, topic) as rival:
        t0 = time.monotonic()
        assert drainer.run_once(path="driver") == n
        took = time.monotonic() - t0
    assert took > 3 * settings.drain_lease_ms / 1000, f"the round took only {took:.1f}s"
    assert sum(rival) == 0
    copies = _copies(settings, topic)
    assert sorted(copies) == sorted(ids)
    assert {k: v for k, v in copies.items() if v != 1} == {}
    assert TopicIndex(r, topic).buckets() == [] and not r.zcard(TopicIndex(r, topic).keys.claims)
    assert _metric("dwell_drain_lease_renewals_total") - renewed >= 3
    print(f"drain round of {n} records over {took:.1f}s with a 1 s lease: each copied once")


def test_a_round_that_lost_its_lease_stops_writing_the_bucket(
        spark_env, unique: str, slow_kafka: None) -> None:
    """Another drainer holds the bucket now (its lease id replaced ours, as claim-6.lua
    leaves it after a lease ran out): the round's next renewal finds out, the copy stops
    writing the bucket's records, and the round neither marks nor completes it."""
    spark, settings, r = spark_env
    settings = settings.model_copy(update={"drain_lease_ms": 1000})
    topic = f"persistent://{unique}/ns/lost"
    kafka.ensure_topic(settings.kafka_bootstrap, TopicName.parse(topic).kafka_topic, 1)
    n = 3000
    _due_bucket(settings, r, topic, n)
    idx = TopicIndex(r, topic)
    lost = _metric("dwell_drain_leases_lost_total")

    def take_over() -> None:
        wait_claimed = time.monotonic() + 10
        while not r.hlen(idx.keys.leases) and time.monotonic() < wait_claimed:
            time.sleep(0.01)
        time.sleep(0.5)
        for b in r.hkeys(idx.keys.leases):
            r.hset(idx.keys.leases, b, "another-drainer")

    t = threading.Thread(target=take_over, daemon=True)
    t.start()
    written = Drainer(spark, settings, r).run_once(path="driver")
    t.join(10)
    assert 0 < written < n / 2, written
    assert sum(_copies(settings, topic).values()) == written
    assert _metric("dwell_drain_leases_lost_total") - lost == 1
    # Still the other drainer's: claimed, not completed.
    [b] = r.hkeys(idx.keys.leases)
    assert r.hget(idx.keys.leases, b) == b"another-drainer"
    assert r.zcard(idx.keys.claims) == 1
    assert idx.complete(int(b), "another-drainer")  # done with, for the next tests


def test_a_round_past_its_maximum_time_fails_into_its_lease(
        spark_env, unique: str, slow_kafka: None) -> None:
    """Renewal ends at drain_max_round_ms: the round fails there, and its claims are back
    one lease later, for a next round to deliver in full."""
    spark, settings, r = spark_env
    settings = settings.model_copy(update={"drain_lease_ms": 1000,
                                           "drain_max_round_ms": 1500})
    topic = f"persistent://{unique}/ns/long"
    kafka.ensure_topic(settings.kafka_bootstrap, TopicName.parse(topic).kafka_topic, 1)
    n = 3000
    ids = _due_bucket(settings, r, topic, n)
    drainer = Drainer(spark, settings, r)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="maximum time"):
        drainer.run_once(path="driver")
    took = time.monotonic() - t0
    assert 1.5 <= took < 1.5 + 2 * SLOW_SEND_S + 1, took
    idx = TopicIndex(r, topic)
    assert r.zcard(idx.keys.claims) == 1
    # Another drain app takes the bucket once the lease is over, and delivers it all.
    other = Drainer(spark, settings.model_copy(update={"drain_max_round_ms": 60_000}), r)
    got = wait_for(lambda: other.run_once(path="driver"), 5, "the claim back")
    assert got == n
    assert set(_copies(settings, topic)) == set(ids)


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_cancelled_messages_are_passed_over_originals_and_copies(
        spark_env, unique: str, path: str) -> None:
    """A message cancelled in the index (cancel-5.lua) is not delivered, whether its
    bucket holds the original or a re-filed copy (matched by its dwell-origin); the
    bucket's cancellations go once it is completed."""
    spark, settings, r = spark_env
    topic = f"persistent://{unique}/ns/x"
    ready = TopicName.parse(topic).kafka_topic
    kafka.ensure_topic(settings.kafka_bootstrap, ready, 2)
    kafka.ensure_topic(settings.kafka_bootstrap, names.REFILED, 4)
    p = kafka.Producer(settings.kafka_bootstrap)
    now = int(time.time() * 1000)
    due = now + 60_000
    plain = [delayed_record(p, topic, f"o{i}".encode(), None, due) for i in range(3)]
    originals = [delayed_record(p, topic, f"r{i}".encode(), None, due) for i in range(3)]
    copies = refiled_copies(p, topic, originals, due)
    p.close()
    idx = TopicIndex(r, topic)
    idx.add([(part, off, due, 1000) for part, off in plain]
            + [(index_field(part, True), off, due, 1000) for part, off in copies])
    bucket = due - due % 1000
    for part, off in (plain[1], originals[1]):
        assert idx.cancel(part, off, bucket, now + 1) == 1
    assert idx.cancellations() == 2
    before = _metric("dwell_drain_cancelled_messages_total", topic=topic)
    assert Drainer(spark, settings, r).run_once(due + 1000, path=path) == 4
    # Asks for one more than written: a cancelled message that came out would be read.
    recs = sorted(x.value for x in read(settings.kafka_bootstrap, ready, 5, timeout=5))
    assert recs == [b"o0", b"o2", b"r0", b"r2"]
    assert idx.cancellations() == 0 and idx.buckets() == []
    assert _metric("dwell_drain_cancelled_messages_total", topic=topic) - before == 2
