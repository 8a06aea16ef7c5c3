"""Losing Redis under the tracker (real Redis, Kafka and tracker process): the index is
rebuilt from the delay log, starting at the low watermarks committed to Kafka and
skipping what `dwell.delivered` says was delivered. The tracker runs on a delay log and a
Redis database of its own; the test plays the drain through the index's own API (claim,
delivered mark, complete), as dwell_spark.drain does."""

from __future__ import annotations

import base64
import re
import time

import httpx
import orjson
import pytest
from pyroaring import BitMap64

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.adapters.kafka import Producer
from dwell.core import topics as names
from dwell.index.marks import cancel_mark_record, mark_record, read_marks, write_marks
from dwell.index.roaring import encode
from dwell.index.topic import TopicIndex
from dwell.tracker.recovery import committed_lowmarks
from dwell_dev.testkit import publish_delayed, redis_db_url, wait_for

pytestmark = pytest.mark.integration

DB = 12


def _env(stack, unique: str) -> dict[str, str]:
    return {"DWELL_REDIS_URL": redis_db_url(stack, DB),
            "DWELL_DELAYED_TOPIC": f"dwell.delayed.{unique}",
            "DWELL_TRACKER_GROUP_ID": f"dwell-trk-{unique}", "DWELL_RESTAGE_ENABLED": "false",
            "DWELL_LOWMARK_INTERVAL_MS": "300", "DWELL_REDIS_CHECK_INTERVAL_MS": "200"}


@pytest.fixture()
def tracker(services, stack, unique: str):  # type: ignore[no-untyped-def]
    env = _env(stack, unique)
    r = redis_adapter.connect(env["DWELL_REDIS_URL"])
    r.flushdb()
    svc = services.start("tracker", env=env)
    yield svc, r, env["DWELL_DELAYED_TOPIC"], env["DWELL_TRACKER_GROUP_ID"]
    svc.stop()


def _positions(r, topic: str) -> set[tuple[int, int]]:
    idx = TopicIndex(r, topic)
    out = set()
    for b in idx.buckets():
        for f, bm in idx.read_bucket(b).items():
            out |= {(int(f), int(o)) for o in bm}
    return out


def _drain_due(r, bootstrap: str, log: str, topic: str, now: int) -> set[tuple[int, int]]:
    """What dwell_spark.drain does with a due bucket, minus the copy."""
    idx = TopicIndex(r, topic)
    claims = idx.claim(now, 1000, 30_000, strict=False)
    marks = kafka.BulkProducer(bootstrap)
    try:
        write_marks(marks, [mark_record(log, topic, b.bucket_start, b.positions)
                            for b in claims])
    finally:
        marks.close()
    for b in claims:
        assert idx.complete(b.bucket_start, b.lease_id)
    return {(int(f), int(o)) for b in claims for f, bm in b.positions.items() for o in bm}


def _rebuilds(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(v) for v in re.findall(
        r'^dwell_tracker_index_rebuilds_total\{[^}]*\} (\S+)$', text, re.M))


def test_flushed_index_is_rebuilt_without_what_was_delivered(tracker, kafka_bootstrap: str,
                                                            unique: str) -> None:
    svc, r, log, group = tracker
    topic = f"persistent://{unique}/ns/x"
    now = int(time.time() * 1000)
    # 500 already due (the test drains them), 1,500 due in one to two minutes.
    publish_delayed(kafka_bootstrap, log, topic,
             [now - 5000] * 500 + [now + 60_000 + i * 40 for i in range(1500)])
    wait_for(lambda: len(_positions(r, topic)) == 2000, 30, "2,000 positions indexed")
    delivered = _drain_due(r, kafka_bootstrap, log, topic, int(time.time() * 1000))
    assert len(delivered) == 500
    pending = _positions(r, topic)
    assert len(pending) == 1500
    # The low watermarks reach Kafka (the keeper's interval is 0.3 s here).
    # (One partition: the records share their key, the topic.)
    wait_for(lambda: committed_lowmarks(kafka_bootstrap, group, [(log, p) for p in range(4)]),
             30, "low watermarks committed")
    r.flushdb()
    wait_for(lambda: _positions(r, topic) == pending, 120,
             "the index rebuilt with exactly the pending positions")
    assert _rebuilds(svc.url) >= 1
    # Nothing delivered came back, and the ingest goes on: new records are indexed.
    publish_delayed(kafka_bootstrap, log, topic, [now + 200_000])
    wait_for(lambda: len(_positions(r, topic)) == 1501, 30, "a new record indexed")
    assert not (_positions(r, topic) & delivered)


