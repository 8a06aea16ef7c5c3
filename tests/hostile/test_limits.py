"""Quotas and name collisions, on the real services over real Redis and Kafka: Pulsar's
maxNumPartitionsPerPartitionedTopic, maxTopicsPerNamespace and maxSubscriptionsPerTopic
(broker settings and namespace policies, Pulsar's statuses and texts), Kafka's '.'/'_'
collision answered 409 naming the colliding topic, and the SDK's consumer group unique
per tenant, namespace, topic and subscription."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.client import Consumer, SubscribeError
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName
from dwell.http import ApiError
from dwell.tracker.registry import SubscriptionRegistry
from dwell_dev.testkit import ServiceFactory, free_port, redis_db_url, wait_for

MAX_PARTITIONS = 8
MAX_SUBSCRIPTIONS = 3
LIMITS = {"DWELL_MAX_NUM_PARTITIONS_PER_PARTITIONED_TOPIC": str(MAX_PARTITIONS),
          "DWELL_MAX_SUBSCRIPTIONS_PER_TOPIC": str(MAX_SUBSCRIPTIONS)}


@pytest.fixture(scope="module")
def tracker(services: ServiceFactory) -> Iterator[Any]:
    svc = services.start("tracker", LIMITS)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def policy(services: ServiceFactory, tracker: Any) -> Iterator[httpx.Client]:
    svc = services.start("policy", LIMITS | {"DWELL_TRACKER_URL": tracker.url})
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        yield c
    svc.stop()


@pytest.fixture(scope="module")
def admission(services: ServiceFactory) -> Iterator[httpx.Client]:
    svc = services.start("admission", LIMITS)
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        yield c
    svc.stop()


def ok(resp: httpx.Response) -> httpx.Response:
    assert resp.status_code < 300, (resp.status_code, resp.text)
    return resp


def refused(resp: httpx.Response, status: int, reason: str) -> None:
    assert (resp.status_code, resp.json().get("reason")) == (status, reason), resp.text


def make_namespace(policy: httpx.Client, tenant: str, ns: str = "ns") -> str:
    if policy.get(f"/admin/v2/tenants/{tenant}").status_code == 404:
        ok(policy.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": [],
                                                            "allowedClusters": []}))
    ok(policy.put(f"/admin/v2/namespaces/{tenant}/{ns}"))
    return f"{tenant}/{ns}"


def test_partitions_above_the_broker_maximum_are_refused(policy: httpx.Client,
                                                         unique: str) -> None:
    base = f"/admin/v2/persistent/{make_namespace(policy, unique)}"
    refused(policy.put(f"{base}/big/partitions", json=MAX_PARTITIONS + 1), 406,
            f"Number of partitions should be less than or equal to {MAX_PARTITIONS}")
    refused(policy.put(f"{base}/huge/partitions", json=2**31 - 1), 406,
            f"Number of partitions should be less than or equal to {MAX_PARTITIONS}")
    ok(policy.put(f"{base}/fits/partitions", json=MAX_PARTITIONS))
    assert policy.get(f"{base}/big/partitions").json() == {"partitions": 0}


def test_max_topics_per_namespace_policy(policy: httpx.Client, admission: httpx.Client,
                                         unique: str) -> None:
    ns = make_namespace(policy, unique)
    limit = f"/admin/v2/namespaces/{ns}/maxTopicsPerNamespace"
    base = f"/admin/v2/persistent/{ns}"
    assert ok(policy.get(limit)).json() is None
    refused(policy.post(limit, json=-1), 412, "maxTopicsPerNamespace must be 0 or more")
    assert policy.post(limit, json="3").status_code == 400
    ok(policy.post(limit, json=3))
    assert ok(policy.get(limit)).json() == 3
    ok(policy.put(f"{base}/p/partitions", json=2))  # its two partitions count as two topics
    ok(policy.put(f"{base}/x"))
    refused(policy.put(f"{base}/y"), 412, "Exceed maximum number of topics in namespace.")
    refused(policy.put(f"{base}/q/partitions", json=1), 412,
            "Exceed maximum number of topics in namespace.")
    # Admission's auto-creation on a first publish is held to it too, once the feed has it.
    answer = wait_for(lambda: (r := admission.post(
        f"/topics/persistent/{ns}/auto", json={"messages": [{"payload": "eA=="}]}))
        .status_code != 404 and r, 30, "admission to know the namespace")
    refused(answer, 412, "Exceed maximum number of topics in namespace.")
    assert sorted(ok(policy.get(base)).json()) == [
        f"persistent://{ns}/p-partition-0", f"persistent://{ns}/p-partition-1",
        f"persistent://{ns}/x"]
    ok(policy.delete(limit))  # the broker's default (1000) again
    assert ok(policy.get(limit)).json() is None
    ok(policy.put(f"{base}/y"))


READY_PARTITIONS = 4  # admission's ready_topic_partitions: what a first publish makes


def test_concurrent_creates_never_pass_max_topics_per_namespace(
        policy: httpx.Client, admission: httpx.Client, unique: str) -> None:
    """Creates at once, on the admin API and by first publishes: each process counts and
    creates a namespace's topics under one lock, so no more than maxTopicsPerNamespace
    topics are made by either. (Two replicas of one service still count apart:
    docs/architecture.md, quotas.)"""
    n = 12
    paths = {"policy": "/admin/v2/persistent/{ns}/{topic}",
             "admission": "/topics/persistent/{ns}/{topic}"}
    for side, size in (("policy", 1), ("admission", READY_PARTITIONS)):
        ns = make_namespace(policy, unique, side)
        ok(policy.post(f"/admin/v2/namespaces/{ns}/maxTopicsPerNamespace", json=3 * size))

        def create(topic: str, side: str = side, ns: str = ns) -> httpx.Response:
            path = paths[side].format(ns=ns, topic=topic)
            if side == "policy":
                return policy.put(path)
            return admission.post(path, json={"messages": [{"payload": "eA=="}]})

        # The first topic, once admission knows the namespace: 2 places are left.
        ok(wait_for(lambda: (r := create("first")).status_code != 404 and r,
                    30, "admission to know the namespace"))
        start = threading.Barrier(n)

        def at_once(i: int) -> int:
            start.wait(30)  # noqa: B023
            return create(f"t{i}").status_code

        with ThreadPoolExecutor(n) as pool:
            codes = sorted(pool.map(at_once, range(n)))
        print(f"{side}: answers of {n} creates at once with 2 places left: {codes}")
        assert codes.count(412) == n - 2, codes
        assert len(ok(policy.get(f"/admin/v2/persistent/{ns}")).json()) == 3 * size


def test_max_subscriptions_per_topic(policy: httpx.Client, tracker: Any,
                                     unique: str) -> None:
    """Every subscription costs Kafka a RETRY and a DLQ topic: their number is bounded."""
    ns = make_namespace(policy, unique)
    topic = f"persistent://{ns}/subs"
    subs = f"{tracker.url}/v1/topics/persistent/{ns}/subs/subscriptions"
    for i in range(MAX_SUBSCRIPTIONS):
        ok(httpx.put(f"{subs}/s{i}", json={}, timeout=10))
    refused(httpx.put(f"{subs}/one-more", json={}, timeout=10), 412,
            f"Exceed the maximum number of subscriptions of the topic: {topic}")
    ok(httpx.put(f"{subs}/s0", json={"ackTimeoutMs": 0}, timeout=10))  # updating is fine
    with pytest.raises(SubscribeError, match="412.*Exceed the maximum number of subscr"):
        Consumer(topic, "sdk", tracker_url=tracker.url)
    # The namespace policy overrides the broker's, once the tracker's replay has it.
    limit = f"/admin/v2/namespaces/{ns}/maxSubscriptionsPerTopic"
    refused(policy.post(limit, json=-2), 412, "maxSubscriptionsPerTopic must be 0 or more")
    ok(policy.post(limit, json=MAX_SUBSCRIPTIONS + 1))
    assert ok(policy.get(limit)).json() == MAX_SUBSCRIPTIONS + 1
    wait_for(lambda: httpx.put(f"{subs}/one-more", json={}, timeout=10).status_code == 200,
             30, "the tracker to apply the namespace's maxSubscriptionsPerTopic")
    refused(httpx.put(f"{subs}/two-more", json={}, timeout=10), 412,
            f"Exceed the maximum number of subscriptions of the topic: {topic}")


def test_concurrent_registrations_never_pass_max_subscriptions(
        policy: httpx.Client, tracker: Any, services: ServiceFactory, unique: str) -> None:
    """Registrations at once, on two tracker replicas: the count and the place are taken
    in one step, so no more than maxSubscriptionsPerTopic pass, whatever the timing."""
    ns = make_namespace(policy, unique)
    other = services.start("tracker", LIMITS)
    urls = [f"{t.url}/v1/topics/persistent/{ns}/race/subscriptions" for t in (tracker, other)]
    n = 16
    start = threading.Barrier(n)

    def register(i: int) -> int:
        start.wait(30)
        return httpx.put(f"{urls[i % 2]}/s{i}", json={}, timeout=30).status_code

    with ThreadPoolExecutor(n) as pool:
        codes = sorted(pool.map(register, range(n)))
    print(f"answers of {n} registrations at once: {codes}")
    assert codes == [200] * MAX_SUBSCRIPTIONS + [412] * (n - MAX_SUBSCRIPTIONS)
    held = [i for i in range(n)
            if httpx.get(f"{urls[0]}/s{i}", timeout=10).status_code == 200]
    assert len(held) == MAX_SUBSCRIPTIONS, held


def test_a_registration_kafka_refused_gives_its_place_back(stack: Any) -> None:
    """The place is taken before the Kafka write: a write Kafka does not take (here no
    broker at all) answers 503 and leaves no place held, so the topic is not full."""
    r = redis_adapter.connect(redis_db_url(stack, 10))
    r.flushdb()
    r.set(keys.SUBSCRIPTIONS_APPLIED, 0)  # the registry is whole: no rebuild first
    registry = SubscriptionRegistry(r, f"127.0.0.1:{free_port()}", timeout_s=1)
    topic = "persistent://t/ns/no-kafka"
    try:
        with pytest.raises(ApiError) as refused_write:
            registry.put(topic, "s", SubscriptionSettings(), max_subscriptions=1)
        assert refused_write.value.status == 503
        assert r.zcard(keys.sub_reservations(topic)) == 0
        assert r.hlen(keys.subscriptions(topic)) == 0
    finally:
        registry.close()
        r.flushdb()


def test_a_kafka_name_collision_is_a_409_naming_the_colliding_topic(
        policy: httpx.Client, admission: httpx.Client, unique: str) -> None:
    """Kafka treats '.' and '_' alike: tenant t's b_c/d (t.b_c.d) blocks tenant t_b's
    c/d (t_b.c.d). The second create is refused, with the topic it collides with."""
    first = TopicName.parse(f"persistent://{unique}/b_c/d")
    second = TopicName.parse(f"persistent://{unique}_b/c/d")
    make_namespace(policy, unique, "b_c")
    make_namespace(policy, f"{unique}_b", "c")
    ok(policy.put(f"/admin/v2/persistent/{unique}/b_c/d"))
    answer = policy.put(f"/admin/v2/persistent/{unique}_b/c/d")
    assert answer.status_code == 409, answer.text
    assert first.kafka_topic in answer.json()["reason"]
    assert second.kafka_topic in answer.json()["reason"]
    published = wait_for(lambda: (r := admission.post(
        f"/topics/persistent/{unique}_b/c/d2", json={"messages": [{"payload": "eA=="}]}))
        .status_code != 404 and r, 30, "admission to know the namespace")
    assert published.status_code == 200  # another name in that namespace is fine
    ok(policy.put(f"/admin/v2/persistent/{unique}/b_c/d3"))
    clash = admission.post(f"/topics/persistent/{unique}_b/c/d3",
                           json={"messages": [{"payload": "eA=="}]})
    assert clash.status_code == 409, clash.text
    assert f"{unique}.b_c.d3" in clash.json()["reason"]


def _receive(consumer: Consumer, value: bytes, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = consumer.receive(2)
        if got is not None and got.value == value:
            return got
    raise AssertionError(f"{value!r} not received")


def test_same_named_subscriptions_of_two_tenants_have_their_own_groups(
        tracker: Any, kafka_bootstrap: str, unique: str) -> None:
    """The SDK used the bare subscription name as the group id: two tenants' `billing`
    subscriptions shared one group and rebalanced each other."""
    a = TopicName.parse(f"persistent://{unique}/ns/orders")
    b = TopicName.parse(f"persistent://{unique}_b/ns/orders")
    with Consumer(str(a), "billing", initial_position="earliest", bootstrap=kafka_bootstrap,
                  tracker_url=tracker.url) as ca, \
            Consumer(str(b), "billing", initial_position="earliest",
                     bootstrap=kafka_bootstrap, tracker_url=tracker.url) as cb:
        assert ca.group_id == f"{a.kafka_topic}/billing"
        assert cb.group_id == f"{b.kafka_topic}/billing"
        assert ca.group_id.startswith(f"{unique}.") and cb.group_id.startswith(f"{unique}_b.")
        producer = kafka.Producer(kafka_bootstrap, linger_ms=0)
        producer.send(a.kafka_topic, b"for-a", key=b"k").result(10)
        producer.send(b.kafka_topic, b"for-b", key=b"k").result(10)
        producer.close()
        ca.acknowledge(_receive(ca, b"for-a"))
        cb.acknowledge(_receive(cb, b"for-b"))
    admin = kafka.admin(kafka_bootstrap)
    described = admin.describe_consumer_groups([ca.group_id, cb.group_id])
    for group, future in described.items():
        assert future.result(10).group_id == group
    for group, ready in ((ca.group_id, a.kafka_topic), (cb.group_id, b.kafka_topic)):
        reader = kafka.Consumer(kafka_bootstrap, group)
        try:
            committed = reader.committed([(ready, p) for p in
                                          kafka.partitions(kafka_bootstrap, ready)])
        finally:
            reader.close()
        assert any(o > 0 for o in committed.values()), (group, committed)


def test_an_upgraded_consumer_goes_on_from_its_old_groups_offsets(
        tracker: Any, kafka_bootstrap: str, unique: str) -> None:
    topic = TopicName.parse(f"persistent://{unique}/ns/legacy")
    kafka.ensure_topic(kafka_bootstrap, topic.kafka_topic, 1)
    producer = kafka.Producer(kafka_bootstrap, linger_ms=0)
    for value in (b"old", b"new"):
        producer.send(topic.kafka_topic, value).result(10)
    producer.close()
    legacy_group = f"legacy-{unique}"
    old = kafka.Consumer(kafka_bootstrap, legacy_group)
    old.commit({(topic.kafka_topic, 0): 1})  # the old SDK had read "old"
    old.close()
    with Consumer(str(topic), legacy_group, initial_position="earliest",
                  bootstrap=kafka_bootstrap, tracker_url=tracker.url) as consumer:
        first = consumer.receive(30)
    assert first is not None and first.value == b"new"


def test_dwell_admin_sets_gets_and_removes_the_namespace_quotas(policy: httpx.Client,
                                                                unique: str) -> None:
    from typer.testing import CliRunner

    from dwell.cli.main import app

    ns = make_namespace(policy, unique)
    runner = CliRunner()

    def admin(*argv: str) -> str:
        done = runner.invoke(app, ["--url", str(policy.base_url), "-o", "json", *argv])
        assert done.exit_code == 0, done.output
        return done.stdout.strip()

    admin("namespaces", "set-max-topics-per-namespace", ns, "-t", "7")
    admin("namespaces", "set-max-subscriptions-per-topic", ns, "--max-subscriptions-per-topic",
          "9")
    assert admin("namespaces", "get-max-topics-per-namespace", ns) == "7"
    assert admin("namespaces", "get-max-subscriptions-per-topic", ns) == "9"
    admin("namespaces", "remove-max-topics-per-namespace", ns)
    admin("namespaces", "remove-max-subscriptions-per-topic", ns)
    assert admin("namespaces", "get-max-topics-per-namespace", ns) == "null"
    bad = runner.invoke(app, ["--url", str(policy.base_url), "namespaces",
                              "set-max-topics-per-namespace", ns, "-t", "-1"])
    assert bad.exit_code == 1 and "412 maxTopicsPerNamespace must be 0 or more" in bad.stderr
