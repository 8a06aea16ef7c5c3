"""The shared publish path without a broker: request validation, the per-message rule,
routing and headers, and the 503 when Kafka cannot acknowledge (a real client aimed at a
closed port)."""

from __future__ import annotations

import asyncio
import base64
import sys
import weakref
from collections.abc import Iterator
from concurrent.futures import Future

import orjson
import pytest

from dwell.adapters import kafka
from dwell.admission.plan import Plan
from dwell.admission.publish import Publisher
from dwell.admission.schema import (
    PublishError,
    PublishRequest,
    parse_request,
)
from dwell.admission.settings import AdmissionSettings
from dwell.core import topics as names
from dwell.policy_view import PolicyCache

NOW_MS = 1_700_000_000_000
DEAD_KAFKA = "127.0.0.1:1"


@pytest.fixture()
def publisher() -> Iterator[Publisher]:
    settings = AdmissionSettings(kafka_bootstrap=DEAD_KAFKA, max_payload_bytes=10,
                                 max_messages_per_request=3, publish_timeout_ms=1000)
    cache = PolicyCache(settings.broker_defaults())
    for scope in ("tenant:acme", "namespace:acme/ns", "namespace:acme/fixed",
                  "namespace:acme/off"):
        cache.apply(scope, orjson.dumps({"version": 1, "scope": scope}), {})
    cache.apply("ns:acme/ns", orjson.dumps({"version": 2, "policy": {
        "maxDeliveryDelayInMillis": 5000}}), {})
    cache.apply("ns:acme/fixed", orjson.dumps({"version": 3, "policy": {
        "fixedDeliveryDelayInMillis": 60000}}), {})
    cache.apply("ns:acme/off", orjson.dumps({"version": 4, "policy": {"active": False}}), {})
    cache.ready.set()
    producer = kafka.Producer(DEAD_KAFKA, poll_in_background=False,
                              **{"message.timeout.ms": 1000})
    yield Publisher(settings, cache, producer, clock=lambda: NOW_MS / 1000)
    producer.close(0.1)


def body(*messages: dict[str, object], **extra: object) -> bytes:
    return orjson.dumps({"producerName": "p1", "messages": list(messages), **extra})


def plan(pub: Publisher, topic: str, raw: bytes):  # type: ignore[no-untyped-def]
    t = names.TopicName.parse(topic)
    return pub.plan(pub.topic(t.domain, t.tenant, t.namespace, t.local),
                    parse_request(raw, PublishRequest))


@pytest.mark.parametrize(("raw", "status", "field"), [
    (body({"payload": "x" * 11}), 400, "messages[0].payload: 11 bytes"),
    (body({"payload": base64.b64encode(b"y" * 11).decode(), "payloadEncoding": "base64"}), 400,
     "messages[0].payload"),
    (body(*[{"payload": "x"}] * 4), 400, "messages: 4 messages"),
    (body({"payload": "x", "eventTime": "9223372036854775808"}), 400,
     "messages[0].eventTime: 9223372036854775808 is past Long.MAX_VALUE"),
    (body({"payload": "x", "properties": {"dwell-topic": "x"}}), 400,
     "messages[0].properties.dwell-topic"),
])
def test_request_limits(publisher: Publisher, raw: bytes, status: int, field: str) -> None:
    with pytest.raises(PublishError) as err:
        plan(publisher, "persistent://acme/ns/x", raw)
    assert err.value.status == status
    assert field in err.value.reason


def test_no_messages_is_an_empty_answer(publisher: Publisher) -> None:
    # Pulsar answers 200 with no results (and writes nothing, so Kafka is not asked).
    t = publisher.topic("persistent", "acme", "ns", "x")
    assert asyncio.run(publisher.publish(t, body())) == (
        b'{"messagePublishResults":[],"schemaVersion":0}')


def test_unknown_namespace_and_tenant_are_404_on_both_domains(publisher: Publisher) -> None:
    for topic in ("persistent://acme/nope/x", "non-persistent://nobody/ns/x"):
        with pytest.raises(PublishError) as err:
            plan(publisher, topic, body({"payload": "x"}))
        assert err.value.status == 404


