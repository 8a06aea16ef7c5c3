"""Read your writes across the policy service and admission (real processes, real Kafka
and Redis): a namespace is publishable the moment its creation is acknowledged, over
HTTP and over the Kafka ingress, and a miss is answered only once admission has caught
up with the policy feed: a namespace that does not exist still gets its 404 at once.
A lowered max delay is the one change a publish may miss (nothing it does asks the
feed): how long it takes to be in force on every replica is measured and printed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell_dev.testkit import make_tenant, ok

pytestmark = pytest.mark.integration

# Each try makes a namespace and its topic's ready topic (a request with messages is
# routed, even when its messages are refused), so tries cost Kafka a topic each.
HTTP_TRIES = 300
INGRESS_TRIES = 200
# A message refused on its own (a payload that is not base64): the request passes the
# namespace check and writes no message.
PROBE = {"payload": "%%", "payloadEncoding": "base64"}
NOT_BASE64 = "payload is not valid base64"


@pytest.fixture(scope="module")
def replicas(services: Any) -> Iterator[list[httpx.Client]]:
    svcs = [services.start("admission") for _ in range(2)]
    clients = [httpx.Client(base_url=svc.url, timeout=30) for svc in svcs]
    yield clients
    for c, svc in zip(clients, svcs, strict=True):
        c.close()
        svc.stop()


@pytest.fixture(scope="module")
def admission(replicas: list[httpx.Client]) -> httpx.Client:
    return replicas[0]


def test_a_namespace_is_publishable_over_http_once_created(
        policy: httpx.Client, admission: httpx.Client, unique: str) -> None:
    make_tenant(policy, unique)
    wrong: list[tuple[int, int, str]] = []
    waits: list[float] = []
    for i in range(HTTP_TRIES):
        ok(policy.put(f"/admin/v2/namespaces/{unique}/ns{i}"))
        started = time.perf_counter()
        r = admission.post(f"/topics/persistent/{unique}/ns{i}/x", json={"messages": [PROBE]})
        waits.append(time.perf_counter() - started)
        if r.status_code != 200:
            wrong.append((i, r.status_code, r.text))
        else:
            assert r.json()["messagePublishResults"][0]["errorMsg"] == NOT_BASE64
    waits.sort()
    print(f"\ncreate-then-publish over HTTP: {len(wrong)} wrong of {HTTP_TRIES}; publish "
          f"p50 {waits[len(waits) // 2] * 1000:.1f} ms, "
          f"p99 {waits[int(len(waits) * 0.99)] * 1000:.1f} ms")
    assert not wrong, f"{len(wrong)} of {HTTP_TRIES} wrong: {wrong[:3]}"


def test_an_unknown_namespace_is_still_404_after_the_catch_up(
        admission: httpx.Client, unique: str) -> None:
    started = time.monotonic()
    r = admission.post(f"/topics/persistent/{unique}/nope/x", json={"messages": [PROBE]})
    assert r.status_code == 404 and "does not exist" in r.json()["reason"]
    assert time.monotonic() - started < 1.0  # caught up, not timed out


def test_a_namespace_is_publishable_over_kafka_once_created(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    make_tenant(policy, unique)
    ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    producer_name = f"ryw-{uuid.uuid4().hex[:6]}"
    p = kafka.Producer(kafka_bootstrap, linger_ms=0)
    try:
        for i in range(INGRESS_TRIES):
            ok(policy.put(f"/admin/v2/namespaces/{unique}/ns{i}"))
            topic = f"persistent://{unique}/ns{i}/x"
            p.send(names.PUBLISH, orjson.dumps({"producerName": producer_name, "topic": topic,
                                                "messages": [PROBE]}), key=topic)
        p.flush(30)
    finally:
        p.close()
    got: list[dict[str, Any]] = []
    c = kafka.Consumer(kafka_bootstrap, f"test-{uuid.uuid4().hex}")
    c.assign([(names.PUBLISH_RESULTS, part, off) for part, off in ends.items()])
    deadline = time.monotonic() + 60
    try:
        while len(got) < INGRESS_TRIES and time.monotonic() < deadline:
            got += [orjson.loads(r.value) for r in c.poll(1000, 0.5)
                    if r.key == producer_name.encode()]
    finally:
        c.close()
    assert len(got) == INGRESS_TRIES
    wrong = [g for g in got if g.get("errorMsg") != NOT_BASE64]
    print(f"\ncreate-then-publish over Kafka: {len(wrong)} wrong of {INGRESS_TRIES}")
    assert not wrong, f"{len(wrong)} of {INGRESS_TRIES} wrong: {wrong[:3]}"


RAISES = 200


def test_a_raised_max_delay_is_in_force_once_acknowledged(
        policy: httpx.Client, admission: httpx.Client, unique: str) -> None:
    make_tenant(policy, unique)
    ok(policy.put(f"/admin/v2/namespaces/{unique}/ns"))
    path = f"/admin/v2/namespaces/{unique}/ns/delayedDelivery"
    ok(policy.post(path, json={"active": True, "maxDeliveryDelayInMillis": 1000}))
    topic = f"/topics/persistent/{unique}/ns/x"
    wrong: list[tuple[int, str]] = []
    for i in range(1, RAISES + 1):
        limit = 1000 + 1000 * i  # each raise lets through what the one before refused
        ok(policy.post(path, json={"active": True, "maxDeliveryDelayInMillis": limit}))
        r = ok(admission.post(topic, json={"messages": [
            {"payload": "p", "deliverAfterMs": limit}]})).json()
        result = r["messagePublishResults"][0]
        if result["errorCode"] != 0:
            wrong.append((i, result["errorMsg"]))
    print(f"\nraise-max-delay-then-publish: {len(wrong)} wrongly refused of {RAISES}")
    assert not wrong, f"{len(wrong)} of {RAISES} refused: {wrong[:3]}"


LOWERINGS = 50
IN_FORCE_BOUND_S = 1.0


def test_a_lowered_max_delay_is_in_force_on_every_replica_within_the_bound(
        policy: httpx.Client, replicas: list[httpx.Client], unique: str) -> None:
    make_tenant(policy, unique)
    ok(policy.put(f"/admin/v2/namespaces/{unique}/ns"))
    path = f"/admin/v2/namespaces/{unique}/ns/delayedDelivery"
    topic = f"/topics/persistent/{unique}/ns/x"
    lags: list[float] = []
    for _ in range(LOWERINGS):
        ok(policy.post(path, json={"active": True, "maxDeliveryDelayInMillis": 60000}))
        for r in replicas:  # in force at once: a refusal catches up first
            t = int(time.time() * 1000)
            probe = {"payload": "p", "eventTime": t, "deliverAt": t + 2000}
            assert ok(r.post(topic, json={"messages": [probe]})).json()[
                "messagePublishResults"][0]["errorCode"] == 0
        ok(policy.post(path, json={"active": True, "maxDeliveryDelayInMillis": 1000}))
        acked = time.perf_counter()
        waiting = set(range(len(replicas)))
        while waiting:
            for i in list(waiting):
                t = int(time.time() * 1000)
                probe = {"payload": "p", "eventTime": t, "deliverAt": t + 2000}
                res = ok(replicas[i].post(topic, json={"messages": [probe]})).json()
                if res["messagePublishResults"][0]["errorCode"] != 0:
                    waiting.discard(i)
            assert time.perf_counter() - acked < 5.0, "max 1000 not in force after 5 s"
        lags.append(time.perf_counter() - acked)
    lags.sort()
    p50, p99 = lags[len(lags) // 2], lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    print(f"\nlowered max delay in force on {len(replicas)} replicas, {LOWERINGS} tries: "
          f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {lags[-1] * 1000:.1f} ms")
    assert p99 < IN_FORCE_BOUND_S
