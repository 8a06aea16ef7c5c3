"""Malformed records: what makes a record on `dwell.publish` or `dwell.acks` unreadable,
the event check the dwell.acks readers share, and the shape of the `dwell.invalid` record
a refused one becomes (key and value as read; headers say where it came from and why).

A reader sets a malformed record aside on `dwell.invalid` and goes on; it never stops
or retries on one, since a retry would read the same bytes again."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from dwell import headers as hdr
from dwell.core import subscriptions as subs
from dwell.core.backoff import MAX_DELAY_MS
from dwell.core.positions import parse_message_id
from dwell.core.topics import (
    DELAYED,
    INVALID,
    REFILED,
    InvalidTopicName,
    TopicName,
    retry_topic,
    validate_subscription,
)

# The kinds of malformed record (the `dwell-invalid-kind` header and the metrics' label).
NOT_JSON: Final = "not_json"  # the value is not JSON (or not UTF-8, or empty)
WRONG_TYPE: Final = "wrong_type"  # JSON, but not an object
FIELD: Final = "field"  # a field missing, of the wrong type or out of range
HEADER: Final = "header"  # a header dwell reads is not what it must be
EVENT_KIND: Final = "event_kind"  # a dwell.acks event that is not delivered, ack or nack
OVERSIZED: Final = "oversized"  # bigger than the reader's limit
UNAUTHENTICATED: Final = "unauthenticated"  # no valid token where one is required
UNAUTHORIZED: Final = "unauthorized"  # the token's role lacks the permission
# A dwell.acks event of a subscription the tracker has not registered: its retry and DLQ
# topics would be made for any name, past maxSubscriptionsPerTopic.
UNKNOWN_SUBSCRIPTION: Final = "unknown_subscription"
# Its reader failed on it although it passed the checks: set aside so that it cannot fail
# the reader again (on every restart).
FAILED: Final = "failed"
KINDS: Final = (NOT_JSON, WRONG_TYPE, FIELD, HEADER, EVENT_KIND, OVERSIZED, UNAUTHENTICATED,
                UNAUTHORIZED, UNKNOWN_SUBSCRIPTION, FAILED)

# The dwell.acks event kinds (docs/architecture.md, "Kafka topics").
DELIVERED: Final = "delivered"
ACK: Final = "ack"
NACK: Final = "nack"
EVENTS: Final = (DELIVERED, ACK, NACK)
# Longest reason carried in a header: enough to name the field and what was wrong.
MAX_REASON_CHARS: Final = 1000
BEARER: Final = "Bearer "
# An event's `ts`: epoch milliseconds up to the end of year 9999, so that no due time
# computed from it overflows a signed 64-bit count (dwell.core.backoff.MAX_DELAY_MS).
MAX_TS_MS: Final = 253_402_300_799_999
# The upper bound of each integer field of an event.
_MAXIMA: Final = {"ts": (MAX_TS_MS, "9999-12-31T23:59:59.999Z"),
                  "redeliveryCount": (subs.MAX_REDELIVERY_COUNT, None),
                  subs.ACK_TIMEOUT_MS: (MAX_DELAY_MS, "100 years"),
                  subs.MAX_REDELIVER_COUNT: (subs.MAX_REDELIVERY_COUNT, None)}
# The delay logs: any topic's messages, told apart by their `dwell-topic` header, which
# the drain checks before it copies one (dwell_spark.records).
_DELAY_LOGS: Final = frozenset({DELAYED, REFILED})

# (topic, value, key, headers, timestamp): dwell.adapters.kafka's OutRecord.
InvalidRecord = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]], None]


class Malformed(ValueError):
    """A record its reader cannot use: ``kind`` is one of KINDS, ``reason`` names why."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def invalid_record(source_topic: str, partition: int, offset: int, key: bytes | None,
                   value: bytes | None, kind: str, reason: str) -> InvalidRecord:
    """The `dwell.invalid` record for a malformed record read at (topic, partition,
    offset): its own key and value, and where it was and why it was refused as headers."""
    return (INVALID, value, key, [
        (hdr.SOURCE_TOPIC, source_topic.encode()),
        (hdr.SOURCE_PARTITION, str(partition).encode()),
        (hdr.SOURCE_OFFSET, str(offset).encode()),
        (hdr.INVALID_KIND, kind.encode()),
        (hdr.INVALID_REASON, reason[:MAX_REASON_CHARS].encode()),
    ], None)