def test_a_miss_is_answered_only_after_a_catch_up(publisher: Publisher) -> None:
    """404 once the policy feed was caught up with and the namespace is still unknown;
    503 (retriable) when the catch-up could not be done, never a 404 unvouched for."""
    asked: list[bool] = []

    def catch_up(result: bool) -> Future[bool]:
        asked.append(result)
        fut: Future[bool] = Future()
        fut.set_result(result)
        return fut

    topic = names.TopicName.parse("persistent://acme/nope/x")
    for result, status in ((True, 404), (False, 503)):
        publisher.catch_up = lambda result=result: catch_up(result)
        with pytest.raises(PublishError) as err:
            asyncio.run(publisher.publish(topic, body({"payload": "x"})))
        assert err.value.status == status, err.value.reason
    assert asked == [True, False]
    assert "policy_catch_up_timeout_ms" in err.value.reason
    # A known namespace asks nothing: its request is refused here for a bad body.
    with pytest.raises(PublishError) as err:
        asyncio.run(publisher.publish(names.TopicName.parse("persistent://acme/ns/x"),
                                      b"{}"))
    assert err.value.status == 400 and asked == [True, False]


def test_per_message_errors_keep_the_rest_of_the_batch(publisher: Publisher) -> None:
    p = plan(publisher, "persistent://acme/ns/x", body(
        {"payload": "a", "deliverAt": NOW_MS + 5001},
        {"payload": "!!", "payloadEncoding": "base64"},
        {"payload": "c", "deliverAfterMs": 2000}))
    # Pulsar's ProducerAck for a message not published: messageId -1 and an errorMsg.
    assert p.results[0] == {
        "messageId": "-1", "errorCode": 2, "schemaVersion": 0,
        "errorMsg": "org.apache.pulsar.broker.service.BrokerServiceException$"
                    "NotAllowedException: Exceeds max allowed delivery delay of 5000 "
                    "milliseconds"}
    assert p.results[1] == {"messageId": "-1", "errorCode": 2, "schemaVersion": 0,
                            "errorMsg": "payload is not valid base64"}
    assert p.results[2] == {"errorCode": 0, "schemaVersion": 0, "deliverAt": NOW_MS + 2000,
                            "delayed": True}
    assert [i for i in p.index] == [2]


def test_deliver_at_wins_over_deliver_after_ms_and_zero_is_not_set(
        publisher: Publisher) -> None:
    # As Pulsar's producers: deliverAt when both are set. A Java client serialising
    # ProducerMessage sends both, the one it does not use as 0.
    p = plan(publisher, "persistent://acme/ns/x", body(
        {"payload": "a", "deliverAt": NOW_MS + 3000, "deliverAfterMs": 60_000},
        {"payload": "b", "deliverAt": 0, "deliverAfterMs": 4000},
        {"payload": "c", "deliverAt": 0, "deliverAfterMs": 0}))
    assert [(r["deliverAt"], r["delayed"]) for r in p.results] == [
        (NOW_MS + 3000, True), (NOW_MS + 4000, True), (None, False)]


def test_delays_count_from_when_admission_receives_the_message(publisher: Publisher) -> None:
    """Pulsar's publishTime is the broker's clock; eventTime is the application's own
    field. An old eventTime neither gets a message rejected nor shortens its delay."""
    old = NOW_MS - 60_000
    p = plan(publisher, "persistent://acme/ns/x", body(
        {"payload": "a", "deliverAt": NOW_MS + 4000, "eventTime": old},
        {"payload": "b", "deliverAfterMs": 4000, "eventTime": str(old)},
        {"payload": "c", "deliverAfterMs": 4000, "eventTime": NOW_MS + 60_000}))
    assert [(r["errorCode"], r["deliverAt"], r["delayed"]) for r in p.results] == [
        (0, NOW_MS + 4000, True)] * 3
    assert [s[4] for s in p.sends] == [NOW_MS] * 3
    assert [dict(s[3])["dwell-publish-time"] for s in p.sends] == [str(NOW_MS).encode()] * 3
    assert [dict(s[3])["dwell-event-time"] for s in p.sends] == [
        str(old).encode(), str(old).encode(), str(NOW_MS + 60_000).encode()]
    fixed = plan(publisher, "persistent://acme/fixed/x", body({"payload": "a",
                                                              "eventTime": old}))
    assert fixed.results[0]["deliverAt"] == NOW_MS + 60_000


def test_pulsars_fields_and_unknown_ones_are_accepted_and_dropped(publisher: Publisher) -> None:
    p = plan(publisher, "persistent://acme/ns/x", body(
        {"payload": "a", "context": "c1", "replicationClusters": ["standalone"],
         "disableReplication": True, "encryptionParam": "aXY=", "compressionType": "LZ4",
         "uncompressedMessageSize": 1, "schemaVersion": 0, "keySchema": None,
         "valueSchema": "eyJ0eXBlIjoiU1RSSU5HIn0=", "eventTime": "", "colour": "red"},
        schemaVersion=-1, keySchema=None, valueSchema=None, somethingNew=[1]))
    ((topic, value, key, headers, _),) = p.sends
    assert (topic, value, key) == ("acme.ns.x", b"a", None)
    assert sorted(dict(headers)) == ["dwell-producer", "dwell-publish-time", "dwell-topic"]


