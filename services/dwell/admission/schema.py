"""The REST producer's request body, defined once: Pulsar's `ProducerMessages` and
`ProducerMessage` (pulsar-websocket's `org.apache.pulsar.websocket.data`, plus dwell's
`payloadEncoding`) on `POST /topics/...`, and the same plus the Pulsar `topic` on
`dwell.publish`.

Read as leniently as Pulsar's Jackson reads it: unknown fields are ignored, `eventTime`
may be a string (Pulsar's field is one) or a number, and the fields Pulsar has but dwell
does not act on (schemas, replication, encryption, compression, `context`) are read for
their type and dropped; docs/pulsar-compatibility.md says why each is.

The msgspec structs below are the definition, and what the hot path decodes into:
validation and decoding in one C pass. The pydantic models are generated from them
(`model_of`) and only word the 400 for a body the structs refuse, one clause per bad
field (`dwell.http.validation_reason`); tests hold the two to accepting the same bodies
with the same values."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import msgspec
import pydantic
from pydantic import ConfigDict, Field
from pydantic_core import PydanticCustomError

from dwell.core.policy import MAX_LONG
from dwell.http import validation_reason

# Each library reads its own constraint and ignores the other's.
Long = Annotated[int, msgspec.Meta(ge=0, le=MAX_LONG), Field(ge=0, le=MAX_LONG)]
# Java's long and int, for the fields dwell reads only for their type.
JavaLong = Annotated[int, msgspec.Meta(ge=-MAX_LONG - 1, le=MAX_LONG),
                     Field(ge=-MAX_LONG - 1, le=MAX_LONG)]
JavaInt = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1), Field(ge=-(2**31), le=2**31 - 1)]


def _event_time(value: Any) -> Any:
    """pydantic's check of `eventTime`, the struct's in one clause (a union would word one
    per branch)."""
    if (type(value) is int and 0 <= value <= MAX_LONG
            or type(value) is str and (not value or value.isascii() and value.isdigit())):
        return value
    raise PydanticCustomError("event_time", "must be a number of ms since the epoch, or a "
                                            "string of one")


# Pulsar's eventTime is a String it reads with Long.parseLong, "" meaning not set: a string
# of digits here (the plan refuses one past Long.MAX_VALUE), or a number as dwell takes it.
EventTime = Annotated[Long | Annotated[str, msgspec.Meta(pattern=r"\A[0-9]*\Z")],
                      pydantic.PlainValidator(_event_time)]
Encoding = Literal["base64", "utf-8"]
# org.apache.pulsar.client.api.CompressionType
Compression = Literal["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"]


class PublishError(Exception):
    """The whole request fails: `status` is the HTTP status it answers with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Message(msgspec.Struct, kw_only=True, gc=False):
    """One message. A field not sent reads as None; 0 in `deliverAt` or `deliverAfterMs`
    means not set, as in Pulsar's class (primitive longs). Not tracked by the cycle
    collector (`gc=False`): it holds strings, integers, booleans, a list of strings and a
    dict of strings, so it cannot be part of a cycle."""

    payload: str
    payloadEncoding: Encoding | None = None
    key: str | None = None
    properties: dict[str, str] | None = None
    eventTime: EventTime | None = None
    sequenceId: Long | None = None
    deliverAt: Long | None = None
    deliverAfterMs: Long | None = None
    # dwell's own: a newer message of the topic with the same key replaces this one
    # while it is pending (docs/client/getting-started.md "Replace by schedule key").
    scheduleKey: str | None = None
    # Pulsar's, read for their type and not acted on (docs/pulsar-compatibility.md).
    context: str | None = None
    replicationClusters: list[str] | None = None
    disableReplication: bool | None = None
    schemaVersion: JavaLong | None = None
    keySchema: str | None = None
    valueSchema: str | None = None
    encryptionParam: str | None = None
    compressionType: Compression | None = None
    uncompressedMessageSize: JavaInt | None = None


class PublishRequest(msgspec.Struct, kw_only=True):
    """The body of `POST /topics/{domain}/{tenant}/{namespace}/{topic}`."""

    producerName: str | None = None
    payloadEncoding: Encoding | None = None
    messages: list[Message]
    # Pulsar's, read for their type and not acted on: dwell keeps payloads as sent.
    schemaVersion: JavaLong | None = None
    keySchema: str | None = None
    valueSchema: str | None = None


class IngressRequest(PublishRequest, kw_only=True):
    """A record on `dwell.publish`: the HTTP body plus the Pulsar `topic`."""

    topic: str | None = None


Req = TypeVar("Req", bound=PublishRequest)


class ProducerAck(pydantic.BaseModel):
    """One message's result (Pulsar's `ProducerAck`), for the OpenAPI document: an id
    and errorCode 0, or messageId "-1", an errorCode and errorMsg; dwell's fields
    follow on success."""

    messageId: str
    errorCode: int
    errorMsg: str | None = None
    schemaVersion: int
    deliverAt: int | None = None
    delayed: bool | None = None
    delayIgnored: bool | None = None


class PublishResults(pydantic.BaseModel):
    """The answer to `POST /topics/...` (Pulsar's `ProducerAcks`)."""

    messagePublishResults: list[ProducerAck]
    schemaVersion: int


def _pydantic_type(tp: Any) -> Any:
    """`tp` with every struct in it replaced by its generated model."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return model_of(tp)
    if get_origin(tp) is list:
        (item,) = get_args(tp)
        return list[_pydantic_type(item)]  # type: ignore[misc]
    return tp


@functools.cache
def model_of(struct: type[msgspec.Struct]) -> type[pydantic.BaseModel]:
    """The strict pydantic model of a struct: the same fields, types, constraints and
    defaults, unknown fields ignored."""
    fields: dict[str, Any] = {
        f.name: (_pydantic_type(f.type), ... if f.required else f.default)
        for f in msgspec.structs.fields(struct)}
    return pydantic.create_model(
        struct.__name__, __config__=ConfigDict(extra="ignore", strict=True), **fields)


_DECODERS: dict[type[PublishRequest], msgspec.json.Decoder[Any]] = {
    PublishRequest: msgspec.json.Decoder(PublishRequest),
    IngressRequest: msgspec.json.Decoder(IngressRequest)}


class _Count(msgspec.Struct):
    """Only how many messages a request holds, each left unread."""

    messages: list[msgspec.Raw]


_COUNT = msgspec.json.Decoder(_Count)


def too_many(count: int, limit: int) -> PublishError:
    """The 400 of a request with more than `max_messages_per_request` messages."""
    return PublishError(400, f"messages: {count} messages; the limit per request is {limit}")


def parse_request(body: bytes, kind: type[Req], max_messages: int | None = None) -> Req:
    """Parse and validate a request body as `kind`; PublishError 400 naming the first bad
    fields when it does not fit. A body msgspec refuses goes to the generated pydantic
    model, which words the error, unless it holds more than `max_messages` messages: then
    the 400 says so, before any message is looked at, since a reason or a result per bad
    message would be work that grows with what a hostile sender chose."""
    try:
        return _DECODERS[kind].decode(body)  # type: ignore[no-any-return]
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    except RecursionError:
        raise PublishError(400, "body: nested too deeply") from None
    if max_messages is not None:
        try:
            count = len(_COUNT.decode(body).messages)
        except (msgspec.ValidationError, msgspec.DecodeError):
            count = 0
        if count > max_messages:
            raise too_many(count, max_messages)
    try:
        req = model_of(kind).model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise PublishError(400, validation_reason(exc)) from None
    fields = req.model_dump()
    fields["messages"] = [Message(**m) for m in fields["messages"]]
    return kind(**fields)