def authorization(values: Sequence[bytes | None]) -> str | None:
    """The token of a record's `dwell-authorization` headers (every value it carries under
    that name, in order), None without one; Malformed (HEADER) unless there is at most
    one and it is UTF-8 text `Bearer <token>`."""
    if not values:
        return None
    if len(values) > 1:
        raise Malformed(HEADER, f"header {hdr.AUTHORIZATION}: sent {len(values)} times; "
                                "send it once")
    raw = values[0]
    try:
        text = (raw or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed(HEADER, f"header {hdr.AUTHORIZATION}: not UTF-8 text") from None
    token = text.removeprefix(BEARER)
    if token == text or not token or not token.isprintable() or " " in token:
        raise Malformed(HEADER, f"header {hdr.AUTHORIZATION}: must be 'Bearer <token>'")
    return token


def check_size(value: bytes | None, max_bytes: int, limit_name: str,
               what: str = "record") -> None:
    """Malformed (OVERSIZED) when ``value`` is longer than ``max_bytes``."""
    size = len(value or b"")
    if size > max_bytes:
        raise Malformed(OVERSIZED, f"{what}: {size} bytes; the limit is {max_bytes} bytes "
                                   f"({limit_name})")


def json_object(value: bytes | None) -> dict[str, Any]:
    """The record's value as a JSON object; Malformed NOT_JSON or WRONG_TYPE otherwise."""
    return _json_object(value)[0]


def _json_object(value: bytes | None) -> tuple[dict[str, Any], bool]:
    """:func:`json_object`, and whether orjson read it (then it holds no NaN, infinity or
    number past 64 bits)."""
    try:
        # orjson takes what the standard parser takes, and less (lone surrogates, numbers
        # past 64 bits, NaN, depth past 1024), ten times as fast: whatever it refuses is
        # judged by the standard parser, so both say the same of every value.
        doc, fast = orjson.loads(value or b""), True
    except orjson.JSONDecodeError:
        doc, fast = _stdlib_json(value), False
    if not isinstance(doc, dict):
        raise Malformed(WRONG_TYPE, f"value: must be a JSON object, not {_json_type(doc)}")
    return doc, fast


def _stdlib_json(value: bytes | None) -> Any:
    try:
        return json.loads(value or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise Malformed(NOT_JSON, f"value: not JSON ({exc})") from None
    except RecursionError:
        raise Malformed(NOT_JSON, "value: nested too deeply") from None


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _bounded(doc: Mapping[str, Any], name: str, *, required: bool) -> None:
    v = doc.get(name)
    if v is None:
        if required:
            raise Malformed(FIELD, f"{name}: missing")
        return
    top, meaning = _MAXIMA[name]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
        bound = f"{top} ({meaning})" if meaning else str(top)
        raise Malformed(FIELD, f"{name}: must be an integer from 0 to {bound}")


def message_topics(topic: str, subscription: str) -> frozenset[str]:
    """The Kafka topics whose records an event of ``topic`` and ``subscription`` may name:
    the topic's ready topic (a partition's: its partitioned topic's), the subscription's
    retry topic and the delay logs. ValueError when the names are not valid."""
    name = TopicName.parse(topic)
    return frozenset({name.kafka_topic, name.partitioned_topic.kafka_topic,
                      retry_topic(name, subscription), *_DELAY_LOGS})


def _text(doc: Mapping[str, Any], name: str) -> str:
    v = doc.get(name)
    if v is None:
        raise Malformed(FIELD, f"{name}: missing")
    if not isinstance(v, str):
        raise Malformed(FIELD, f"{name}: must be a string, not {_json_type(v)}")
    return v


# A consumer's events repeat a few topics and subscriptions: each name is checked once per
# process (parsing a topic name is the largest part of the check).
@functools.lru_cache(maxsize=8192)
def _name_problem(check: Callable[[str], object], name: str) -> str | None:
    """Why ``check`` refuses ``name``, or None."""
    try:
        check(name)
    except InvalidTopicName as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=8192)
def _own_topics(topic: str, subscription: str) -> frozenset[str]:
    return message_topics(topic, subscription)


def check_ack_event(value: bytes | None, max_bytes: int,
                    system_topics: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The dwell.acks event in ``value``, checked as its readers use it: `event` one of
    EVENTS, `topic` a Pulsar topic (or one of ``system_topics``, a reader's own), a
    `subscription`, a `messageId` `<kafkaTopic>:<partition>:<offset>` of one of the
    topic's Kafka topics (:func:`message_topics`; a system topic's: a delay log), `ts`
    (epoch ms up to MAX_TS_MS) and an optional `redeliveryCount` within their bounds, and
    the subscription settings, when present, valid. Malformed with the first problem
    otherwise."""
    check_size(value, max_bytes, "acks_max_event_bytes")
    doc, fast = _json_object(value)
    # Nearly every event is good: a quick look that accepts only what the full check
    # accepts, which runs on the rest to name the first problem.
    if not (fast and _plainly_good(doc, system_topics)):
        _check_event(doc, fast, system_topics)
    return doc


# (name, upper bound) of each integer field of an event, `ts` (required) first.
_INTEGER_FIELDS: Final = tuple((name, _MAXIMA[name][0])
                               for name in ("ts", "redeliveryCount", *subs.INTEGER_FIELDS))


def _plainly_good(doc: Mapping[str, Any], system_topics: frozenset[str]) -> bool:
    """True only when :func:`_check_event` passes ``doc`` (which orjson read): its text
    fields strings whose checks are cached together, its integers plain ints in bounds,
    its settings (if any) cached as valid. False says nothing either way."""
    event, topic, sub, mid = (doc.get("event"), doc.get("topic"), doc.get("subscription"),
                              doc.get("messageId"))
    if not (type(event) is str and type(topic) is str and type(sub) is str
            and type(mid) is str):
        return False
    try:
        kafka_topic = parse_message_id(mid)[0]
    except ValueError:
        return False
    if not _names_good(event, topic, sub, kafka_topic, topic in system_topics):
        return False
    for name, top in _INTEGER_FIELDS:
        v = doc.get(name)
        if v is None:
            if name == "ts":
                return False
        elif type(v) is not int or not 0 <= v <= top:
            return False
    settings = _settings_of(doc)
    return not settings or _cached_settings_problem(_settings_key(settings)) is None


@functools.lru_cache(maxsize=8192)
def _names_good(event: str, topic: str, sub: str, kafka_topic: str, system: bool) -> bool:
    if event not in EVENTS or _name_problem(validate_subscription, sub) is not None:
        return False
    if system:
        return kafka_topic in _DELAY_LOGS
    if _name_problem(TopicName.parse, topic) is not None:
        return False
    try:
        return kafka_topic in _own_topics(topic, sub)
    except ValueError:
        return False


def _check_event(doc: Mapping[str, Any], fast: bool, system_topics: frozenset[str]) -> None:
    """:func:`check_ack_event`'s checks of the parsed event, field by field: Malformed
    with the first problem."""
    event = _text(doc, "event")
    if event not in EVENTS:
        raise Malformed(EVENT_KIND, f"event: {event[:100]!r} is not one of {', '.join(EVENTS)}")
    topic = _text(doc, "topic")
    system = topic in system_topics
    if not system and (problem := _name_problem(TopicName.parse, topic)):
        raise Malformed(FIELD, f"topic: {problem}")
    sub = _text(doc, "subscription")
    if problem := _name_problem(validate_subscription, sub):
        raise Malformed(FIELD, f"subscription: {problem}")
    try:
        kafka_topic, _, _ = parse_message_id(_text(doc, "messageId"))
    except ValueError as exc:
        raise Malformed(FIELD, f"messageId: {exc}") from None
    # The drain copies the record a messageId names into the subscription's retry or
    # dead-letter topic: naming another topic's record would copy it out.
    try:
        own = _DELAY_LOGS if system else _own_topics(topic, sub)
    except ValueError as exc:  # a retry topic's name too long for Kafka
        raise Malformed(FIELD, f"subscription: {exc}") from None
    if kafka_topic not in own:
        raise Malformed(FIELD, f"messageId: {kafka_topic[:100]!r} is not a Kafka topic of "
                               f"{topic!r} (its ready or retry topic, or a delay log)")
    for name, _ in _INTEGER_FIELDS:
        _bounded(doc, name, required=name == "ts")
    settings = _settings_of(doc)
    if settings:
        # A subscription's events all carry the same settings: checked once per process,
        # by their JSON text (faithful for what orjson read).
        problem = (_cached_settings_problem(_settings_key(settings))
                   if fast else _settings_problem(settings))
        if problem is not None:
            raise Malformed(FIELD, problem)


def _settings_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The subscription settings an event carries (its subs.FIELDS that are not null)."""
    return {k: doc[k] for k in subs.FIELDS if doc.get(k) is not None}


def _settings_key(settings: Mapping[str, Any]) -> bytes:
    """The cache key of settings orjson read: their JSON text, faithful for those."""
    return orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)


def _settings_problem(settings: Mapping[str, Any]) -> str | None:
    """Why the subscription settings are refused, or None."""
    try:
        subs.SubscriptionSettings.from_json(settings)
    except ValueError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=1024)
def _cached_settings_problem(settings: bytes) -> str | None:
    return _settings_problem(orjson.loads(settings))