def test_routing_and_headers(publisher: Publisher) -> None:
    p = plan(publisher, "persistent://acme/ns/x", body(
        {"payload": "now", "key": "k1", "properties": {"a": "1"}, "sequenceId": 7},
        {"payload": "later", "key": "k2", "deliverAfterMs": 5000, "eventTime": NOW_MS - 10}))
    (t0, v0, k0, h0, ts0), (t1, v1, k1, h1, ts1) = p.sends
    assert (t0, k0, v0, ts0) == ("acme.ns.x", b"k1", b"now", NOW_MS)
    assert dict(h0 or []) == {"a": b"1", "dwell-topic": b"persistent://acme/ns/x",
                  "dwell-publish-time": str(NOW_MS).encode(), "dwell-producer": b"p1",
                  "dwell-sequence-id": b"7"}
    assert (t1, k1, v1, ts1) == (names.DELAYED, b"persistent://acme/ns/x", b"later", NOW_MS)
    h1d = dict(h1 or [])
    assert h1d["dwell-deliver-at"] == str(NOW_MS + 5000).encode()
    assert h1d["dwell-event-time"] == str(NOW_MS - 10).encode()
    assert h1d["dwell-tick-time"] == b"1000" and h1d["dwell-key"] == b"k2"
    assert p.results[1] == {"errorCode": 0, "schemaVersion": 0, "deliverAt": NOW_MS + 5000,
                            "delayed": True}
    offsets = [(3, 40), (1, 9)]
    results = Publisher.finish(p, offsets)
    assert results[0]["messageId"] == "acme.ns.x:3:40"
    assert results[1]["messageId"] == "dwell.delayed:1:9"


def test_schedule_keys(publisher: Publisher) -> None:
    """A delayed message carries its key; an immediate one goes to its ready topic and a
    release (the key, no deliver-at, no result of its own) to the delay log, last."""
    p = plan(publisher, "persistent://acme/ns/x", body(
        {"payload": "later", "deliverAfterMs": 4000, "scheduleKey": "k1"},
        {"payload": "now", "scheduleKey": "k2"},
        {"payload": "too far", "deliverAfterMs": 9000, "scheduleKey": "k3"}))
    assert [(s[0], s[1]) for s in p.sends] == [(names.DELAYED, b"later"),
                                               ("acme.ns.x", b"now"), (names.DELAYED, b"")]
    assert dict(p.sends[0][3])["dwell-schedule-key"] == b"k1"
    assert "dwell-schedule-key" not in dict(p.sends[1][3])
    release = dict(p.sends[2][3])
    assert p.sends[2][2] == b"persistent://acme/ns/x"
    assert release == {"dwell-topic": b"persistent://acme/ns/x",
                       "dwell-publish-time": str(NOW_MS).encode(),
                       "dwell-schedule-key": b"k2"}
    assert (p.delayed, p.immediate, p.rejected, p.releases) == (1, 1, 1, 1)
    offsets = [(1, 9), (3, 40), (1, 10)]
    want = orjson.dumps({"messagePublishResults": Publisher.finish(
        plan(publisher, "persistent://acme/ns/x", body(
            {"payload": "later", "deliverAfterMs": 4000, "scheduleKey": "k1"},
            {"payload": "now", "scheduleKey": "k2"},
            {"payload": "too far", "deliverAfterMs": 9000, "scheduleKey": "k3"})), offsets),
        "schemaVersion": 0})
    answer = publisher.answer(p, offsets)
    assert answer == want
    assert [r["messageId"] for r in orjson.loads(answer)["messagePublishResults"]] == [
        "dwell.delayed:1:9", "acme.ns.x:3:40", "-1"]
    # Nothing is pending on a non-persistent topic: no release.
    np = plan(publisher, "non-persistent://acme/ns/x", body({"payload": "a",
                                                            "scheduleKey": "k"}))
    assert [s[0] for s in np.sends] == ["non-persistent.acme.ns.x"] and np.releases == 0
    for key, why in (("", "0 bytes"), ("x" * 257, "257 bytes")):
        with pytest.raises(PublishError, match=f"messages\\[0\\].scheduleKey: {why}") as err:
            plan(publisher, "persistent://acme/ns/x",
                 body({"payload": "a", "deliverAfterMs": 1000, "scheduleKey": key}))
        assert err.value.status == 400
    assert plan(publisher, "persistent://acme/ns/x", body(
        {"payload": "a", "deliverAfterMs": 4000, "scheduleKey": "é" * 128})).delayed == 1


