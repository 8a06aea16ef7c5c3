"""`dwell.policies`, read back from the real Kafka: every change of the policy store in
order with increasing versions, tombstones after deletes, and the catch-up that publishes
what the service saved while Kafka was unreachable."""

from __future__ import annotations

import socket

import httpx
import orjson
import pytest

from dwell.adapters.kafka import Record, read_all
from dwell.core.topics import POLICIES


@pytest.fixture(scope="module")
def policy(services):  # type: ignore[no-untyped-def]
    svc = services.start("policy")
    yield svc
    svc.stop()


def _records(bootstrap: str, unique: str) -> list[Record]:
    return [r for r in read_all(bootstrap, POLICIES)
            if r.key is not None and unique.encode() in r.key]


def _version(r: Record) -> int:
    return int(r.header("dwell-version") or 0)


def test_each_change_in_order_then_tombstones(policy, kafka_bootstrap: str,  # type: ignore[no-untyped-def]
                                              unique: str) -> None:
    ns, topic = f"{unique}/ns", f"persistent://{unique}/ns/x"
    calls = [
        ("PUT", f"/admin/v2/tenants/{unique}", {"adminRoles": ["ops"]}),
        ("PUT", f"/admin/v2/namespaces/{ns}", None),
        ("POST", f"/admin/v2/namespaces/{ns}/delayedDelivery", {"maxDeliveryDelayInMillis": 5000}),
        ("PUT", f"/admin/v2/persistent/{ns}/x", None),
        ("POST", f"/admin/v2/persistent/{ns}/x/delayedDelivery", {"tickTime": 100}),
        ("POST", f"/admin/v2/persistent/{ns}/x/delayedDelivery?isGlobal=true",
         {"tickTime": 7, "maxDeliveryDelayInMillis": 9000}),
        ("DELETE", f"/admin/v2/persistent/{ns}/x/delayedDelivery", None),
        ("DELETE", f"/admin/v2/persistent/{ns}/x/delayedDelivery?isGlobal=true", None),
        ("DELETE", f"/admin/v2/persistent/{ns}/x", None),
        ("DELETE", f"/admin/v2/namespaces/{ns}", None),
        ("DELETE", f"/admin/v2/tenants/{unique}", None),
    ]
    with httpx.Client(base_url=policy.url, timeout=30) as http:
        for method, url, body in calls:
            assert http.request(method, url, json=body).status_code == 204, url

    # The service answers only after Kafka acknowledged, so the feed already has it all.
    records = _records(kafka_bootstrap, unique)
    seen = [(r.key.decode() if r.key else "", orjson.loads(r.value) if r.value else None)
            for r in records]
    versions = [_version(r) for r in records]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    v = versions
    assert seen == [
        (f"tenant:{unique}", {"version": v[0], "scope": f"tenant:{unique}",
                              "tenant": {"adminRoles": ["ops"], "allowedClusters": []}}),
        (f"namespace:{ns}", {"version": v[1], "scope": f"namespace:{ns}"}),
        (f"ns:{ns}", {"version": v[2], "scope": f"ns:{ns}",
                      "policy": {"maxDeliveryDelayInMillis": 5000}}),
        (f"topic:{topic}", {"version": v[3], "scope": f"topic:{topic}",
                            "policy": {"tickTime": 100}, "local": {"tickTime": 100}}),
        # `policy`, which admission reads, is local over global, field by field.
        (f"topic:{topic}", {"version": v[4], "scope": f"topic:{topic}",
                            "policy": {"tickTime": 100, "maxDeliveryDelayInMillis": 9000},
                            "local": {"tickTime": 100},
                            "global": {"tickTime": 7, "maxDeliveryDelayInMillis": 9000}}),
        (f"topic:{topic}", {"version": v[5], "scope": f"topic:{topic}",
                            "policy": {"tickTime": 7, "maxDeliveryDelayInMillis": 9000},
                            "global": {"tickTime": 7, "maxDeliveryDelayInMillis": 9000}}),
        (f"topic:{topic}", None),
        # Deleting the namespace removes its own policy too: two tombstones.
        (f"ns:{ns}", None),
        (f"namespace:{ns}", None),
        (f"tenant:{unique}", None),
    ]


def test_removing_nothing_publishes_nothing(policy, kafka_bootstrap: str,  # type: ignore[no-untyped-def]
                                            unique: str) -> None:
    with httpx.Client(base_url=policy.url, timeout=30) as http:
        assert http.put(f"/admin/v2/tenants/{unique}").status_code == 204
        assert http.put(f"/admin/v2/namespaces/{unique}/ns").status_code == 204
        assert http.delete(f"/admin/v2/namespaces/{unique}/ns/delayedDelivery").status_code == 204
    keys = [r.key for r in _records(kafka_bootstrap, unique)]
    assert keys == [f"tenant:{unique}".encode(), f"namespace:{unique}/ns".encode()]


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_saved_while_kafka_unreachable_is_published_on_restart(
        services, kafka_bootstrap: str, unique: str) -> None:  # type: ignore[no-untyped-def]
    cut_off = services.start("policy", ready=False, env={
        "DWELL_KAFKA_BOOTSTRAP": f"127.0.0.1:{_dead_port()}", "DWELL_FEED_TIMEOUT_MS": "1000"})
    try:
        with httpx.Client(base_url=cut_off.url, timeout=30) as http:
            resp = http.put(f"/admin/v2/tenants/{unique}")
            assert resp.status_code == 503
            assert "change feed (Kafka)" in resp.json()["reason"]
            # Saved all the same: the store is Redis.
            assert http.get(f"/admin/v2/tenants/{unique}").status_code == 200
            ready = http.get("/readyz")
            assert (ready.status_code, ready.json()) == (
                503, {"ready": False, "redis": True, "kafka": False, "rebuildingStore": False})
    finally:
        cut_off.kill()
    # No check that the feed lacks it now: any other policy service started on the shared
    # test stack meanwhile catches up too, which is the behaviour under test.

    # A service that reaches Kafka catches up before it reports ready.
    healthy = services.start("policy")
    try:
        records = _records(kafka_bootstrap, unique)
        assert [r.key for r in records] == [f"tenant:{unique}".encode()]
        assert orjson.loads(records[0].value or b"null")["tenant"] == {
            "adminRoles": [], "allowedClusters": []}
    finally:
        healthy.stop()
