"""Admission under failure, against real Kafka: a kill -9 in the middle of a Kafka-ingress
run loses nothing and publishes nothing twice (the ingress is transactional), and a Kafka
that goes away turns HTTP publishes into a retriable 503 that reports nothing accepted.

The second test stops a Kafka, so it runs its own private one (a runtime profile of
`devstack`, free ports, state under pytest's tmp dir) rather than the shared test Kafka.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell_dev import devstack
from dwell_dev.testkit import private_stack, wait_ingress

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

REQUESTS = 2000
PER_REQUEST = 10
PUBLISH_TIMEOUT_MS = 3000
PACE_S = 8.0



def feed(bootstrap: str, tenant: str, namespace: str, policy: dict[str, Any]) -> None:
    """Declare a tenant, a namespace and its policy on `dwell.policies` the way the policy
    service does (docs/internals.md), for a private Kafka that has no policy service (it
    would need a Redis); never on the shared one, whose feed versions come from Redis."""
    p = kafka.Producer(bootstrap)
    try:
        for version, (scope, extra) in enumerate([
                (f"tenant:{tenant}", {"tenant": {"adminRoles": [], "allowedClusters": []}}),
                (f"namespace:{tenant}/{namespace}", {}),
                (f"ns:{tenant}/{namespace}", {"policy": policy})], start=1):
            doc = {"version": version, "scope": scope, **extra}
            p.send(names.POLICIES, orjson.dumps(doc), scope).result(15)
    finally:
        p.close()


def wait_known(client: httpx.Client, path: str) -> None:
    deadline = time.monotonic() + 15
    while client.post(path, json={"messages": [{"payload": "probe"}]}).status_code == 404:
        assert time.monotonic() < deadline, "admission never learnt the namespace"
        time.sleep(0.05)


# ---------------------------------------------------------------- kill -9 mid-ingress


def test_kill_9_mid_ingress_gives_one_result_and_one_record_per_message(
        services: Any, kafka_bootstrap: str, unique: str) -> None:
    topic = f"persistent://{unique}/ns/crash"
    ready_topic = names.TopicName.parse(topic).kafka_topic
    producer_name = f"crash-{unique}"
    policy = services.start("policy")
    try:
        with httpx.Client(base_url=policy.url, timeout=10) as c:
            for method, path, doc in [
                    ("PUT", f"/admin/v2/tenants/{unique}", {"adminRoles": []}),
                    ("PUT", f"/admin/v2/namespaces/{unique}/ns", None),
                    ("POST", f"/admin/v2/namespaces/{unique}/ns/delayedDelivery",
                     {"active": True, "maxDeliveryDelayInMillis": 3_600_000})]:
                r = c.request(method, path, json=doc)
                assert r.status_code < 300, r.text
    finally:
        policy.stop()
    # The same transactional id for the replica and its replacement: the replacement's
    # init_transactions aborts whatever the killed one left open.
    env = {"DWELL_INGRESS_TRANSACTIONAL_ID": f"dwell-admission-{unique}"}
    first = services.start("admission", env)
    wait_ingress(first.url)
    with httpx.Client(base_url=first.url, timeout=10) as c:
        wait_known(c, f"/topics/persistent/{unique}/ns/crash")  # also creates the ready topic

    results_start = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    delayed_start = kafka.end_offsets(kafka_bootstrap, names.DELAYED)
    p = kafka.Producer(kafka_bootstrap)
    requests: list[kafka.OutRecord] = []
    for r in range(REQUESTS):
        msgs = [{"payload": f"m{r * PER_REQUEST + i}", "sequenceId": r * PER_REQUEST + i,
                 **({"deliverAfterMs": 600_000} if i % 2 else {})} for i in range(PER_REQUEST)]
        requests.append((names.PUBLISH, orjson.dumps({"topic": topic, "messages": msgs,
                                                      "producerName": producer_name}),
                         topic.encode(), None, None))
    total = REQUESTS * PER_REQUEST

    # Watch committed results, and the ready topic without isolation: kill the replica
    # while a transaction has written outputs it has not committed yet (more immediate
    # messages on the ready topic than committed results for them), so the replacement
    # must keep the aborted copies from read_committed readers and write its own.
    key = producer_name.encode()
    watcher = kafka.Consumer(kafka_bootstrap, f"test-{uuid.uuid4().hex}",
                             **{"fetch.wait.max.ms": 5})
    watcher.assign([(names.PUBLISH_RESULTS, part, off) for part, off in results_start.items()])
    raw = kafka.Consumer(kafka_bootstrap, f"test-{uuid.uuid4().hex}",
                         **{"isolation.level": "read_uncommitted", "fetch.wait.max.ms": 5})
    raw.assign([(ready_topic, part, 0) for part in kafka.partitions(kafka_bootstrap,
                                                                    ready_topic)])
    seen: dict[tuple[str, int], bool] = {}  # (requestId, index) -> delayed

    def watch(timeout: float) -> None:
        for rec in watcher.poll(5000, timeout):
            if rec.key == key:
                res = orjson.loads(rec.value or b"")
                seen[(res["requestId"], res["index"])] = res["delayed"]

    def outputs_written(timeout: float) -> int:
        return sum(r.header("dwell-producer") == producer_name for r in raw.poll(5000, timeout))

    replica, kills, hits, written, sent = first, 0, 0, 0, 0
    started = time.monotonic()
    deadline = started + 180
    try:
        while len(seen) < total:
            assert time.monotonic() < deadline, f"{len(seen)} of {total} results"
            # The requests go out over PACE_S, so that there is work in flight to interrupt
            # whenever a kill comes (the ingress alone would finish them in about a second).
            due = min(REQUESTS, int(REQUESTS * (time.monotonic() - started) / PACE_S) + 1)
            if sent < due:
                p.send_many(requests[sent:due])
                sent = due
            watch(0.01)
            written += outputs_written(0.01)
            committed = sum(not delayed for delayed in seen.values())
            # Consumer lag can make a committed transaction look open, so a kill may miss
            # the window: look again once the dead replica's records have all arrived, and
            # kill the replacement too (up to 3 kills) until one kill is seen to hit it.
            if (hits == 0 and kills < 3 and len(seen) >= total // 10
                    and written > committed):
                replica.kill()
                kills += 1
                quiet = 0
                while quiet < 5:
                    assert time.monotonic() < deadline, "results never settled after the kill"
                    before = len(seen)
                    watch(0.1)
                    got = outputs_written(0.1)
                    written += got
                    quiet = quiet + 1 if (len(seen), got) == (before, 0) else 0
                hits += written > sum(not delayed for delayed in seen.values())
                replica = services.start("admission", env)
    finally:
        watcher.close()
        raw.close()
        p.close()
        replica.stop()
    assert kills >= 1, "the run finished before any kill"

    # Everything committed, read once more from the start: exactly one result per message.
    results = [orjson.loads(r.value or b"") for r in
               kafka.read_from(kafka_bootstrap, names.PUBLISH_RESULTS, results_start, 60)
               if r.key == key]
    per_message = Counter((r["requestId"], r["index"]) for r in results)
    assert len(per_message) == total, (len(per_message), kills, hits)
    assert set(per_message.values()) == {1}, (per_message.most_common(3), kills, hits)
    assert len({r["requestId"] for r in results}) == REQUESTS
    assert sorted(r["sequenceId"] for r in results) == list(range(total))
    assert all(r["errorCode"] == 0 for r in results), [r for r in results if r["errorCode"]][:3]

    # Every accepted message is on its output topic exactly once, where its result says.
    outputs = [r for r in kafka.read_from(kafka_bootstrap, ready_topic, {}, 60)
               if r.header("dwell-producer") == producer_name]
    outputs += [r for r in kafka.read_from(kafka_bootstrap, names.DELAYED, delayed_start, 60)
                if r.key == topic.encode() and r.header("dwell-producer") == producer_name]
    by_seq = Counter(int(r.header("dwell-sequence-id") or -1) for r in outputs)
    assert len(outputs) == total and set(by_seq) == set(range(total))
    where = {int(r.header("dwell-sequence-id") or -1): f"{r.topic}:{r.partition}:{r.offset}"
             for r in outputs}
    assert {r["sequenceId"]: r["messageId"] for r in results} == where
    assert all(r["delayed"] == (r["sequenceId"] % 2 == 1) for r in results)


# ---------------------------------------------------------------- Kafka unavailable


@pytest.fixture()
def private_kafka() -> Iterator[devstack.Stack]:
    """A Kafka of this test's own (free ports, state in `.dwell/<its profile>`), stopped
    and its state removed at the end whatever happens."""
    with private_stack("admission-503") as stack:
        stack.start("kafka")
        kafka.ensure_dwell_topics(stack.kafka_bootstrap)
        yield stack


def test_kafka_down_is_503_with_retry_after_and_nothing_accepted(
        services: Any, private_kafka: devstack.Stack, unique: str) -> None:
    bootstrap = private_kafka.kafka_bootstrap
    feed(bootstrap, unique, "ns", {"active": True, "maxDeliveryDelayInMillis": 60_000})
    svc = services.start("admission", {"DWELL_KAFKA_BOOTSTRAP": bootstrap,
                                       "DWELL_PUBLISH_TIMEOUT_MS": str(PUBLISH_TIMEOUT_MS)})
    try:
        path = f"/topics/persistent/{unique}/ns/down"
        body = {"producerName": "p", "messages": [{"payload": "now"},
                                                  {"payload": "later", "deliverAfterMs": 5000}]}
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            wait_known(c, path)
            up = c.post(path, json=body)
            assert up.status_code == 200, up.text
            assert [m["errorCode"] for m in up.json()["messagePublishResults"]] == [0, 0]

            private_kafka.stop("kafka")
            t0 = time.monotonic()
            down = c.post(path, json=body)
            took = time.monotonic() - t0
    finally:
        svc.stop()
    assert down.status_code == 503, down.text
    assert down.headers["retry-after"] == "1"
    assert down.json().keys() == {"reason"}
    assert "Kafka unavailable" in down.json()["reason"]
    # Answered within the publish timeout (plus the 1 s grace publish() allows itself).
    assert took < PUBLISH_TIMEOUT_MS / 1000 + 2.0, took
