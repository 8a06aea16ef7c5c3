"""Admission against real Kafka, Redis and the real policy service: the publish rule over
HTTP and over the Kafka ingress, the records it writes, its counters, and how fast a
policy change reaches it."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dwell.adapters import kafka
from dwell.client import AsyncProducer, Consumer, Producer
from dwell.core import topics as names
from dwell_dev.testkit import (
    make_namespace,
    now_ms,
    ok,
    read_results,
    read_until,
    wait_for,
    wait_ingress,
)

pytestmark = pytest.mark.integration

MAX_TEXT = ("org.apache.pulsar.broker.service.BrokerServiceException$NotAllowedException: "
            "Exceeds max allowed delivery delay of {} milliseconds")


def publish(admission: httpx.Client, topic: str, *messages: dict[str, Any],
            producer: str = "p") -> httpx.Response:
    domain, rest = topic.split("://")
    return admission.post(f"/topics/{domain}/{rest}",
                          json={"producerName": producer, "messages": list(messages)})


def policy_version(policy: httpx.Client) -> int:
    """The policy service's latest version: its last change's, or the store's newer one."""
    for family in text_string_to_metric_families(ok(policy.get("/metrics")).text):
        for sample in family.samples:
            if sample.name == "dwell_policy_version":
                return int(sample.value)
    raise AssertionError("the policy service exports no dwell_policy_version")


def wait_until_known(policy: httpx.Client, admission: httpx.Client, topic: str,
                     probe: dict[str, Any]) -> None:
    """Wait until admission has applied every policy change made so far (the feed is one
    ordered partition, so the namespace and its policy are then both in force), then
    probe the topic once (which also creates its ready topic)."""
    version = policy_version(policy)
    deadline = time.monotonic() + 10
    while admission.get("/readyz").json().get("policyVersionApplied", 0) < version:
        assert time.monotonic() < deadline, f"admission has not applied version {version}"
        time.sleep(0.05)
    ok(publish(admission, topic, probe))


def counter(admission: httpx.Client, name: str, topic: str) -> float:
    for family in text_string_to_metric_families(ok(admission.get("/metrics")).text):
        for s in family.samples:
            if s.name == name and s.labels.get("topic") == topic:
                return s.value
    return 0.0


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


REJECTED = "pulsar_broker_topic_messages_delayed_rejected_total"
OVERRIDDEN = "pulsar_broker_topic_messages_fixed_delay_overridden_total"


def test_max_delay_rejects_max_plus_one_and_accepts_max(policy: httpx.Client,
                                                        admission: httpx.Client,
                                                        kafka_bootstrap: str,
                                                        unique: str) -> None:
    make_namespace(policy, unique, ns_policy={"active": True, "maxDeliveryDelayInMillis": 5000})
    topic = f"persistent://{unique}/ns/orders"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    before = counter(admission, REJECTED, topic)
    # deliverAfterMs counts from when admission receives the message, so the boundary is
    # exact whatever the time between this clock and admission's.
    t = now_ms()
    r = ok(publish(admission, topic,
                   {"payload": "late", "deliverAfterMs": 5001},
                   {"payload": "ok", "key": "k1", "deliverAfterMs": 5000,
                    "properties": {"color": "red"}, "sequenceId": 3})).json()
    after = now_ms()
    rejected, accepted = r["messagePublishResults"]
    # Pulsar's ProducerAcks / ProducerAck
    assert r["schemaVersion"] == 0
    assert rejected == {"messageId": "-1", "errorCode": 2, "schemaVersion": 0,
                        "errorMsg": MAX_TEXT.format(5000)}
    assert counter(admission, REJECTED, topic) == before + 1
    assert accepted["errorCode"] == 0 and accepted["delayed"] is True
    assert accepted["schemaVersion"] == 0 and "errorMsg" not in accepted
    assert t + 5000 <= accepted["deliverAt"] <= after + 5000
    assert accepted["messageId"].startswith(names.DELAYED + ":")
    rec = read_record(kafka_bootstrap, accepted["messageId"])
    assert rec.key == topic.encode() and rec.value == b"ok"
    assert rec.header("dwell-deliver-at") == str(accepted["deliverAt"])
    assert rec.header("dwell-tick-time") == "1000"
    assert rec.header("dwell-key") == "k1"
    assert rec.header("dwell-topic") == topic
    assert rec.header("dwell-publish-time") == str(accepted["deliverAt"] - 5000)
    assert rec.timestamp_ms == accepted["deliverAt"] - 5000
    assert rec.header("dwell-producer") == "p"
    assert rec.header("dwell-sequence-id") == "3"
    assert rec.header("color") == "red"


