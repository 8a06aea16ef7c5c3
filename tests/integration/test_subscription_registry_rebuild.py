"""Losing Redis under the tracker's subscription registry (real Redis, Kafka and tracker
process): every registration is on the compacted `dwell.subscriptions` before it is
answered, and the registry in Redis is rebuilt from it after a FLUSHDB, after a write that
came in between, and after a rollback (a replica that missed writes). The tracker runs on
a Redis database of its own."""

from __future__ import annotations

import json

import httpx
import pytest

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics
from dwell.tracker.registry import record_key
from dwell_dev.testkit import redis_db_url, wait_for

pytestmark = pytest.mark.integration

DB = 9
NACK = {"minDelayMs": 1000, "maxDelayMs": 60000, "multiplier": 2.0}
ACK_BACKOFF = {"minDelayMs": 500, "maxDelayMs": 4000, "multiplier": 3.0}


@pytest.fixture()
def tracker(services, stack, unique: str):  # type: ignore[no-untyped-def]
    url = redis_db_url(stack, DB)
    r = redis_adapter.connect(url)
    r.flushdb()
    svc = services.start("tracker", env={
        "DWELL_REDIS_URL": url, "DWELL_DELAYED_TOPIC": f"dwell.delayed.{unique}",
        "DWELL_TRACKER_GROUP_ID": f"dwell-trk-{unique}", "DWELL_RESTAGE_ENABLED": "false",
        "DWELL_REDIS_CHECK_INTERVAL_MS": "200"})
    yield svc, r
    svc.stop()


def _rebuilds(http: httpx.Client, reason: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("dwell_tracker_subscription_registry_rebuilds_total{"
                           f'reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_registry_is_rebuilt_from_kafka_after_redis_loses_it(tracker, stack,
                                                            unique: str) -> None:
    svc, r = tracker
    topic = f"persistent://{unique}/ns/orders"
    base = f"/v1/topics/persistent/{unique}/ns/orders/subscriptions"
    first = {"ackTimeoutMs": 2000, "ackTimeoutRedeliveryBackoff": ACK_BACKOFF,
             "negativeAckRedeliveryBackoff": NACK, "maxRedeliverCount": 4}
    second = {"ackTimeoutMs": 0, "negativeAckRedeliveryBackoff": NACK}
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        assert http.put(f"{base}/s1", json=first).status_code == 200
        assert http.put(f"{base}/gone", json=second).status_code == 200
        assert http.delete(f"{base}/gone").status_code == 204
        assert http.put(f"{base}/s3", json=first).status_code == 200
        assert http.put(f"{base}/s3", json=second).status_code == 200
        before = {s: http.get(f"{base}/{s}") for s in ("s1", "gone", "s3")}
        assert [a.status_code for a in before.values()] == [200, 404, 200]

        # Kafka holds each change once it is answered: the last record per key wins.
        latest = {rec.key: rec.value for rec in kafka.read_all(stack.kafka_bootstrap,
                                                                topics.SUBSCRIPTIONS)}
        assert json.loads(latest[record_key(topic, "s1")]) == before["s1"].json()
        assert latest[record_key(topic, "gone")] is None

        lost = _rebuilds(http, "lost")
        r.flushdb()
        # The interval check puts it back without any call (the backoff job reads Redis).
        wait_for(lambda: r.hget(keys.subscriptions(topic), "s1") is not None, 10,
                 "registry rebuilt by the interval check")
        assert _rebuilds(http, "lost") == lost + 1
        after = {s: http.get(f"{base}/{s}") for s in ("s1", "gone", "s3")}
        assert [(a.status_code, a.json()) for a in after.values()] == [
            (b.status_code, b.json()) for b in before.values()]
        assert after["s1"].json()["maxRedeliverCount"] == 4
        stats = http.get(f"/v1/topics/persistent/{unique}/ns/orders/stats").json()
        assert sorted(stats["subscriptions"]) == ["s1", "s3"]


def test_a_write_after_the_loss_does_not_hide_it(tracker, unique: str) -> None:
    svc, r = tracker
    base = f"/v1/topics/persistent/{unique}/ns/orders/subscriptions"
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        assert http.put(f"{base}/s1", json={"ackTimeoutMs": 1500}).status_code == 200
        # A write right after the loss (most often before the interval check sees it)
        # must not make Redis look whole.
        r.flushdb()
        assert http.put(f"{base}/late", json={"ackTimeoutMs": 3000}).status_code == 200
        assert http.get(f"{base}/s1").json()["ackTimeoutMs"] == 1500
        assert http.get(f"{base}/late").json()["ackTimeoutMs"] == 3000


def test_a_rolled_back_registry_is_rebuilt(tracker, unique: str) -> None:
    svc, r = tracker
    topic = f"persistent://{unique}/ns/orders"
    base = f"/v1/topics/persistent/{unique}/ns/orders/subscriptions"
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        assert http.put(f"{base}/old", json={"ackTimeoutMs": 1500}).status_code == 200
        marker = int(r.get(keys.SUBSCRIPTIONS_APPLIED))
        assert http.put(f"{base}/new", json={"ackTimeoutMs": 2500}).status_code == 200
        stale = _rebuilds(http, "stale")
        # What a replica that missed the last write looks like: the write and the marker
        # it moved are both gone, the rest is there.
        pipe = r.pipeline(transaction=True)
        pipe.hdel(keys.subscriptions(topic), "new")
        pipe.set(keys.SUBSCRIPTIONS_APPLIED, marker)
        pipe.execute()
        got = http.get(f"{base}/new")
        assert (got.status_code, got.json()["ackTimeoutMs"]) == (200, 2500)
        assert _rebuilds(http, "stale") == stale + 1