def test_index_rolled_back_is_caught_up(tracker, kafka_bootstrap: str, unique: str) -> None:
    """Redis back without its last writes (an older AOF, a replica that missed them)."""
    svc, r, log, _ = tracker
    topic = f"persistent://{unique}/ns/y"
    now = int(time.time() * 1000)
    publish_delayed(kafka_bootstrap, log, topic, [now + 60_000 + i for i in range(300)])
    wait_for(lambda: len(_positions(r, topic)) == 300, 30, "300 positions indexed")
    snapshot = {k: r.dump(k) for k in r.keys("*")}
    publish_delayed(kafka_bootstrap, log, topic, [now + 90_000 + i for i in range(200)])
    wait_for(lambda: len(_positions(r, topic)) == 500, 30, "500 positions indexed")
    before = _positions(r, topic)
    # In one transaction: the tracker's check never sees Redis empty in between.
    pipe = r.pipeline(transaction=True)
    pipe.flushdb()
    for k, v in snapshot.items():
        pipe.restore(k, 0, v)
    pipe.execute()
    assert len(_positions(r, topic)) == 300
    wait_for(lambda: _positions(r, topic) == before, 120, "the lost 200 indexed again")
    assert _rebuilds(svc.url) >= 1


def test_index_lost_while_no_tracker_ran_is_rebuilt(tracker, kafka_bootstrap: str,
                                                    unique: str) -> None:
    """Redis loses the index while the tracker is down: the tracker that starts finds the
    group's committed offsets ahead of what Redis holds, and re-reads."""
    svc, r, log, group = tracker
    topic = f"persistent://{unique}/ns/z"
    now = int(time.time() * 1000)
    publish_delayed(kafka_bootstrap, log, topic,
             [now - 5000] * 100 + [now + 60_000 + i for i in range(400)])
    wait_for(lambda: len(_positions(r, topic)) == 500, 30, "500 positions indexed")
    delivered = _drain_due(r, kafka_bootstrap, log, topic, int(time.time() * 1000))
    pending = _positions(r, topic)
    assert len(delivered) == 100 and len(pending) == 400
    wait_for(lambda: committed_lowmarks(kafka_bootstrap, group, [(log, p) for p in range(4)]),
             30, "low watermarks committed")
    svc.stop()
    r.flushdb()
    svc.start()
    wait_for(lambda: _positions(r, topic) == pending, 120,
             "the index rebuilt with exactly the pending positions")
    assert _rebuilds(svc.url) >= 1


def test_index_lost_after_a_rebalance_is_rebuilt(tracker, services, stack,
                                                 kafka_bootstrap: str, unique: str) -> None:
    """A second replica joins the group (every partition is revoked and assigned again),
    then Redis loses the index: the owner of the topic's partition still knows what Redis
    must hold, from the offsets the group committed, and re-reads."""
    svc, r, log, _ = tracker
    topic = f"persistent://{unique}/ns/w"
    now = int(time.time() * 1000)
    publish_delayed(kafka_bootstrap, log, topic, [now + 60_000 + i for i in range(300)])
    wait_for(lambda: len(_positions(r, topic)) == 300, 30, "300 positions indexed")
    before = _rebuilds(svc.url)
    second = services.start("tracker", env=_env(stack, unique))
    try:
        # The rebalance is over once every partition's ingested entry is checked: give
        # both replicas a few check intervals.
        time.sleep(5)
        pending = _positions(r, topic)
        r.flushdb()
        wait_for(lambda: _positions(r, topic) == pending, 120,
                 "the index rebuilt with exactly the pending positions")
        assert _rebuilds(svc.url) + _rebuilds(second.url) > before
    finally:
        second.stop()


