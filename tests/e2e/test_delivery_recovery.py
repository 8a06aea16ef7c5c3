"""Delivery across a Spark driver crash, and strict mode. Runs after test_delivery.py's
timed scenarios (same package stack), one at a time: the crash stops the shared Spark app.

The app that replaces the killed one runs in strict mode, so the strict test after it
reuses it instead of paying for another Spark start (~30 s on this box); the crash
recovery does not depend on the mode (every bucket it picks up is overdue)."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import Any

import httpx

from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.client import Producer
from dwell.core.topics import TopicName
from dwell.index.topic import TopicIndex

from .conftest import (
    DRAIN_LEASE_MS,
    SPARK_MARGIN_MS,
    TICK_MS,
    Dwell,
    consumer,
    make_topic,
    now_ms,
    receive_all,
)

# Enough for a round that takes a while to write (the drain sends as it reads), so the
# kill lands after some copies are out and before the claim is completed.
CRASH_MESSAGES = 20000
PER_REQUEST = 1000  # admission's max_messages_per_request


def publish_batch(e2e: Dwell, topic: str, deliver_at: list[int]) -> list[str]:
    t = TopicName.parse(topic)
    ids: list[str] = []
    with httpx.Client(base_url=e2e.admission, timeout=30) as client:
        for i in range(0, len(deliver_at), PER_REQUEST):
            msgs = [{"payload": f"m{j}", "deliverAt": at}
                    for j, at in enumerate(deliver_at[i:i + PER_REQUEST], start=i)]
            r = client.post(f"/topics/{t.domain}/{t.tenant}/{t.namespace}/{t.local}",
                            json={"producerName": "crash", "messages": msgs})
            assert r.status_code == 200, r.text
            results = r.json()["messagePublishResults"]
            assert all(x.get("errorCode", 0) == 0 for x in results), results[:3]
            ids += [x["messageId"] for x in results]
    return ids


def test_spark_driver_killed_mid_drain_loses_and_shows_nothing_twice(
        e2e: Dwell, unique: str) -> None:
    topic = make_topic(e2e, unique)
    ready = TopicName.parse(topic).kafka_topic
    c = consumer(e2e, topic, "all")
    r = redis_adapter.connect(e2e.redis_url)
    claims_key = TopicIndex(r, topic).keys.claims
    # All due within 1.5 s, a few seconds out: published and indexed before the first is
    # due. From a tick boundary, so both buckets are large (2/3 and 1/3 of the messages).
    base = (now_ms() // TICK_MS + 6) * TICK_MS
    at = [base + i * 1500 // CRASH_MESSAGES for i in range(CRASH_MESSAGES)]
    ids = publish_batch(e2e, topic, at)
    assert len(set(ids)) == CRASH_MESSAGES and now_ms() < base, "publishing took too long"
    bucket_of = {mid: a - a % TICK_MS for mid, a in zip(ids, at, strict=True)}
    in_bucket = Counter(bucket_of.values())

    received: dict[str, int] = {}
    got: Counter[int] = Counter()  # messages received, by bucket
    repeats: list[str] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set() and len(received) < CRASH_MESSAGES:
            m = c.receive(0.1)
            if m is None:
                continue
            if m.message_id in received:
                repeats.append(m.message_id)
            else:
                got[bucket_of[m.message_id]] += 1
            received[m.message_id] = m.redelivery_count

    def half_written(buckets: list[int]) -> bool:
        """The application has some, not all, of a claimed bucket's copies."""
        return any(0 < got[b] < in_bucket[b] for b in buckets)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        # Kill the driver while it is writing a bucket: it holds the bucket's claim and
        # the application has already received some of its copies. The driver is frozen
        # as soon as it holds a claim, so what it holds is what it held when killed; the
        # copies it sent before the freeze reach the application meanwhile. A round
        # writes ~13,000 copies in ~0.4 s here, faster than a consumer sees them, so the
        # freeze comes first. If nothing of the bucket shows up, or all of it, the driver
        # runs on a little longer each time and we look again.
        deadline = time.monotonic() + 30
        looks = 0
        while True:
            looks += 1
            while not r.zcard(claims_key):
                assert time.monotonic() < deadline, "the drain never claimed a bucket"
                time.sleep(0.001)
            e2e.spark.freeze()
            claimed = [int(b) for b in r.zrange(claims_key, 0, -1)]
            seen = time.monotonic() + 3
            while claimed and not half_written(claimed) and time.monotonic() < seen:
                time.sleep(0.01)
            outstanding = len(claimed)
            if claimed and half_written(claimed):
                break
            e2e.spark.thaw()
            assert time.monotonic() < deadline, "no claimed bucket was ever half written"
            time.sleep(0.02 * looks)
        e2e.spark.kill()
        killed = time.monotonic()
        written_before = sum(kafka.end_offsets(e2e.bootstrap, ready).values())
        assert 0 < written_before <= CRASH_MESSAGES, written_before
        e2e.spark.start(strict=True)
        restarted = time.monotonic() - killed
        reader.join(timeout=DRAIN_LEASE_MS / 1000 + 60)
    finally:
        stop.set()
        reader.join(timeout=5)
        c.close()
    written_total = sum(kafka.end_offsets(e2e.bootstrap, ready).values())
    print(f"killed (look {looks}) with {outstanding} claims outstanding, {written_before} of "
          f"{CRASH_MESSAGES} records written; new app up {restarted:.1f}s later; ready "
          f"topic holds {written_total} records (re-emitted copies dropped by the SDK: "
          f"{written_total - CRASH_MESSAGES})")
    assert repeats == [], f"the application saw {len(repeats)} messages twice"
    missing = set(ids) - set(received)
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:3]}"
    assert set(received) == set(ids) and set(received.values()) == {0}
    # The claimed bucket was written again after the restart: the copies written before
    # the kill are in the topic twice, and the application saw each message once.
    assert written_total > CRASH_MESSAGES


