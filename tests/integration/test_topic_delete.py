"""`topics delete` and `delete-partitioned-topic` of a topic that has subscriptions, as
Pulsar 4.0 answers them (PersistentTopic.delete, PersistentTopicsBase): refused with 412
naming them unless forced, whether the subscription is registered at the tracker (the
SDK's, a plain consumer's registration) or is a Kafka consumer group reading the ready
topic; a forced delete takes the registered ones with the topic. Real policy service,
tracker, Redis and Kafka."""

from __future__ import annotations

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from dwell.core.topics import TopicName, group_id


@pytest.fixture(scope="module")
def tracker(services):  # type: ignore[no-untyped-def]
    svc = services.start("tracker")
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def policy(services, tracker):  # type: ignore[no-untyped-def]
    svc = services.start("policy", env={"DWELL_TRACKER_URL": tracker.url})
    yield svc
    svc.stop()


def subscription_url(tracker_url: str, topic: str, sub: str) -> str:
    name = TopicName.parse(topic)
    return (f"{tracker_url}/v1/topics/persistent/{name.tenant}/{name.namespace}/{name.local}"
            f"/subscriptions/{sub}")


def subscribe(tracker_url: str, topic: str, sub: str) -> None:
    got = httpx.put(subscription_url(tracker_url, topic, sub), json={"ackTimeoutMs": 0},
                    timeout=30)
    assert got.status_code == 200, got.text


def registered(tracker_url: str, topic: str, sub: str) -> bool:
    return httpx.get(subscription_url(tracker_url, topic, sub), timeout=30).status_code == 200


def namespace(http: httpx.Client, policy_url: str, unique: str) -> str:
    """The topics' admin path of a new namespace `<unique>/ns`."""
    assert http.put(f"{policy_url}/admin/v2/tenants/{unique}").status_code == 204
    assert http.put(f"{policy_url}/admin/v2/namespaces/{unique}/ns").status_code == 204
    return f"{policy_url}/admin/v2/persistent/{unique}/ns"


def test_a_registered_subscription_refuses_the_delete_until_forced(
        policy, tracker, unique: str) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(timeout=30) as http:
        base = namespace(http, policy.url, unique)
        assert http.put(f"{base}/x").status_code == 204
        topic = f"persistent://{unique}/ns/x"
        subscribe(tracker.url, topic, "s2")
        subscribe(tracker.url, topic, "s1")
        got = http.delete(f"{base}/x")
        assert (got.status_code, got.json()) == (
            412, {"reason": "Topic has subscriptions: [s1, s2]"})
        assert topic in http.get(f"{base}").json()  # still there
        assert http.delete(f"{base}/x", params={"force": "true"}).status_code == 204
        assert topic not in http.get(f"{base}").json()
        # The subscriptions went with it: a topic of the same name starts without them.
        assert not registered(tracker.url, topic, "s1")
        assert not registered(tracker.url, topic, "s2")
        assert http.put(f"{base}/x").status_code == 204
        assert http.delete(f"{base}/x").status_code == 204


def test_a_kafka_consumer_group_refuses_the_delete(policy, unique: str,  # type: ignore[no-untyped-def]
                                                   kafka_bootstrap: str) -> None:
    with httpx.Client(timeout=30) as http:
        base = namespace(http, policy.url, unique)
        assert http.put(f"{base}/y").status_code == 204
        ready = TopicName.parse(f"persistent://{unique}/ns/y").kafka_topic
        # A plain Kafka consumer's group and an SDK consumer's (named for its subscription)
        # that have read the ready topic: no member is connected, their committed offsets
        # keep the subscriptions.
        for group_name in (f"{unique}-g", group_id(TopicName.parse(f"persistent://{unique}/ns/y"),
                                                   "sdk-sub")):
            group = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group_name})
            group.commit(offsets=[TopicPartition(ready, 0, 0)], asynchronous=False)
            group.close()
        got = http.delete(f"{base}/y")
        assert (got.status_code, got.json()) == (
            412, {"reason": f"Topic has subscriptions: [sdk-sub, {unique}-g]"})
        assert http.delete(f"{base}/y", params={"force": "true"}).status_code == 204
        assert http.get(f"{base}/y/partitions").json() == {"partitions": 0}


def test_a_partitioned_topic_with_a_subscription_on_a_partition(
        policy, tracker, unique: str) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(timeout=30) as http:
        base = namespace(http, policy.url, unique)
        assert http.put(f"{base}/p/partitions", json=2).status_code == 204
        partition = f"persistent://{unique}/ns/p-partition-1"
        subscribe(tracker.url, partition, "s")
        got = http.delete(f"{base}/p/partitions")
        assert (got.status_code, got.json()) == (
            412, {"reason": "Topic has active producers/subscriptions"})
        assert http.delete(f"{base}/p/partitions", params={"force": "true"}).status_code == 204
        assert not registered(tracker.url, partition, "s")
        assert f"persistent://{unique}/ns/p" not in http.get(f"{base}/partitioned").json()


def test_a_forced_delete_with_the_tracker_down_keeps_the_topic(
        services, policy, tracker, unique: str) -> None:  # type: ignore[no-untyped-def]
    """The registered subscriptions go first: when the tracker cannot remove them the
    answer is 503 and the topic stays, so that the same call made again completes."""
    cut_off = services.start("policy", env={"DWELL_TRACKER_URL": "http://127.0.0.1:9"})
    with httpx.Client(timeout=30) as http:
        base = namespace(http, policy.url, unique)
        assert http.put(f"{base}/z").status_code == 204
        topic = f"persistent://{unique}/ns/z"
        subscribe(tracker.url, topic, "s")
        got = http.delete(f"{cut_off.url}/admin/v2/persistent/{unique}/ns/z",
                          params={"force": "true"})
        assert got.status_code == 503
        assert "tracker unavailable" in got.json()["reason"]
        assert topic in http.get(base).json()
        assert registered(tracker.url, topic, "s")
        assert http.delete(f"{base}/z", params={"force": "true"}).status_code == 204
        assert not registered(tracker.url, topic, "s")