def test_a_flush_with_nothing_pending_re_reads_nothing(tracker, kafka_bootstrap: str,
                                                      unique: str) -> None:
    """Everything indexed was delivered and the low watermarks reached the end: Redis
    losing the index loses nothing pending. The tracker sets its ingested entries again
    without reading dwell.delivered or the delay log, and counts no rebuild."""
    svc, r, log, group = tracker
    topic = f"persistent://{unique}/ns/v"
    now = int(time.time() * 1000)
    publish_delayed(kafka_bootstrap, log, topic, [now - 5000] * 200)
    wait_for(lambda: len(_positions(r, topic)) == 200, 30, "200 positions indexed")
    assert len(_drain_due(r, kafka_bootstrap, log, topic, int(time.time() * 1000))) == 200
    ends = kafka.end_offsets(kafka_bootstrap, log)
    ingested = {int(f): int(o) for f, o in r.hgetall(keys.INGESTED).items()}
    assert ingested and all(ingested[p] == ends[p] for p in ingested)

    def lowmarks_at_the_end() -> bool:
        got = committed_lowmarks(kafka_bootstrap, group, [(log, p) for p in ingested])
        return all(got.get((log, p)) == ends[p] for p in ingested)

    wait_for(lowmarks_at_the_end, 30, "low watermarks committed at the end")
    before = _rebuilds(svc.url)
    r.flushdb()
    wait_for(lambda: {int(f): int(o) for f, o in r.hgetall(keys.INGESTED).items()}
             == ingested, 30, "the ingested entries set again")
    time.sleep(1)  # a few more of the tracker's checks (every 0.2 s here)
    assert _rebuilds(svc.url) == before
    assert _positions(r, topic) == set()
    # The ingest goes on.
    publish_delayed(kafka_bootstrap, log, topic, [now + 200_000])
    wait_for(lambda: len(_positions(r, topic)) == 1, 30, "a new record indexed")


def test_marks_that_are_not_bitmaps_are_skipped(kafka_bootstrap: str, unique: str) -> None:
    """A forged or damaged dwell.delivered record whose bitmap pyroaring cannot read (an
    empty blob raises IndexError, garbage ValueError) is skipped whole, cancel marks too:
    a rebuild reading the topic does not stop on it."""
    log_topic = f"test.delayed.{unique}"
    topic = f"persistent://{unique}/ns/x"
    good = mark_record(log_topic, topic, 1000, {0: BitMap64([1, 2])})
    cancel = cancel_mark_record(log_topic, topic, 2000, 1, 7)
    bad = [orjson.dumps({"log": log_topic, "bucket": 1, "fields": {"0": blob}})
           for blob in ("", base64.b64encode(b"garbage").decode())]
    bad.append(orjson.dumps({"log": log_topic, "bucket": 1, "cancelled": True,
                             "fields": {"1": "", "0": base64.b64encode(
                                 encode(BitMap64([9]))).decode()}}))
    p = Producer(kafka_bootstrap, linger_ms=0)
    for value in bad:
        p.send(names.DELIVERED, value, topic).result(10)
    for _, value, key, _, _ in (good, cancel):
        p.send(names.DELIVERED, value, key).result(10)
    p.close()
    cancels: list[tuple[str, int, bytes]] = []
    marks = read_marks(kafka_bootstrap, log_topic, timeout_s=30, cancels=cancels)
    assert {f: sorted(bm) for f, bm in marks.items()} == {0: [1, 2], 1: [7]}
    assert cancels == [(topic, 2000, b"1:7")]