def test_strict_mode_never_delivers_early(e2e: Dwell, unique: str) -> None:
    e2e.spark.ensure(strict=True)
    topic = make_topic(e2e, unique, admission=e2e.strict_admission)
    c = consumer(e2e, topic, "strict")
    ready = TopicName.parse(topic).kafka_topic
    try:
        now = now_ms()
        # Late in their buckets (bucket start + 900 ms), where flooring to the bucket would
        # deliver 900 ms early; and one closer than a tick, which non-strict admission
        # would deliver at once.
        targets = [now + 300] + [math.ceil((now + d) / TICK_MS) * TICK_MS + 900
                                 for d in (2000, 5000)]
        with Producer(topic, admission_url=e2e.strict_admission) as p:
            ids = {p.send(f"at-{t}".encode(), deliver_at=t): t for t in targets}
        got = receive_all({"strict": c}, len(ids), timeout=30)["strict"]
        for rec in got:
            c.acknowledge(rec.msg)
        assert c.receive(1.0) is None
    finally:
        c.close()
    assert sorted(rec.msg.message_id for rec in got) == sorted(ids)
    # When the drain wrote each copy (producer timestamp) and when the SDK had it.
    written: dict[str, Any] = {x.header("dwell-message-id"): x.timestamp_ms
                               for x in kafka.read_all(e2e.bootstrap, ready)}
    report = []
    for rec in got:
        m = rec.msg
        assert m.deliver_at == ids[m.message_id]
        early_write = written[m.message_id] - m.deliver_at
        assert written[m.message_id] >= m.deliver_at, f"written {-early_write} ms early"
        assert rec.after >= m.deliver_at
        # Strict waits for the bucket's end: up to a tick beyond Pulsar's bound's start.
        assert rec.before <= m.deliver_at + TICK_MS + 1000 + SPARK_MARGIN_MS, \
            rec.before - m.deliver_at
        report.append((m.deliver_at - now, early_write, rec.after - m.deliver_at))
    print("strict: (delay ms, written - deliverAt ms, received - deliverAt ms): "
          f"{sorted(report)}")
