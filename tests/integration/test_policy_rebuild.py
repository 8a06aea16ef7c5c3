"""Losing Redis under the policy service (real Redis, Kafka and service): the store is
rebuilt from `dwell.policies`, so every GET answers what it answered before the loss, and
versions keep increasing past the feed's. The service runs on a Redis database of its own,
which the tests empty (FLUSHDB) or roll back without touching other suites' data."""

from __future__ import annotations

import time

import httpx
import pytest

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell_dev.testkit import redis_db_url

pytestmark = pytest.mark.integration

DB = 13


@pytest.fixture(scope="module")
def policy(services, stack):  # type: ignore[no-untyped-def]
    url = redis_db_url(stack, DB)
    redis_adapter.connect(url).flushdb()
    svc = services.start("policy", env={"DWELL_REDIS_URL": url,
                                        "DWELL_STORE_CHECK_INTERVAL_MS": "200"})
    yield svc, redis_adapter.connect(url)
    svc.stop()


def _fill(http: httpx.Client, tenant: str) -> list[str]:
    """A tenant with two namespaces, policies at both levels; the GET paths to compare."""
    assert http.put(f"/admin/v2/tenants/{tenant}",
                    json={"adminRoles": ["ops"], "allowedClusters": []}).status_code == 204
    for ns in ("a", "b"):
        assert http.put(f"/admin/v2/namespaces/{tenant}/{ns}").status_code == 204
    assert http.post(f"/admin/v2/namespaces/{tenant}/a/delayedDelivery",
                     json={"active": True, "maxDeliveryDelayInMillis": 5000}).status_code == 204
    for topic in ("a/x", "b/gone"):
        assert http.put(f"/admin/v2/persistent/{tenant}/{topic}").status_code == 204
    assert http.post(f"/admin/v2/persistent/{tenant}/a/x/delayedDelivery",
                     json={"tickTime": 100}).status_code == 204
    # Removed ones stay removed: a tombstone on the feed.
    assert http.post(f"/admin/v2/persistent/{tenant}/b/gone/delayedDelivery",
                     json={"tickTime": 7}).status_code == 204
    assert http.delete(f"/admin/v2/persistent/{tenant}/b/gone/delayedDelivery"
                       ).status_code == 204
    # Permissions live in the namespace's record: granted, and granted then revoked.
    assert http.post(f"/admin/v2/namespaces/{tenant}/a/permissions/app",
                     json=["produce", "consume"]).status_code == 204
    assert http.post(f"/admin/v2/namespaces/{tenant}/b/permissions/old",
                     json=["consume"]).status_code == 204
    assert http.delete(f"/admin/v2/namespaces/{tenant}/b/permissions/old").status_code == 204
    return [f"/admin/v2/namespaces/{tenant}/a/permissions",
            f"/admin/v2/namespaces/{tenant}/b/permissions",
            "/admin/v2/tenants", f"/admin/v2/tenants/{tenant}", f"/admin/v2/namespaces/{tenant}",
            f"/admin/v2/namespaces/{tenant}/a/delayedDelivery",
            f"/admin/v2/namespaces/{tenant}/b/delayedDelivery",
            f"/admin/v2/persistent/{tenant}/a/x/delayedDelivery",
            f"/admin/v2/persistent/{tenant}/a/x/delayedDelivery?applied=true",
            f"/admin/v2/persistent/{tenant}/b/gone/delayedDelivery"]


def _answers(http: httpx.Client, paths: list[str]) -> list[tuple[int, object]]:
    return [(r.status_code, r.json()) for r in (http.get(p) for p in paths)]


def test_flushed_store_answers_as_before(policy, unique: str) -> None:
    svc, r = policy
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        paths = _fill(http, unique)
        before = _answers(http, paths)
        version = int(r.get(keys.POLICY_VERSION))
        r.flushdb()
        # The very next calls (no wait) see everything: they wait for the rebuild.
        assert _answers(http, paths) == before
        assert r.exists(keys.POLICY_EPOCH)
        # A change after the rebuild gets a higher version than any before the loss.
        assert http.put(f"/admin/v2/namespaces/{unique}/c").status_code == 204
        assert int(r.get(keys.POLICY_VERSION)) > version
        metrics = http.get("/metrics").text
        assert 'dwell_policy_store_rebuilds_total{reason="lost"}' in metrics


def test_flushed_store_is_rebuilt_without_a_call(policy, unique: str) -> None:
    svc, r = policy
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        _fill(http, unique)
    r.flushdb()
    deadline = time.monotonic() + 10
    while not r.exists(keys.tenant(unique)):
        assert time.monotonic() < deadline, "the store was not rebuilt by the check"
        time.sleep(0.05)


def test_store_rolled_back_is_caught_up(policy, unique: str) -> None:
    """A Redis that comes back without its last writes (a restart from an older AOF, a
    replica that missed them): the epoch is there, the counter is behind the feed."""
    svc, r = policy
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        paths = _fill(http, unique)
        snapshot = {k: r.dump(k) for k in r.keys("*")}
        assert http.post(f"/admin/v2/namespaces/{unique}/b/delayedDelivery",
                         json={"tickTime": 250}).status_code == 204
        assert http.delete(f"/admin/v2/namespaces/{unique}/a/delayedDelivery"
                           ).status_code == 204
        after = _answers(http, paths)
        # In one transaction: the service's check never sees the store empty in between.
        pipe = r.pipeline(transaction=True)
        pipe.flushdb()
        for k, v in snapshot.items():
            pipe.restore(k, 0, v)
        pipe.execute()
        assert r.exists(keys.POLICY_EPOCH)
        assert _answers(http, paths) == after
        assert http.get(f"/admin/v2/namespaces/{unique}/b/delayedDelivery").json() == {
            "tickTime": 250}
        metrics = http.get("/metrics").text
        assert 'dwell_policy_store_rebuilds_total{reason="stale"}' in metrics


def test_a_partitioned_topic_of_one_partition_stays_one_after_a_flush(policy, unique: str
                                                                      ) -> None:
    """The mark that makes a one-partition ready topic a partitioned topic lives in the
    topic's record: rebuilt from `dwell.policies` with the rest."""
    svc, r = policy
    base = f"/admin/v2/persistent/{unique}/a"
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        assert http.put(f"/admin/v2/tenants/{unique}", json={}).status_code == 204
        assert http.put(f"/admin/v2/namespaces/{unique}/a").status_code == 204
        assert http.put(f"{base}/one/partitions", json=1).status_code == 204
        paths = [f"{base}/one/partitions", f"{base}/partitioned", base]
        before = _answers(http, paths)
        assert before == [(200, {"partitions": 1}), (200, [f"persistent://{unique}/a/one"]),
                          (200, [f"persistent://{unique}/a/one-partition-0"])]
        r.flushdb()
        assert _answers(http, paths) == before
        assert http.delete(f"{base}/one/partitions").status_code == 204
