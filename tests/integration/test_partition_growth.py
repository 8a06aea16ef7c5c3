"""`topics update-partitioned-topic` (`POST …/partitions`), as Pulsar 4.0 answers it
(PersistentTopicsBase.internalUpdatePartitionedTopicAsync): a partitioned topic's ready
topic grows to N Kafka partitions; growing a topic that is not partitioned, shrinking one
and passing the quotas are refused with Pulsar's statuses and texts. The new partitions
are read from their start by the subscriptions the topic had: a Kafka consumer group with
no member is started there, and an SDK consumer reads them from their first record.
Real policy service, admission, tracker, Redis and Kafka."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dwell.adapters import kafka
from dwell.client import Consumer, Producer
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell_dev.testkit import make_namespace, ok, read_results, wait_ingress

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tracker(services: Any) -> Iterator[Any]:
    svc = services.start("tracker")
    yield svc
    svc.stop()


def grow(policy: httpx.Client, tenant: str, topic: str, partitions: Any,
         **params: str) -> httpx.Response:
    return policy.post(f"/admin/v2/persistent/{tenant}/ns/{topic}/partitions", json=partitions,
                       params=params)


def partitioned(policy: httpx.Client, tenant: str, topic: str, partitions: int) -> TopicName:
    ok(policy.put(f"/admin/v2/persistent/{tenant}/ns/{topic}/partitions", json=partitions))
    return TopicName.parse(f"persistent://{tenant}/ns/{topic}")


def reason(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["reason"]


def test_growth_is_refused_as_pulsar_refuses_it(policy: httpx.Client, unique: str) -> None:
    make_namespace(policy, unique)
    partitioned(policy, unique, "p", 3)
    ok(policy.put(f"/admin/v2/persistent/{unique}/ns/plain"))
    name = f"persistent://{unique}/ns"
    assert reason(grow(policy, unique, "plain", 4)) == (
        409, f"Topic {name}/plain is not the partitioned topic.")
    assert reason(grow(policy, unique, "missing", 4)) == (
        409, f"Topic {name}/missing is not the partitioned topic.")
    assert reason(grow(policy, unique, "p", 2)) == (
        422, "Desired partitions 2 can't be less than the current partitions 3.")
    assert reason(grow(policy, unique, "p", 0)) == (
        422, "Desired partitions 0 can't be less than the current partitions 3.")
    assert reason(grow(policy, unique, "p", 101)) == (
        422, "Desired partitions 101 can't be greater than the maximum partitions per "
             "topic 100.")
    assert reason(grow(policy, unique, "p-partition-1", 4)) == (
        412, "Partitioned Topic Name should not contain '-partition-'")
    assert grow(policy, unique, "p", "four").status_code == 400
    # The namespace's topic quota counts each partition added, as creation does.
    ok(policy.post(f"/admin/v2/namespaces/{unique}/ns/maxTopicsPerNamespace", json=6))
    assert reason(grow(policy, unique, "p", 6)) == (
        412, "Exceed maximum number of topics in namespace.")
    assert grow(policy, unique, "p", 3).status_code == 204  # the count it has: nothing to do
    assert grow(policy, unique, "p", 5).status_code == 204
    assert ok(policy.get(f"/admin/v2/persistent/{unique}/ns/p/partitions")).json() == {
        "partitions": 5}
    assert f"{name}/p-partition-4" in ok(policy.get(f"/admin/v2/persistent/{unique}/ns")).json()


def test_a_one_partition_partitioned_topic_grows(policy: httpx.Client, unique: str,
                                                  kafka_bootstrap: str) -> None:
    make_namespace(policy, unique)
    x = partitioned(policy, unique, "one", 1)
    assert grow(policy, unique, "one", 3).status_code == 204
    assert kafka.partition_count(kafka_bootstrap, x.kafka_topic) == 3
    assert ok(policy.get(f"/admin/v2/persistent/{unique}/ns/one/partitions")).json() == {
        "partitions": 3}


def test_a_group_without_members_starts_at_the_first_record_of_the_new_partitions(
        policy: httpx.Client, unique: str, kafka_bootstrap: str) -> None:
    make_namespace(policy, unique)
    x = partitioned(policy, unique, "g", 2)
    ready = x.kafka_topic
    idle, busy = f"idle-{uuid.uuid4().hex[:6]}", f"busy-{uuid.uuid4().hex[:6]}"
    committer = kafka.Consumer(kafka_bootstrap, idle)
    committer.commit({(ready, 0): 0, (ready, 1): 0})
    committer.close()
    member = kafka.Consumer(kafka_bootstrap, busy, [ready])
    try:
        deadline = time.monotonic() + 30
        while busy not in kafka.groups_reading(kafka_bootstrap, ready):
            assert time.monotonic() < deadline, "the busy group never got its partitions"
            member.poll(10, 0.2)
        assert grow(policy, unique, "g", 4).status_code == 204
        look = kafka.Consumer(kafka_bootstrap, idle)
        assert look.committed([(ready, 2), (ready, 3)]) == {(ready, 2): 0, (ready, 3): 0}
        look.close()
        # A group with a member is left to its consumers, who see the partitions when
        # their metadata is refreshed (no commit from outside is taken).
        look = kafka.Consumer(kafka_bootstrap, busy)
        assert all(o < 0 for o in look.committed([(ready, 2), (ready, 3)]).values())
        look.close()
    finally:
        member.close()


def test_an_sdk_consumer_reads_what_the_new_partitions_got_before_it_saw_them(
        policy: httpx.Client, admission: httpx.Client, tracker: Any, unique: str,
        kafka_bootstrap: str) -> None:
    """The consumer starts at the latest offsets, so a partition without a committed
    offset is one added later, read from its start; a publish to `x-partition-3` right
    after the growth is written there (admission refreshes its producer's metadata), and a
    publish to x reaches the new partitions once the producer's metadata is refreshed."""
    make_namespace(policy, unique)
    x = partitioned(policy, unique, "s", 2)
    with Producer(str(x), admission_url=str(admission.base_url)) as p:
        p.send(b"before")  # the consumer starts after it
    c = Consumer(str(x), "sub", bootstrap=kafka_bootstrap, tracker_url=tracker.url)
    try:
        assert grow(policy, unique, "s", 4).status_code == 204
        with Producer(str(x.partition(3)), admission_url=str(admission.base_url)) as p3:
            sent = p3.send(b"on-3")
        assert sent.startswith(f"{x.kafka_topic}:3:"), sent
        got = []
        deadline = time.monotonic() + 40
        while b"on-3" not in got:
            assert time.monotonic() < deadline, f"partition 3 never read: {got}"
            m = c.receive(0.5)
            if m is not None:
                got.append(m.value)
                c.acknowledge(m)
        assert got == [b"on-3"], got
    finally:
        c.close()


def failed_ingress_batches(admission: httpx.Client) -> float:
    return sum(s.value for f in text_string_to_metric_families(ok(admission.get("/metrics")).text)
               if f.name == "dwell_admission_ingress_batches_failed" for s in f.samples
               if s.name.endswith("_total"))


def test_the_kafka_ingress_writes_to_a_new_partition_at_once(
        policy: httpx.Client, admission: httpx.Client, unique: str,
        kafka_bootstrap: str) -> None:
    """The ingress's transactional producer has written to x's 2 partitions; after the
    growth, a request for `x-partition-3` on `dwell.publish` is written there in its first
    transaction (the publisher makes the new partition known to the producer that writes,
    not only to its own), where it used to fail, be aborted and read again until the
    producer's next metadata refresh."""

    make_namespace(policy, unique)
    x = partitioned(policy, unique, "ing", 2)
    wait_ingress(str(admission.base_url))
    name = f"ingress-{unique}"
    p = kafka.Producer(kafka_bootstrap)

    def publish(topic: TopicName, seq: int) -> dict[str, Any]:
        ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
        p.send(names.PUBLISH, orjson.dumps({
            "topic": str(topic), "producerName": name,
            "messages": [{"payload": "x", "sequenceId": seq}]}), str(topic)).result(15)
        got = read_results(kafka_bootstrap, ends, name, 1)
        assert len(got) == 1, got
        return got[0]

    try:
        for i in (0, 1):
            assert publish(x.partition(i), i)["errorCode"] == 0
        assert grow(policy, unique, "ing", 4).status_code == 204
        failed = failed_ingress_batches(admission)
        got = publish(x.partition(3), 3)
        assert got["errorCode"] == 0 and got["messageId"].startswith(f"{x.kafka_topic}:3:"), got
        assert failed_ingress_batches(admission) == failed
    finally:
        p.close()