def test_fixed_delay_disabled_and_non_persistent(publisher: Publisher) -> None:
    fixed = plan(publisher, "persistent://acme/fixed/x", body({"payload": "a"},
                                                             {"payload": "b", "deliverAt": 1}))
    assert [r["deliverAt"] for r in fixed.results] == [NOW_MS + 60000] * 2
    assert all(s[0] == names.DELAYED for s in fixed.sends)
    off = plan(publisher, "persistent://acme/off/x", body({"payload": "a", "deliverAfterMs": 9}))
    assert off.results[0]["delayIgnored"] and off.results[0]["delayed"] is False
    np = plan(publisher, "non-persistent://acme/ns/x", body({"payload": "a",
                                                            "deliverAfterMs": 99999}))
    assert np.sends[0][0] == "non-persistent.acme.ns.x"
    assert "non-persistent" in np.results[0]["delayIgnored"]


def test_kafka_unavailable_is_503(publisher: Publisher) -> None:
    t = publisher.topic("persistent", "acme", "ns", "x")
    publisher._ready_topics.add(t.kafka_topic)  # skip the admin call; the send must fail
    with pytest.raises(PublishError) as err:
        asyncio.run(publisher.publish(t, body({"payload": "a"})))
    assert err.value.status == 503


class _Watched(list):  # type: ignore[type-arg]
    """A list that a weak reference can watch (a plain list cannot)."""


@pytest.mark.parametrize("all_accepted", [True, False])
def test_a_publish_waiting_for_kafka_holds_neither_its_body_nor_its_records(
        publisher: Publisher, all_accepted: bool) -> None:
    t = publisher.topic("persistent", "acme", "ns", "x")
    publisher._ready_topics.add(t.kafka_topic)  # skip the admin call
    # The answer is spliced from heads alone, or mixed with a failed result's JSON.
    second = ({"payload": "b"} if all_accepted
              else {"payload": "!!", "payloadEncoding": "base64"})
    raw = body({"payload": "a", "key": "k"}, second)
    watched: list[weakref.ref[list[object]]] = []
    real_plan_body = publisher.plan_body

    def plan_body(topic: names.TopicName, got: bytes) -> Plan:
        planned = real_plan_body(topic, got)
        planned.sends = _Watched(planned.sends)
        watched.append(weakref.ref(planned.sends))
        return planned

    publisher.plan_body = plan_body  # type: ignore[method-assign]

    async def publish_and_look() -> tuple[int, list[object]]:
        task = asyncio.ensure_future(publisher.publish(t, raw))
        for _ in range(10):  # to the await of the acks (the producer's Kafka is closed)
            await asyncio.sleep(0)
        assert not task.done() and len(watched) == 1
        held = sys.getrefcount(raw)
        alive = [ref() for ref in watched]
        task.cancel()
        return held, alive

    unheld = sys.getrefcount(raw)
    held, alive = asyncio.run(publish_and_look())
    assert (held, alive) == (unheld, [None])


def test_decisions_are_shared_but_results_are_not(publisher: Publisher) -> None:
    p = plan(publisher, "persistent://acme/ns/x", body(
        *[{"payload": "a", "deliverAfterMs": 4000, "properties": {"p": "1"}}] * 3))
    Publisher.finish(p, [(0, 1), (0, 2), (0, 3)])
    assert [r["messageId"] for r in p.results] == ["dwell.delayed:0:1", "dwell.delayed:0:2",
                                                   "dwell.delayed:0:3"]
    assert len({id(h) for (_, _, _, h, _) in p.sends}) == 3


def test_answer_is_the_json_of_the_finished_results(publisher: Publisher) -> None:
    """The HTTP answer splices messageIds into each decision's JSON: it must be byte for
    byte what orjson writes for the finished result dicts, refusals included."""
    raw = body({"payload": "a", "key": "k"},
               {"payload": "b", "deliverAfterMs": 4000, "properties": {"p": "1"}},
               {"payload": "c", "deliverAfterMs": 6000})  # over the max: rejected
    raw2 = body({"payload": "!", "payloadEncoding": "base64"},
                {"payload": "d", "deliverAt": NOW_MS + 6000, "deliverAfterMs": 1},
                {"payload": "e", "deliverAfterMs": 4000, "properties": {"p": "1"}})
    for topic, raw_body in (("persistent://acme/ns/x", raw), ("persistent://acme/ns/x", raw2),
                            ("non-persistent://acme/ns/x", raw)):
        offsets = [(p, 40 + p) for p in range(len(plan(publisher, topic, raw_body).sends))]
        want = orjson.dumps({"messagePublishResults": Publisher.finish(
            plan(publisher, topic, raw_body), offsets), "schemaVersion": 0})
        assert publisher.answer(plan(publisher, topic, raw_body), offsets) == want
