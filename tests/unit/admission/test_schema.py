"""The request schema: a malformed body is a 400 naming the field, and the msgspec
structs (the hot path) and the pydantic models generated from them accept the same
bodies with the same values and word the same 400."""

from __future__ import annotations

import json

import msgspec
import orjson
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dwell.admission.schema import (
    IngressRequest,
    PublishError,
    PublishRequest,
    model_of,
    parse_request,
)
from dwell.http import validation_reason


def body(*messages: dict[str, object], **extra: object) -> bytes:
    return orjson.dumps({"producerName": "p1", "messages": list(messages), **extra})


@pytest.mark.parametrize(("raw", "field"), [
    (b"{", "body: is not valid JSON"),
    (body({"payload": "x", "deliverAt": "5"}), "messages[0].deliverAt: must be an integer"),
    (body({"payload": "x", "eventTime": "12:00"}),
     "messages[0].eventTime: must be a number of ms since the epoch, or a string of one"),
    (body({"payload": "x", "eventTime": -1}),
     "messages[0].eventTime: must be a number of ms since the epoch, or a string of one"),
    (body({"payload": "x", "disableReplication": "yes"}),
     "messages[0].disableReplication: must be true or false"),
    (body({"payload": "x", "compressionType": "GZIP"}), "messages[0].compressionType"),
    (body({"payload": "x", "replicationClusters": "us-west"}),
     "messages[0].replicationClusters: must be a list"),
    (body({"payload": "x"}, schemaVersion="1"), "schemaVersion: must be an integer"),
    (body({"key": "k"}), "messages[0].payload: is required"),
    (body({"payload": "x", "deliverAfterMs": -1}), "messages[0].deliverAfterMs"),
    (orjson.dumps({"messages": "x"}), "messages: must be a list"),
])
def test_malformed_bodies_are_400_naming_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(PublishError) as err:
        parse_request(raw, PublishRequest)
    assert err.value.status == 400
    assert field in err.value.reason


# What Pulsar's ProducerMessages / ProducerMessage (Jackson) take, as a Java client
# serialising them sends it: every field, primitives at their defaults.
PULSAR_BODY = {
    "schemaVersion": -1, "keySchema": None, "valueSchema": None, "producerName": "rest",
    "messages": [{"payload": "x", "properties": {"a": "b"}, "context": "c-1", "key": "k",
                  "replicationClusters": ["standalone"], "eventTime": "1700000000000",
                  "sequenceId": 0, "disableReplication": False, "deliverAt": 0,
                  "deliverAfterMs": 5000, "schemaVersion": 0, "keySchema": None,
                  "valueSchema": "eyJ0eXBlIjoiU1RSSU5HIn0=", "encryptionParam": None,
                  "compressionType": "NONE", "uncompressedMessageSize": 1}]}


def test_pulsars_fields_and_unknown_fields_are_accepted() -> None:
    raw = orjson.dumps({**PULSAR_BODY, "futureField": {"x": 1},
                        "messages": [{**PULSAR_BODY["messages"][0],  # type: ignore[index]
                                      "colour": 1}]})
    for kind in (PublishRequest, IngressRequest):
        got = parse_request(raw, kind)
        (m,) = got.messages
        assert (m.eventTime, m.deliverAt, m.deliverAfterMs) == ("1700000000000", 0, 5000)
        assert got.schemaVersion == -1 and m.compressionType == "NONE"
        assert_parse_agrees_with_the_model(raw, kind)


def test_an_empty_message_list_parses() -> None:
    assert parse_request(body(), PublishRequest).messages == []


