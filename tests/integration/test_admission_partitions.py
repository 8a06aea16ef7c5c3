"""Admission and Pulsar's topics, against real Kafka, Redis and the policy service: a
message published to a partition `x-partition-N` of a partitioned topic goes to partition
N of x's ready topic under x's policy (HTTP and the Kafka ingress), and
`DWELL_ALLOW_AUTO_TOPIC_CREATION=false` refuses a topic that does not exist."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell_dev.testkit import make_namespace, ok

pytestmark = pytest.mark.integration

MAX_TEXT = ("org.apache.pulsar.broker.service.BrokerServiceException$NotAllowedException: "
            "Exceeds max allowed delivery delay of {} milliseconds")

PARTITIONS = 3
TOPIC_MAX_MS = 5000  # x's own max delay; the namespace allows far more


@pytest.fixture(scope="module")
def strict_topics(services: Any) -> Iterator[httpx.Client]:
    """An admission that does not create topics on publish."""
    svc = services.start("admission", env={"DWELL_ALLOW_AUTO_TOPIC_CREATION": "false",
                                           "DWELL_INGRESS_ENABLED": "false"})
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        yield c
    svc.stop()


def publish(admission: httpx.Client, topic: str, *messages: dict[str, Any]) -> httpx.Response:
    domain, rest = topic.split("://")
    return admission.post(f"/topics/{domain}/{rest}",
                          json={"producerName": "p", "messages": list(messages)})


def read_record(bootstrap: str, message_id: str) -> kafka.Record:
    topic, partition, offset = message_id.rsplit(":", 2)
    c = kafka.Consumer(bootstrap, f"test-{uuid.uuid4().hex}")
    try:
        c.assign([(topic, int(partition), int(offset))])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            for r in c.poll(10, 0.5):
                if r.offset == int(offset):
                    return r
        raise AssertionError(f"{message_id} not readable")
    finally:
        c.close()


def partitioned_topic(policy: httpx.Client, admission: httpx.Client, tenant: str) -> TopicName:
    """A 3-partition topic created through the policy API, with a topic max delay of 5 s
    (the namespace allows 60 s), once `admission` applies it to x-partition-1."""
    make_namespace(policy, tenant, ns_policy={"active": True, "tickTime": 1000,
                                              "maxDeliveryDelayInMillis": 60000})
    x = TopicName.parse(f"persistent://{tenant}/ns/x")
    ok(policy.put(f"/admin/v2/persistent/{tenant}/ns/x/partitions", json=PARTITIONS))
    ok(policy.post(f"/admin/v2/persistent/{tenant}/ns/x/delayedDelivery",
                   json={"active": True, "tickTime": 1000,
                         "maxDeliveryDelayInMillis": TOPIC_MAX_MS}))
    # x's policy reaches admission through the feed: poll until a delay between x's max
    # and the namespace's is refused on the partition (a refused probe is never stored).
    deadline = time.monotonic() + 15
    while True:
        r = publish(admission, str(x.partition(1)),
                    {"payload": "probe", "deliverAfterMs": TOPIC_MAX_MS + 1000})
        if r.status_code == 200 and r.json()["messagePublishResults"][0]["errorCode"] == 2:
            return x
        assert time.monotonic() < deadline, f"x's policy never reached admission: {r.text}"
        time.sleep(0.1)


def test_a_partition_publishes_to_its_kafka_partition_under_the_topics_policy(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    x = partitioned_topic(policy, admission, f"pt{unique}")
    part = x.partition(1)
    r = ok(publish(admission, str(part),
                   {"payload": "now", "key": "k"},
                   {"payload": "over", "deliverAfterMs": TOPIC_MAX_MS + 1},
                   {"payload": "within", "key": "k2", "deliverAfterMs": TOPIC_MAX_MS}))
    now, over, within = r.json()["messagePublishResults"]

    # Immediate: partition 1 of x's ready topic, never a ready topic of its own.
    assert now["errorCode"] == 0 and not now["delayed"]
    topic, partition, _ = now["messageId"].rsplit(":", 2)
    assert (topic, int(partition)) == (x.kafka_topic, 1)
    rec = read_record(kafka_bootstrap, now["messageId"])
    assert (rec.key, rec.value) == (b"k", b"now")
    assert rec.headers[hdr.TOPIC] == str(x).encode()
    assert kafka.partition_count(kafka_bootstrap, part.kafka_topic) == 0

    # x's max delay holds for its partition.
    assert over == {"messageId": "-1", "errorCode": 2, "schemaVersion": 0,
                    "errorMsg": MAX_TEXT.format(TOPIC_MAX_MS)}

    # Delayed: the delay log, indexed under x, carrying the partition for the drain.
    assert within["errorCode"] == 0 and within["delayed"]
    assert within["messageId"].startswith(f"{names.DELAYED}:")
    rec = read_record(kafka_bootstrap, within["messageId"])
    assert rec.key == str(x).encode()
    assert rec.headers[hdr.PARTITION] == b"1"
    assert rec.headers[hdr.KEY] == b"k2"


def test_a_partition_past_the_topics_count_or_of_a_plain_topic_is_404(
        policy: httpx.Client, admission: httpx.Client, unique: str) -> None:
    tenant = f"pt{unique}"
    x = partitioned_topic(policy, admission, tenant)
    r = publish(admission, str(x.partition(PARTITIONS)), {"payload": "a"})
    assert r.status_code == 404
    assert r.json()["reason"] == (f"Illegal topic partition name {x.partition(PARTITIONS)} "
                                  f"with max allowed {PARTITIONS} partitions")
    ok(policy.put(f"/admin/v2/persistent/{tenant}/ns/plain"))
    plain = TopicName.parse(f"persistent://{tenant}/ns/plain")
    r = publish(admission, str(plain.partition(0)), {"payload": "a"})
    assert r.status_code == 404
    assert r.json()["reason"] == (f"Topic {plain.partition(0)} not found: {plain} is not a "
                                  "partitioned topic")


def test_a_partitioned_topic_of_one_partition_publishes_at_once(
        policy: httpx.Client, admission: httpx.Client, unique: str) -> None:
    """`create-partitioned-topic -p 1`: its ready topic has one Kafka partition, as a
    non-partitioned topic's has, yet `y-partition-0` is a partition of it, and a publish
    right after the create is not refused (admission catches up with the policy feed,
    which carries the topic's mark, before it answers 404)."""
    tenant = f"pt{unique}"
    make_namespace(policy, tenant, ns_policy={"active": True, "tickTime": 1000,
                                              "maxDeliveryDelayInMillis": 60000})
    y = TopicName.parse(f"persistent://{tenant}/ns/y")
    deadline = time.monotonic() + 15
    while publish(admission, f"persistent://{tenant}/ns/probe",
                  {"payload": "p"}).status_code == 404:  # the namespace reaches admission
        assert time.monotonic() < deadline
        time.sleep(0.1)
    ok(policy.put(f"/admin/v2/persistent/{tenant}/ns/y/partitions", json=1))
    r = ok(publish(admission, str(y.partition(0)), {"payload": "now"}))
    topic, partition, _ = r.json()["messagePublishResults"][0]["messageId"].rsplit(":", 2)
    assert (topic, int(partition)) == (y.kafka_topic, 0)
    r = publish(admission, str(y.partition(1)), {"payload": "a"})
    assert (r.status_code, r.json()["reason"]) == (
        404, f"Illegal topic partition name {y.partition(1)} with max allowed 1 partitions")


def test_the_kafka_ingress_publishes_to_the_partition(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    x = partitioned_topic(policy, admission, f"pt{unique}")
    part = str(x.partition(2))
    producer_name = f"ingress-{uuid.uuid4().hex}"
    results = kafka.Consumer(kafka_bootstrap, f"test-{uuid.uuid4().hex}",
                             auto_offset_reset="latest")
    try:
        results.subscribe([names.PUBLISH_RESULTS])
        deadline = time.monotonic() + 15
        while not results.assignment():
            assert time.monotonic() < deadline, "no assignment of dwell.publish.results"
            results.poll(10, 0.2)
        p = kafka.Producer(kafka_bootstrap)
        p.send(names.PUBLISH, orjson.dumps({
            "topic": part, "producerName": producer_name,
            "messages": [{"payload": "a"},
                         {"payload": "b", "deliverAfterMs": TOPIC_MAX_MS + 1}]}),
            key=part).result(10)
        p.close()
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(got) < 2:
            assert time.monotonic() < deadline, f"results: {got}"
            got += [orjson.loads(r.value or b"") for r in results.poll(100, 0.5)
                    if r.key == producer_name.encode()]
    finally:
        results.close()
    by_index = {g["index"]: g for g in got}
    topic, partition, _ = by_index[0]["messageId"].rsplit(":", 2)
    assert (topic, int(partition), by_index[0]["errorCode"]) == (x.kafka_topic, 2, 0)
    assert by_index[1]["errorMsg"] == MAX_TEXT.format(TOPIC_MAX_MS)


def test_without_auto_creation_an_unknown_topic_is_404_and_a_created_one_publishes(
        policy: httpx.Client, strict_topics: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    tenant = f"pt{unique}"
    make_namespace(policy, tenant, ns_policy={"active": True, "tickTime": 1000,
                                              "maxDeliveryDelayInMillis": 60000})
    topic = f"persistent://{tenant}/ns/later"
    deadline = time.monotonic() + 15
    while True:  # until the namespace reaches this admission (404 Namespace … before)
        r = publish(strict_topics, topic, {"payload": "a"})
        if r.json().get("reason") != f"Namespace {tenant}/ns does not exist":
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
    assert r.status_code == 404, r.text
    assert r.json() == {"reason": f"Topic {topic} not found"}
    # Not created by the refused publish, and a partition of it is refused alike.
    assert kafka.partition_count(kafka_bootstrap, TopicName.parse(topic).kafka_topic) == 0
    r = publish(strict_topics, f"{topic}-partition-0", {"payload": "a"})
    assert (r.status_code, r.json()) == (404, {"reason": f"Topic {topic}-partition-0 not found"})

    ok(policy.put(f"/admin/v2/persistent/{tenant}/ns/later"))
    r = ok(publish(strict_topics, topic, {"payload": "a"}, {"payload": "b",
                                                            "deliverAfterMs": 1000}))
    results = r.json()["messagePublishResults"]
    assert [res["errorCode"] for res in results] == [0, 0]
    assert results[0]["messageId"].startswith(TopicName.parse(topic).kafka_topic + ":0:")


def test_pulsars_route_to_one_partition_is_a_publish_to_that_partition(
        policy: httpx.Client, admission: httpx.Client, unique: str) -> None:
    x = partitioned_topic(policy, admission, f"pt{unique}")
    base = f"/topics/persistent/{x.tenant}/{x.namespace}/{x.local}"
    r = ok(admission.post(f"{base}/partitions/1", json={"messages": [
        {"payload": "now"}, {"payload": "over", "deliverAfterMs": TOPIC_MAX_MS + 1}]}))
    now, over = r.json()["messagePublishResults"]
    topic, partition, _ = now["messageId"].rsplit(":", 2)
    assert (topic, int(partition), now["errorCode"]) == (x.kafka_topic, 1, 0)
    assert over["errorMsg"] == MAX_TEXT.format(TOPIC_MAX_MS)

    r = admission.post(f"{base}/partitions/{PARTITIONS}", json={"messages": [{"payload": "a"}]})
    assert r.status_code == 404
    assert r.json()["reason"].startswith(f"Illegal topic partition name {x.partition(PARTITIONS)}")
    r = admission.post(f"{base}-partition-0/partitions/1", json={"messages": [{"payload": "a"}]})
    assert (r.status_code, r.json()) == (400, {
        "reason": "Topic name can't contain '-partition-' suffix."})
    r = admission.post(f"{base}/partitions/one", json={"messages": [{"payload": "a"}]})
    assert r.status_code == 400 and "partition" in r.json()["reason"]

