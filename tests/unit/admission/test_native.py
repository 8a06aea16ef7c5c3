"""The publish paths against the reference: on generated requests, `Publisher.plan_body`
(with `dwell_native` when admission has it, else the pure-Python path) must give exactly
what `Publisher.plan(parse_request(body, max_messages=...))` gives: the same records and
headers, results, answer heads and counts, or the same PublishError; the extension must
take the common request rather than hand everything back to Python; and the answer must
be the JSON of the finished results. Every test runs once per implementation present
here (Python always; native when `dwell_native` is installed and DWELL_NATIVE is not 0)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dwell.adapters import kafka
from dwell.admission import native
from dwell.admission.plan import Plan
from dwell.admission.publish import Publisher
from dwell.admission.schema import PublishError, PublishRequest, parse_request
from dwell.admission.settings import AdmissionSettings
from dwell.core.policy import MAX_LONG
from dwell.policy_feed import PolicyCache

NOW_MS = 1_700_000_000_000
TOPICS = ["persistent://acme/ns/x", "persistent://acme/fixed/x", "persistent://acme/off/x",
          "non-persistent://acme/ns/x"]
IMPLEMENTATIONS = native.implementations(AdmissionSettings().native)


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def publisher(request: pytest.FixtureRequest) -> Iterator[Publisher]:
    settings = AdmissionSettings(kafka_bootstrap="127.0.0.1:1", max_payload_bytes=64,
                                 max_messages_per_request=8,
                                 native=request.param == native.NATIVE)
    cache = PolicyCache(settings.broker_defaults())
    for scope in ("tenant:acme", "namespace:acme/ns", "namespace:acme/fixed",
                  "namespace:acme/off"):
        cache.apply(scope, orjson.dumps({"version": 1, "scope": scope}), {})
    cache.apply("ns:acme/ns", orjson.dumps({"version": 2, "policy": {
        "maxDeliveryDelayInMillis": 5000, "tickTime": 500}}), {})
    cache.apply("ns:acme/fixed", orjson.dumps({"version": 3, "policy": {
        "fixedDeliveryDelayInMillis": 60000}}), {})
    cache.apply("ns:acme/off", orjson.dumps({"version": 4, "policy": {"active": False}}), {})
    cache.ready.set()
    producer = kafka.Producer("127.0.0.1:1", poll_in_background=False)
    pub = Publisher(settings, cache, producer, clock=lambda: NOW_MS / 1000)
    assert (pub.native is not None) == (request.param == native.NATIVE)
    yield pub
    producer.close(0.1)


class Spy:
    """Stands in for dwell_native, recording what its plan answered (None: handed back
    to Python)."""

    def __init__(self, extension: ModuleType) -> None:
        self.answers: list[bool] = []
        self.extension = extension
        self.answer = extension.answer

    def plan(self, *args: Any) -> Any:
        got = self.extension.plan(*args)
        self.answers.append(got is not None)
        return got


def outcome(fn: Any) -> tuple[str, Any]:
    try:
        plan: Plan = fn()
    except PublishError as exc:
        return "error", (exc.status, exc.reason)
    return "plan", (plan.results, plan.sends, plan.index, plan.heads, plan.immediate,
                    plan.delayed, plan.invalid, plan.rejected)


def both(pub: Publisher, topic: str, raw: bytes) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """What `plan_body` gives, and what the reference gives."""
    t = pub.topic(*topic.replace("://", "/").split("/"))
    got = outcome(lambda: pub.plan_body(t, raw))
    reference = outcome(lambda: pub.plan(t, parse_request(
        raw, PublishRequest, pub.settings.max_messages_per_request)))
    return got, reference


texts = st.text(max_size=12)
# Mostly requests the native plan takes (clean), some that it must hand back (any).
clean_times = st.one_of(st.none(), st.integers(0, 3),
                        st.integers(NOW_MS - 10_000, NOW_MS + 90_000), st.just(MAX_LONG))
any_times = st.one_of(clean_times, st.just(MAX_LONG + 1))
# eventTime as Pulsar's class has it, a string; "" is not set.
clean_event_times = st.one_of(clean_times, clean_times.map(lambda t: "" if t is None else str(t)))
any_event_times = st.one_of(clean_event_times, any_times,
                            st.sampled_from(["12a", " 1", "-1", "1.0", str(MAX_LONG + 1),
                                             str(2**64)]))
json_ints = st.integers(-2**63, 2**64 - 1)  # what orjson writes
# Pulsar's fields dwell reads for their type only, and a field nobody knows.
clean_extras = st.fixed_dictionaries({}, optional={
    "context": texts, "replicationClusters": st.lists(texts, max_size=2),
    "disableReplication": st.booleans(), "schemaVersion": st.integers(-2**63, 2**63 - 1),
    "keySchema": st.none(), "valueSchema": texts, "encryptionParam": st.none(),
    "compressionType": st.sampled_from(["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"]),
    "uncompressedMessageSize": st.integers(-2**31, 2**31 - 1),
    "colour": st.one_of(st.none(), texts, json_ints, st.lists(json_ints, max_size=2))})
any_extras = st.one_of(clean_extras, st.fixed_dictionaries({}, optional={
    "context": json_ints, "replicationClusters": texts, "disableReplication": st.just("yes"),
    "schemaVersion": st.just(2**63), "compressionType": st.just("GZIP"),
    "uncompressedMessageSize": st.just(2**31), "keySchema": st.just(5)}))
clean_names = st.one_of(texts.filter(lambda n: not n.lower().startswith("dwell-")),
                        st.sampled_from(["app", "dwellz", "dwell"]))
any_names = st.one_of(texts, st.sampled_from(["dwell-x", "DWELL-Y", "Dwell-z", "\u212a"]))
clean_payloads = st.one_of(
    texts.map(lambda t: {"payload": t}),
    texts.map(lambda t: {"payload": t, "payloadEncoding": "utf-8"}),
    st.binary(max_size=64).map(lambda b: {"payload": base64.b64encode(b).decode(),
                                          "payloadEncoding": "base64"}))
any_payloads = st.one_of(
    clean_payloads,
    st.binary(min_size=65, max_size=70).map(lambda b: {"payload": base64.b64encode(b).decode(),
                                                       "payloadEncoding": "base64"}),
    st.sampled_from([{"payload": "!!", "payloadEncoding": "base64"},
                     {"payload": "QR==", "payloadEncoding": "base64"},
                     {"payload": "x", "payloadEncoding": "hex"},
                     {"payload": "\u00e9\\\"", "payloadEncoding": None}]))


@st.composite
def messages(draw: st.DrawFn, clean: bool) -> dict[str, Any]:
    times = clean_times if clean else any_times
    names = clean_names if clean else any_names
    m = dict(draw(clean_payloads if clean else any_payloads))
    for field, values in (("key", st.one_of(st.none(), texts)),
                          ("properties", st.one_of(st.none(), st.dictionaries(names, texts,
                                                                              max_size=3))),
                          ("eventTime", clean_event_times if clean else any_event_times),
                          ("sequenceId", times), ("deliverAt", times),
                          ("deliverAfterMs", times)):
        if draw(st.booleans()):
            m[field] = draw(values)
    m.update(draw(clean_extras if clean else any_extras))
    return m


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    clean = draw(st.integers(0, 9)) < 7
    body: dict[str, Any] = {"messages": draw(st.lists(
        messages(clean), min_size=1 if clean else 0, max_size=8 if clean else 9))}
    if draw(st.booleans()):
        body["producerName"] = draw(st.one_of(st.none(), texts))
    if draw(st.booleans()):
        body["payloadEncoding"] = draw(st.sampled_from([None, "base64", "utf-8"]))
    if draw(st.booleans()):
        body.update(schemaVersion=draw(st.integers(-1, 3)), keySchema=None,
                    valueSchema=draw(st.one_of(st.none(), texts)))
    return orjson.dumps(body)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topic=st.sampled_from(TOPICS), raw=requests())
def test_plan_body_is_the_reference_plan(publisher: Publisher, topic: str, raw: bytes) -> None:
    got, reference = both(publisher, topic, raw)
    assert got == reference


@settings(max_examples=200, deadline=None)
@given(topic=st.sampled_from(TOPICS), raw=requests(),
       offsets=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)),
                        min_size=9, max_size=9))
def test_the_answer_is_the_json_of_the_finished_results(
        publisher: Publisher, topic: str, raw: bytes, offsets: list[tuple[int, int]]) -> None:
    t = publisher.topic(*topic.replace("://", "/").split("/"))
    try:
        plan = publisher.plan_body(t, raw)
    except PublishError:
        return
    got = offsets[:len(plan.sends)]
    answer = publisher.answer(plan, got)
    assert answer == orjson.dumps({"messagePublishResults": Publisher.finish(plan, got),
                                   "schemaVersion": 0})


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"payload": "a", "properties": {"p": "1", "p": "2"}}]}',
    b'{"messages": [{"payload": "a"}], "messages": []}',
    b'{"messages": [{"payload": "\\ud800"}]}',
    b'{"messages": [{"payload": "a", "key": "\\u00e9", "sequenceId": 1.0}]}',
    b'{"messages": [{"payload": "a", "properties": {"\\u212a": "k"}}]}',
    b'{"messages": [{"payload": "a"}]} trailing',
    b'{"messages": [{"payload": "a", "eventTime": -1}]}',
    b'[{"payload": "a"}]',
    b'{"messages": [{"payload": "a", "deliverAt": null, "deliverAfterMs": 5}]}',
    b'{"messages": []}',
    b'{"messages": [{"payload": "a", "eventTime": "18446744073709551616"}]}',
    b'{"messages": [{"payload": "a", "eventTime": "9223372036854775808"}]}',
    b'{"messages": [{"payload": "a", "eventTime": "0"}]}',
    b'{"messages": [{"payload": "a", "eventTime": "\\u0661"}]}',
    b'{"messages": [{"payload": "a", "deliverAt": 0, "deliverAfterMs": 0}]}',
    b'{"messages": [{"payload": "a", "deliverAt": 1700000060000, "deliverAfterMs": 1}]}',
    b'{"messages": [{"payload": "a", "compressionType": null, "x": {"y": [1, 2.5]}}]}',
])
def test_plan_body_is_the_reference_plan_on_edge_bodies(publisher: Publisher,
                                                        raw: bytes) -> None:
    for topic in TOPICS:
        got, reference = both(publisher, topic, raw)
        assert got == reference


def test_the_common_request_is_planned_by_the_extension_when_there_is_one(
        publisher: Publisher, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(publisher.native) if publisher.native is not None else None
    if spy is not None:
        monkeypatch.setattr(publisher, "native", spy)
    raw = orjson.dumps({"producerName": "p", "messages": [
        {"payload": "x" * 20, "key": f"k{i}", "sequenceId": i, "properties": {"app": "a"},
         **({"deliverAfterMs": 3000} if i % 2 else {})} for i in range(8)]})
    t = publisher.topic("persistent", "acme", "ns", "x")
    plan = publisher.plan_body(t, raw)
    assert (plan.immediate, plan.delayed, plan.rejected) == (4, 4, 0)
    # a rejection (over the 5 s max) is the rule's answer, still the extension's
    rejected = publisher.plan_body(t, orjson.dumps({"messages": [{"payload": "x",
                                                                  "deliverAfterMs": 9000}]}))
    assert rejected.rejected == 1
    # a body as a Java client serialises Pulsar's ProducerMessages: every field sent
    pulsar = publisher.plan_body(t, orjson.dumps({
        "schemaVersion": -1, "keySchema": None, "valueSchema": None, "producerName": "rest",
        "messages": [{"payload": "x", "properties": None, "context": "c", "key": "k",
                      "replicationClusters": None, "eventTime": "1700000000000",
                      "sequenceId": 0, "disableReplication": False, "deliverAt": 0,
                      "deliverAfterMs": 3000, "schemaVersion": 0, "keySchema": None,
                      "valueSchema": None, "encryptionParam": None, "compressionType": None,
                      "uncompressedMessageSize": None}]}))
    assert pulsar.delayed == 1
    # a message in error is handed back
    with pytest.raises(PublishError):
        publisher.plan_body(t, orjson.dumps({"messages": [{"payload": "x" * 65}]}))
    if spy is not None:
        assert spy.answers == [True, True, True, False]


def test_native_off_keeps_admission_on_the_python_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DWELL_NATIVE", "0")
    settings = AdmissionSettings(kafka_bootstrap="127.0.0.1:1")
    assert settings.native is False
    assert native.load(settings.native) is None
    assert native.implementations(settings.native) == [native.PYTHON]