# Bodies msgspec must hand to pydantic (or accept exactly as pydantic does).
EDGE_BODIES = [
    body({"payload": "x", "sequenceId": True}),
    body({"payload": "x", "sequenceId": 1.0}),
    body({"payload": "x", "deliverAt": 2**63}),
    body({"payload": "x", "deliverAt": 2**63 - 1}),
    body({"payload": "x", "eventTime": None, "key": None, "properties": None}),
    body({"payload": "x", "properties": {"a": 1}}),
    body({"payload": "x", "properties": []}),
    body({"payload": "x", "payloadEncoding": "latin-1"}),
    body({"payload": "x", "payloadEncoding": None}),
    body({"payload": 5}),
    body({"payload": "x", "key": 7}),
    body("x"),
    body({"payload": "x"}, payloadEncoding="hex"),
    body({"payload": "x"}, producerName=3),
    body({"payload": "x"}, topic="persistent://a/b/c"),
    orjson.dumps([{"payload": "x"}]),
    orjson.dumps({"messages": [{"payload": "x"}], "producerName": None}),
    b'{"messages": [{"payload": "\\ud800"}]}',
    b'{"messages": [{"payload": "x", "deliverAt": NaN}]}',
    b'{"messages": [{"payload": "x"}], "messages": []}',
    body({"payload": "x", "eventTime": ""}),
    body({"payload": "x", "eventTime": "0042"}),
    body({"payload": "x", "eventTime": " 1"}),
    body({"payload": "x", "eventTime": "12\n"}),
    body({"payload": "x", "eventTime": "\u0661"}),
    body({"payload": "x", "eventTime": True}),
    body({"payload": "x", "eventTime": "99999999999999999999"}),
    body({"payload": "x", "eventTime": 1.5}),
    body({"payload": "x", "uncompressedMessageSize": 2**31}),
    body({"payload": "x", "schemaVersion": -(2**63)}),
    b'{"messages": [{"payload": "x", "schemaVersion": -9223372036854775809}]}',
    body({"payload": "x", "context": None, "replicationClusters": [None]}),
    body({"payload": "x"}, keySchema=5),
]


def assert_parse_agrees_with_the_model(raw: bytes, kind: type[PublishRequest]) -> None:
    """parse_request's fast path (msgspec) must accept nothing the generated pydantic
    model refuses, and yield the same values and the same 400 text otherwise."""
    try:
        want = model_of(kind).model_validate_json(raw)
    except pydantic.ValidationError as exc:
        with pytest.raises(PublishError) as err:
            parse_request(raw, kind)
        assert err.value.status == 400 and err.value.reason == validation_reason(exc)
        return
    got = parse_request(raw, kind)
    assert msgspec.structs.asdict(got) | {"messages": None} == want.model_dump() | {
        "messages": None}
    assert [msgspec.structs.asdict(m) for m in got.messages] == [m.model_dump()
                                                                 for m in want.messages]


@pytest.mark.parametrize("raw", EDGE_BODIES)
def test_parse_agrees_with_the_pydantic_model(raw: bytes) -> None:
    assert_parse_agrees_with_the_model(raw, PublishRequest)
    assert_parse_agrees_with_the_model(raw, IngressRequest)


_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.floats() | st.text(max_size=5)
    | st.sampled_from(["base64", "utf-8", "", "hex"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=2),
    max_leaves=4)
_FIELD_VALUES = {
    "payload": st.text(max_size=5), "payloadEncoding": st.sampled_from(["base64", "utf-8"]),
    "key": st.text(max_size=3), "properties": st.dictionaries(st.text(max_size=3),
                                                              st.text(max_size=3), max_size=2),
    **{f: st.integers(0, 2**63 - 1) for f in ("sequenceId", "deliverAt", "deliverAfterMs")},
    "eventTime": st.one_of(st.integers(0, 2**63 - 1), st.text("0123456789 a\n", max_size=4)),
    "context": st.text(max_size=3), "replicationClusters": st.lists(st.text(max_size=3)),
    "disableReplication": st.booleans(), "schemaVersion": st.integers(-2**63, 2**63 - 1),
    "keySchema": st.text(max_size=3), "valueSchema": st.text(max_size=3),
    "encryptionParam": st.text(max_size=3),
    "compressionType": st.sampled_from(["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY", "GZIP"]),
    "uncompressedMessageSize": st.integers(-2**31, 2**31 - 1)}
# A message: mostly well-typed fields, sometimes a value of any JSON type or an extra field.
_MESSAGE = st.dictionaries(
    st.sampled_from([*_FIELD_VALUES, "colour"]), st.none(), max_size=10).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.one_of(_FIELD_VALUES.get(k, _ANY_JSON),
                                                     _ANY_JSON) for k in keys}))


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(_MESSAGE, max_size=3),
       top=st.dictionaries(st.sampled_from(["producerName", "payloadEncoding", "topic", "x",
                                            "schemaVersion", "keySchema", "valueSchema"]),
                           _ANY_JSON | st.text(max_size=3), max_size=2))
def test_parse_agrees_with_the_pydantic_model_on_generated_bodies(
        messages: list[dict[str, object]], top: dict[str, object]) -> None:
    raw = json.dumps({"messages": messages, **top}).encode()  # orjson stops at 64 bits
    assert_parse_agrees_with_the_model(raw, PublishRequest)
    assert_parse_agrees_with_the_model(raw, IngressRequest)