def test_fixed_delay_overrides_and_delays_everything(policy: httpx.Client,
                                                     admission: httpx.Client,
                                                     unique: str) -> None:
    make_namespace(policy, unique, ns_policy={"active": True, "maxDeliveryDelayInMillis": 1000})
    topic = f"persistent://{unique}/ns/fx"
    ok(policy.put(f"/admin/v2/persistent/{unique}/ns/fx"))
    ok(policy.post(f"/admin/v2/persistent/{unique}/ns/fx/delayedDelivery",
                   json={"fixedDeliveryDelayInMillis": 60000}))
    t = now_ms()
    wait_until_known(policy, admission, f"persistent://{unique}/ns/probe", {"payload": "probe"})
    # The topic policy may land a moment after the namespace: poll for the override.
    deadline = time.monotonic() + 5
    before = counter(admission, OVERRIDDEN, topic)
    while True:
        res = ok(publish(admission, topic, {"payload": "a", "eventTime": t})).json()
        if res["messagePublishResults"][0]["delayed"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # The fixed delay counts from when admission received the message, not its eventTime.
    assert t + 60000 <= res["messagePublishResults"][0]["deliverAt"] <= now_ms() + 60000
    assert counter(admission, OVERRIDDEN, topic) == before  # no deliverAt: not counted
    t = now_ms()
    r = ok(publish(admission, topic, {"payload": "b", "eventTime": 1, "deliverAt": t + 999999},
                   {"payload": "c", "eventTime": 1})).json()["messagePublishResults"]
    assert r[0]["deliverAt"] == r[1]["deliverAt"]
    assert t + 60000 <= r[0]["deliverAt"] <= now_ms() + 60000
    assert all(m["delayed"] and m["messageId"].startswith(names.DELAYED) for m in r)
    assert counter(admission, OVERRIDDEN, topic) == before + 1


def test_disabled_namespace_and_non_persistent_are_immediate(policy: httpx.Client,
                                                             admission: httpx.Client,
                                                             kafka_bootstrap: str,
                                                             unique: str) -> None:
    make_namespace(policy, unique, ns_policy={"active": False})
    topic = f"persistent://{unique}/ns/off"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    r = ok(publish(admission, topic, {"payload": "x", "key": "k", "deliverAfterMs": 60000})
           ).json()["messagePublishResults"][0]
    assert r["delayed"] is False and r["deliverAt"] is None
    assert r["delayIgnored"] == "delayed delivery is disabled for this topic"
    assert r["messageId"].startswith(f"{unique}.ns.off:")
    rec = read_record(kafka_bootstrap, r["messageId"])
    assert rec.key == b"k" and rec.header("dwell-deliver-at") is None

    np = ok(publish(admission, f"non-persistent://{unique}/ns/np",
                    {"payload": "y", "deliverAfterMs": 60000})).json()["messagePublishResults"][0]
    assert np["delayed"] is False and "non-persistent" in np["delayIgnored"]
    assert np["messageId"].startswith(f"non-persistent.{unique}.ns.np:")


def test_topic_policy_overrides_namespace_field_by_field(policy: httpx.Client,
                                                         admission: httpx.Client,
                                                         kafka_bootstrap: str,
                                                         unique: str) -> None:
    make_namespace(policy, unique, ns_policy={"active": True, "tickTime": 500,
                                              "maxDeliveryDelayInMillis": 5000})
    ok(policy.put(f"/admin/v2/persistent/{unique}/ns/big"))
    ok(policy.post(f"/admin/v2/persistent/{unique}/ns/big/delayedDelivery",
                   json={"maxDeliveryDelayInMillis": 10000}))
    topic = f"persistent://{unique}/ns/big"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    t = now_ms()
    deadline = time.monotonic() + 5
    while True:
        r = ok(publish(admission, topic, {"payload": "a", "eventTime": t,
                                          "deliverAt": t + 7000})).json()
        res = r["messagePublishResults"][0]
        if res["errorCode"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert res["errorCode"] == 0 and res["delayed"] is True
    # tickTime is still the namespace's; the other topic of the namespace keeps max 5000
    assert read_record(kafka_bootstrap, res["messageId"]).header("dwell-tick-time") == "500"
    other = ok(publish(admission, f"persistent://{unique}/ns/small",
                       {"payload": "a", "eventTime": t, "deliverAt": t + 7000})).json()
    assert other["messagePublishResults"][0]["errorMsg"] == MAX_TEXT.format(5000)


def test_policy_change_in_force_within_one_second(policy: httpx.Client,
                                                  admission: httpx.Client,
                                                  unique: str) -> None:
    make_namespace(policy, unique, ns_policy={"active": True})
    topic = f"persistent://{unique}/ns/live"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    for limit in (2000, 30000, 1000):
        ok(policy.post(f"/admin/v2/namespaces/{unique}/ns/delayedDelivery",
                       json={"maxDeliveryDelayInMillis": limit}))
        changed = time.monotonic()
        while True:
            r = ok(publish(admission, topic, {"payload": "p",
                                              "deliverAfterMs": limit + 1})).json()
            err = r["messagePublishResults"][0].get("errorMsg")
            if err == MAX_TEXT.format(limit):
                break
            assert time.monotonic() - changed < 1.0, f"max {limit} not in force after 1 s"
        assert time.monotonic() - changed < 1.0


def test_request_errors(policy: httpx.Client, admission: httpx.Client, unique: str) -> None:
    for domain in ("persistent", "non-persistent"):
        r = admission.post(f"/topics/{domain}/{unique}/nope/x",
                           json={"messages": [{"payload": "a"}]})
        assert r.status_code == 404 and "does not exist" in r.json()["reason"]
    make_namespace(policy, unique)
    topic = f"persistent://{unique}/ns/bad"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    bad = publish(admission, topic, {"payload": "a", "deliverAt": "soon"})
    assert bad.status_code == 400
    assert bad.json()["reason"] == "messages[0].deliverAt: must be an integer"
    too_many = publish(admission, topic, *[{"payload": "a"}] * 1001)
    assert too_many.status_code == 400 and too_many.json()["reason"].startswith("messages:")
    mixed = ok(publish(admission, topic, {"payload": "a", "deliverAt": 1, "deliverAfterMs": 1},
                       {"payload": "%%", "payloadEncoding": "base64"},
                       {"payload": "aGk=", "payloadEncoding": "base64"})).json()
    # Both delays set: deliverAt is used, as by Pulsar's producers.
    codes = [m["errorCode"] for m in mixed["messagePublishResults"]]
    assert codes == [0, 2, 0]
    assert mixed["messagePublishResults"][0]["deliverAt"] == 1


def test_pulsar_rest_bodies_are_read_as_pulsar_reads_them(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    """What Pulsar's REST producer accepts is accepted: Pulsar's own fields (schemas,
    replication, encryption, compression, context), eventTime as a string, unknown
    fields, and no messages at all (200, no results)."""
    make_namespace(policy, unique, ns_policy={"active": True, "maxDeliveryDelayInMillis": 5000})
    topic = f"persistent://{unique}/ns/lenient"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    path = f"/topics/persistent/{unique}/ns/lenient"
    empty = ok(admission.post(path, json={"producerName": "p", "messages": []})).json()
    assert empty == {"messagePublishResults": [], "schemaVersion": 0}
    old = now_ms() - 3_600_000  # an hour-old eventTime neither rejects nor shortens a delay
    body = {"schemaVersion": -1, "keySchema": None, "valueSchema": None, "producerName": "p",
            "somethingNewer": {"x": 1},
            "messages": [{"payload": "hi", "properties": {"a": "b"}, "context": "ctx-1",
                          "key": "k", "replicationClusters": ["standalone"],
                          "eventTime": str(old), "sequenceId": 0, "disableReplication": False,
                          "deliverAt": 0, "deliverAfterMs": 4000, "schemaVersion": 0,
                          "keySchema": None, "valueSchema": None, "encryptionParam": None,
                          "compressionType": "NONE", "uncompressedMessageSize": None,
                          "colour": "red"}]}
    t = now_ms()
    r = ok(admission.post(path, json=body)).json()
    (res,) = r["messagePublishResults"]
    assert res["errorCode"] == 0 and res["delayed"] is True, res
    assert t + 4000 <= res["deliverAt"] <= now_ms() + 4000
    rec = read_record(kafka_bootstrap, res["messageId"])
    assert rec.header("dwell-event-time") == str(old)
    assert t <= int(rec.header("dwell-publish-time")) <= now_ms()
    bad = admission.post(path, json={"messages": [{"payload": "x", "eventTime": "noon"}]})
    assert bad.status_code == 400 and bad.json()["reason"].startswith("messages[0].eventTime")


def test_the_sdk_round_trip_keeps_event_time_apart_from_publish_time(
        services: Any, policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    make_namespace(policy, unique)
    topic = f"persistent://{unique}/ns/sdk"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    tracker = services.start("tracker")  # the Consumer registers its subscription there
    old = now_ms() - 86_400_000
    try:
        with Consumer(topic, "s", initial_position="earliest", bootstrap=kafka_bootstrap,
                      tracker_url=tracker.url) as consumer, \
                Producer(topic, admission_url=str(admission.base_url)) as producer:
            t = now_ms()
            producer.send(b"evt", event_time=old)
            got = consumer.receive(15)
            while got is not None and got.value != b"evt":
                got = consumer.receive(15)
    finally:
        tracker.stop()
    assert got is not None
    assert got.event_time == old
    assert got.publish_time is not None and t <= got.publish_time <= now_ms()


@pytest.mark.parametrize("ack_timeout_ms", [0, 60000])
def test_the_sdk_sends_a_delivered_event_only_to_start_an_ack_timeout(
        services: Any, policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str, ack_timeout_ms: int) -> None:
    """A delivered event starts the ack timeout's clock; without an ack timeout it would
    schedule nothing (dwell_spark.decisions.decide), so the SDK sends none: one write per
    received message, and one event for the backoff to read, saved. Acks always go."""
    make_namespace(policy, unique)
    topic = f"persistent://{unique}/ns/events{ack_timeout_ms}"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    ends = kafka.end_offsets(kafka_bootstrap, names.ACKS)
    tracker = services.start("tracker")
    try:
        with Consumer(topic, "s", initial_position="earliest", bootstrap=kafka_bootstrap,
                      tracker_url=tracker.url, ack_timeout_ms=ack_timeout_ms) as consumer, \
                Producer(topic, admission_url=str(admission.base_url)) as producer:
            mid = producer.send(b"evt")
            got = consumer.receive(15)
            while got is not None and got.message_id != mid:
                got = consumer.receive(15)
            assert got is not None
            consumer.acknowledge(got)
    finally:
        tracker.stop()
    mine = [orjson.loads(r.value) for r in kafka.read_from(kafka_bootstrap, names.ACKS, ends)
            if r.key == f"{topic}/s".encode()]
    kinds = [(e["event"], e["messageId"]) for e in mine if e["messageId"] == mid]
    assert kinds == ([("ack", mid)] if ack_timeout_ms == 0
                     else [("delivered", mid), ("ack", mid)]), kinds


def test_the_async_sdk_publishes_many_sends_from_one_loop(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    """200 sends of one AsyncProducer in flight at once from one event loop, every third
    delayed: 200 distinct ids, and each id names the record written, with the message's
    payload, key and the sequence id it was sent with (ids taken in the order of the
    sends)."""
    make_namespace(policy, unique, ns_policy={"active": True})
    topic = f"persistent://{unique}/ns/async"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    ready = names.TopicName.parse(topic).kafka_topic
    starts = {t: kafka.end_offsets(kafka_bootstrap, t) for t in (ready, names.DELAYED)}
    producer_name = f"async-{unique}"
    n = 200

    async def run() -> list[str]:
        async with AsyncProducer(topic, producer_name=producer_name,
                                 admission_url=str(admission.base_url)) as p:
            return await asyncio.gather(*(
                p.send(f"m{i}".encode(), key=f"k{i}",
                       deliver_after=60_000 if i % 3 == 0 else None) for i in range(n)))

    ids = asyncio.run(run())
    assert len(set(ids)) == n
    for i, mid in enumerate(ids):
        assert mid.startswith(f"{names.DELAYED if i % 3 == 0 else ready}:"), (i, mid)
    written = {f"{r.topic}:{r.partition}:{r.offset}": r
               for t, ends in starts.items()
               for r in kafka.read_from(kafka_bootstrap, t, ends)}
    for i, mid in enumerate(ids):
        rec = written.get(mid)
        assert rec is not None, f"{mid} not readable"
        assert rec.value == f"m{i}".encode()
        assert rec.header("dwell-producer") == producer_name
        assert rec.header("dwell-sequence-id") == str(i)
        if i % 3 == 0:
            assert rec.key == topic.encode() and rec.header("dwell-key") == f"k{i}"
            assert rec.header("dwell-deliver-at") is not None
        else:
            assert rec.key == f"k{i}".encode() and rec.header("dwell-deliver-at") is None



def test_a_topic_whose_kafka_name_collides_is_refused_with_409(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    """`<t>/ns/a_b` and `<t>/ns_a/b` map to Kafka topics `<t>.ns.a_b` and `<t>.ns_a.b`,
    which Kafka takes for the same name: the second is refused for good (409, not a
    retriable 503), delayed messages included, and over the ingress it is one request's
    error rather than a batch retried forever."""
    make_namespace(policy, unique)
    ok(policy.put(f"/admin/v2/namespaces/{unique}/ns_a"))
    first = f"persistent://{unique}/ns/a_b"
    wait_until_known(policy, admission, first, {"payload": "probe"})
    second = f"persistent://{unique}/ns_a/b"
    for message in ({"payload": "now"}, {"payload": "later", "deliverAfterMs": 60000}):
        r = publish(admission, second, message)
        assert r.status_code == 409, (r.status_code, r.text)
        reason = r.json()["reason"]
        assert f"{unique}.ns_a.b" in reason and "collides" in reason, reason
    ok(publish(admission, first, {"payload": "still fine"}))

    wait_ingress(str(admission.base_url))
    producer_name = f"prod-{unique}"
    ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    p = kafka.Producer(kafka_bootstrap)
    for topic, seq in ((second, 1), (first, 2)):
        p.send(names.PUBLISH, orjson.dumps({"topic": topic, "producerName": producer_name,
                                            "messages": [{"payload": "x", "sequenceId": seq}]}),
               topic).result(15)
    p.close()
    got = {res["sequenceId"]: res
           for res in read_results(kafka_bootstrap, ends, producer_name, 2)}
    assert got[1]["errorCode"] == 2 and "collides" in got[1]["errorMsg"], got
    assert got[1]["messageId"] == "-1" and got[1]["schemaVersion"] == 0
    assert got[2]["errorCode"] == 0 and got[2]["messageId"].startswith(f"{unique}.ns.a_b:")


def via_first(got: dict[tuple[str, int | None], dict[str, Any]]) -> str:
    """The request id of the 4-message request (the other one has a single result)."""
    ids = [rid for rid, _ in got]
    return max(set(ids), key=ids.count)


def test_kafka_ingress_gives_the_same_results_as_http(policy: httpx.Client,
                                                      admission: httpx.Client,
                                                      kafka_bootstrap: str,
                                                      unique: str) -> None:
    make_namespace(policy, unique, ns_policy={"active": True, "maxDeliveryDelayInMillis": 5000})
    topic = f"persistent://{unique}/ns/kin"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    wait_ingress(str(admission.base_url))
    t = now_ms()
    messages = [{"payload": "a", "eventTime": t, "deliverAfterMs": 5001, "sequenceId": 1},
                {"payload": "b", "eventTime": t, "deliverAt": t + 4000, "sequenceId": 2},
                {"payload": "c", "eventTime": t, "sequenceId": 3},
                {"payload": "d", "deliverAt": 1, "deliverAfterMs": 1, "sequenceId": 4}]
    via_http = ok(publish(admission, topic, *messages)).json()["messagePublishResults"]

    producer_name = f"prod-{unique}"
    ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    p = kafka.Producer(kafka_bootstrap)
    p.send(names.PUBLISH, orjson.dumps({"topic": topic, "producerName": producer_name,
                                        "messages": messages}), topic).result(15)
    p.send(names.PUBLISH, orjson.dumps({"topic": f"persistent://{unique}/nope/x",
                                        "producerName": producer_name,
                                        "messages": [{"payload": "z", "sequenceId": 9}]}),
           topic).result(15)
    ghost = f"ghost{unique}"  # no such tenant: no results topic is made for it
    p.send(names.PUBLISH, orjson.dumps({"topic": f"persistent://{ghost}/ns/x",
                                        "producerName": producer_name,
                                        "messages": [{"payload": "g", "sequenceId": 10}]}),
           topic).result(15)
    p.close()

    # Any admission replica in the shared `dwell-admission` group may answer (other
    # suites run their own), so results are matched by request id, not by process.
    got = {(res["requestId"], res["index"]): res
           for res in read_results(kafka_bootstrap, ends, producer_name, 6)}
    assert len(got) == 6, got
    # The tenant's own copy of its planned requests' results, which only its principals
    # may read on a secured Kafka; a request refused whole is not vouched for: none.
    own = read_until(kafka_bootstrap, names.tenant_results_topic(unique), {0: 0},
                     lambda rs: len(rs) >= 4)
    mine = {k: v for k, v in got.items() if v["sequenceId"] != 10}
    assert sorted(orjson.loads(r.value)["sequenceId"] for r in own) == [1, 2, 3, 4]
    assert {r.key for r in own} == {producer_name.encode()} and len(mine) == 5
    assert names.tenant_results_topic(ghost) not in kafka.topic_names(kafka_bootstrap)
    got = mine
    ordered = sorted(got.values(), key=lambda m: (m["requestId"] != via_first(got),
                                                  m["index"] or 0))
    via_kafka, unknown = ordered[:4], ordered[4]
    assert [m["sequenceId"] for m in via_kafka] == [1, 2, 3, 4]
    strip = {"messageId", "sequenceId", "index", "requestId", "topic"}
    assert ([{k: v for k, v in m.items() if k not in strip} for m in via_kafka]
            == [{k: v for k, v in m.items() if k not in strip} for m in via_http])
    assert via_kafka[1]["messageId"].startswith(names.DELAYED + ":")
    assert via_kafka[0]["errorMsg"] == MAX_TEXT.format(5000)
    assert via_kafka[0]["messageId"] == "-1" and via_kafka[3]["deliverAt"] == 1
    assert {m["requestId"] for m in via_kafka} == {via_kafka[0]["requestId"]}
    assert unknown["sequenceId"] == 9 and unknown["errorCode"] == 2
    assert "does not exist" in unknown["errorMsg"] and unknown["messageId"] == "-1"
    rec = read_record(kafka_bootstrap, via_kafka[2]["messageId"])
    assert rec.value == b"c" and rec.header("dwell-producer") == producer_name


def test_readyz_reports_the_policy_version(admission: httpx.Client) -> None:
    body = ok(admission.get("/readyz")).json()
    assert body["ready"] is True and body["policyVersionApplied"] > 0
    gauge = [s.value for f in text_string_to_metric_families(admission.get("/metrics").text)
             for s in f.samples if s.name == "dwell_policy_version_applied"]
    # Other suites may change policies meanwhile: the gauge can only have moved up.
    assert gauge and gauge[0] >= body["policyVersionApplied"]


def publish_until_written(admission: httpx.Client, topic: str, payload: str) -> dict[str, Any]:
    """Publish one message until it is written (503s, which a client retries, are allowed
    for 60 s); its result."""
    deadline = time.monotonic() + 60
    statuses: list[int] = []
    while True:
        r = publish(admission, topic, {"payload": payload})
        statuses.append(r.status_code)
        if r.status_code == 200:
            return dict(r.json()["messagePublishResults"][0])
        assert r.status_code == 503, r.text
        assert time.monotonic() < deadline, statuses
        time.sleep(0.5)


def test_a_deleted_topic_is_made_again_by_a_later_publish(policy: httpx.Client,
                                                           admission: httpx.Client,
                                                           kafka_bootstrap: str,
                                                           unique: str) -> None:
    """`topics delete` removes the ready topic. As in Pulsar with allowAutoTopicCreation,
    a later publish makes it again, over HTTP and over the Kafka ingress: a replica that
    had routed to it does not fail for good."""
    make_namespace(policy, unique)
    topic = f"persistent://{unique}/ns/gone"
    ready = f"{unique}.ns.gone"
    wait_until_known(policy, admission, topic, {"payload": "probe"})
    wait_ingress(str(admission.base_url))

    def delete() -> None:
        # An auto-created ready topic has ready_topic_partitions partitions: a
        # partitioned topic to Pulsar's tools.
        assert policy.delete(f"/admin/v2/persistent/{unique}/ns/gone/partitions"
                             ).status_code == 204
        wait_for(lambda: ready not in kafka.topic_names(kafka_bootstrap), 30,
                 f"{ready} deleted")

    delete()
    written = publish_until_written(admission, topic, "after")
    assert read_record(kafka_bootstrap, written["messageId"]).value == b"after"

    delete()
    producer_name = f"prod-{unique}"
    ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    p = kafka.Producer(kafka_bootstrap)
    p.send(names.PUBLISH, orjson.dumps({"topic": topic, "producerName": producer_name,
                                        "messages": [{"payload": "via-kafka"}]}),
           topic).result(15)
    p.close()
    results = read_results(kafka_bootstrap, ends, producer_name, 1, timeout=90)
    assert len(results) == 1 and "errorMsg" not in results[0], results
    assert read_record(kafka_bootstrap, results[0]["messageId"]).value == b"via-kafka"
