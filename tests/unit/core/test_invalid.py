"""The malformed-record check shared by dwell.acks' readers, table-driven: each kind of
bad event names its problem, good events pass, and the dwell.invalid record carries the
original bytes with where they came from and why."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dwell import headers as hdr
from dwell.core import invalid
from dwell.core import topics as names

GOOD = {"event": "delivered", "topic": "persistent://t/ns/x", "subscription": "s",
        "messageId": "t.ns.x:0:5", "ts": 1, "redeliveryCount": 0, "ackTimeoutMs": 2000,
        "ackTimeoutRedeliveryBackoff": {"minDelayMs": 1000}}


def enc(doc: object) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("value", "kind", "words"), [
    (b"", invalid.NOT_JSON, "not JSON"),
    (b"{nope", invalid.NOT_JSON, "not JSON"),
    (b"\xff\xfe", invalid.NOT_JSON, "not JSON"),
    (b"[1, 2]", invalid.WRONG_TYPE, "not an array"),
    (b"42", invalid.WRONG_TYPE, "not a number"),
    (b"null", invalid.WRONG_TYPE, "not null"),
    (enc(GOOD | {"event": "settle"}), invalid.EVENT_KIND, "'settle' is not one of"),
    (enc({k: v for k, v in GOOD.items() if k != "event"}), invalid.FIELD, "event: missing"),
    (enc(GOOD | {"event": 3}), invalid.FIELD, "event: must be a string"),
    (enc(GOOD | {"topic": "x"}), invalid.FIELD, "topic: "),
    (enc(GOOD | {"topic": "persistent://dwell/system/x"}), invalid.FIELD, "reserved"),
    (enc(GOOD | {"subscription": ""}), invalid.FIELD, "subscription: "),
    (enc(GOOD | {"messageId": "t.ns.x:zero:5"}), invalid.FIELD, "messageId: "),
    (enc(GOOD | {"ts": "now"}), invalid.FIELD, "ts: must be an integer"),
    (enc(GOOD | {"ts": True}), invalid.FIELD, "ts: must be an integer"),
    (enc(GOOD | {"ts": 2**63}), invalid.FIELD, "ts: must be an integer"),
    (enc({k: v for k, v in GOOD.items() if k != "ts"}), invalid.FIELD, "ts: missing"),
    (enc(GOOD | {"redeliveryCount": -1}), invalid.FIELD, "redeliveryCount: "),
    (enc(GOOD | {"ackTimeoutMs": 5}), invalid.FIELD, "ackTimeoutMs: "),
    (enc(GOOD | {"ackTimeoutRedeliveryBackoff": "fast"}), invalid.FIELD,
     "ackTimeoutRedeliveryBackoff: "),
    (enc(GOOD | {"maxRedeliverCount": 0}), invalid.FIELD, "maxRedeliverCount: "),
    (enc(GOOD | {"pad": "x" * 2000}), invalid.OVERSIZED, "the limit is 1024 bytes"),
])
def test_a_malformed_event_names_its_kind_and_problem(value: bytes, kind: str,
                                                      words: str) -> None:
    with pytest.raises(invalid.Malformed) as exc:
        invalid.check_ack_event(value, 1024)
    assert exc.value.kind == kind and words in exc.value.reason, exc.value.reason


@pytest.mark.parametrize("doc", [
    GOOD,
    {"event": "ack", "topic": "persistent://t/ns/x", "subscription": "s",
     "messageId": "t.ns.x:0:5", "ts": 1},
    GOOD | {"event": "nack", "unknownField": [1], "maxRedeliverCount": None},
])
def test_good_events_pass(doc: dict) -> None:
    assert invalid.check_ack_event(enc(doc), 1024) == doc


def test_a_reader_own_topics_pass() -> None:
    doc = GOOD | {"topic": "persistent://dwell/system/x", "messageId": "dwell.delayed:0:0"}
    assert invalid.check_ack_event(enc(doc), 1024, frozenset({doc["topic"]})) == doc


@pytest.mark.parametrize("message_id", [
    "t.ns.x:0:5", "t.ns.x-s-RETRY:1:2", "dwell.delayed:0:1", "dwell.delayed.refiled:3:4"])
def test_a_message_id_of_the_events_own_topics_passes(message_id: str) -> None:
    doc = GOOD | {"messageId": message_id}
    assert invalid.check_ack_event(enc(doc), 1024) == doc


def test_a_partitions_events_name_its_partitioned_topics_ready_topic() -> None:
    doc = GOOD | {"topic": "persistent://t/ns/x-partition-1", "messageId": "t.ns.x:1:5"}
    assert invalid.check_ack_event(enc(doc), 1024) == doc


@pytest.mark.parametrize(("topic", "message_id"), [
    ("persistent://t/ns/x", "t.ns.y:0:5"),  # another topic of the namespace
    ("persistent://t/ns/x", "u.ns.x:0:5"),  # another tenant's
    ("persistent://t/ns/x", "t.ns.x-s-DLQ:0:5"),  # dead letters are not redelivered
    ("persistent://t/ns/x", "t.ns.x-other-RETRY:0:5"),  # another subscription's
    ("persistent://t/ns/x", f"{names.PUBLISH}:0:5"),  # publish requests and their tokens
    ("persistent://t/ns/x", f"{names.ACKS}:0:5"),
    ("persistent://t/ns/x", f"{names.POLICIES}:0:5"),
    ("persistent://t/ns/x", "__consumer_offsets:0:5"),
    ("persistent://t/ns/x-partition-1", "t.ns.y:1:5"),
    ("persistent://dwell/system/x", "t.ns.x:0:5"),  # a system topic: the delay logs only
])
def test_a_message_id_of_another_kafka_topic_is_refused(topic: str, message_id: str) -> None:
    with pytest.raises(invalid.Malformed) as exc:
        invalid.check_ack_event(enc(GOOD | {"topic": topic, "messageId": message_id}), 1024,
                                frozenset({"persistent://dwell/system/x"}))
    assert exc.value.kind == invalid.FIELD
    assert exc.value.reason.startswith(f"messageId: {message_id.rsplit(':', 2)[0]!r} is not "
                                       f"a Kafka topic of {topic!r}"), exc.value.reason


@pytest.mark.parametrize(("field", "value", "words"), [
    ("ts", invalid.MAX_TS_MS + 1,
     f"ts: must be an integer from 0 to {invalid.MAX_TS_MS} (9999-12-31T23:59:59.999Z)"),
    ("ts", 2**63 - 1, "(9999-12-31T23:59:59.999Z)"),
    ("redeliveryCount", 2**31, f"redeliveryCount: must be an integer from 0 to {2**31 - 1}"),
    ("maxRedeliverCount", 2**31, f"maxRedeliverCount: must be an integer from 0 to {2**31 - 1}"),
    ("ackTimeoutMs", 2**62, "ackTimeoutMs: must be an integer from 0 to 3153600000000 (100 "),
    ("ackTimeoutRedeliveryBackoff", {"maxDelayMs": 2**62},
     "ackTimeoutRedeliveryBackoff: maxDelayMs must be at most 3153600000000"),
    ("negativeAckRedeliveryBackoff", {"multiplier": 1e308},
     "negativeAckRedeliveryBackoff: multiplier must be at most 1000"),
])
def test_numbers_are_bounded_so_no_due_time_overflows(field: str, value: object,
                                                      words: str) -> None:
    system = "persistent://dwell/system/x"
    for doc in (GOOD, GOOD | {"topic": system, "messageId": "dwell.delayed:0:0"}):
        with pytest.raises(invalid.Malformed) as exc:
            invalid.check_ack_event(enc(doc | {field: value}), 1024, frozenset({system}))
        assert exc.value.kind == invalid.FIELD and words in exc.value.reason, exc.value.reason


SYSTEM = "persistent://dwell/system/x"
# Values near every bound the check draws: types JSON can hold, the integers at the edges,
# the names of other topics and of the event's own ones.
_INTS = st.sampled_from([0, 1, 5, 999, 1000, 2**31 - 1, 2**31, invalid.MAX_TS_MS,
                         invalid.MAX_TS_MS + 1, 3153600000000, 3153600000001, 2**63 - 1, -1])
_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, st.floats(allow_nan=False),
                     st.sampled_from(["", "s", "x" * 300, "ack", "nack", "settle",
                                      "persistent://t/ns/x", SYSTEM, "t.ns.x:0:5",
                                      "t.ns.y:0:5", "dwell.delayed:0:1", "t.ns.x:0:-5",
                                      "t.ns.x:1:99999999999999999999", "t.ns.x-s-RETRY:1:2"]))
_BACKOFFS = st.dictionaries(st.sampled_from(["minDelayMs", "maxDelayMs", "multiplier", "x"]),
                            _SCALARS, max_size=3)
_FIELDS = ["event", "topic", "subscription", "messageId", "ts", "redeliveryCount",
           "ackTimeoutMs", "maxRedeliverCount", "ackTimeoutRedeliveryBackoff",
           "negativeAckRedeliveryBackoff"]


@settings(max_examples=2000)
@given(base=st.sampled_from([GOOD, GOOD | {"topic": SYSTEM, "messageId": "dwell.delayed:0:0"},
                             GOOD | {"event": "ack", "messageId": "t.ns.x-s-RETRY:0:1"}]),
       changes=st.dictionaries(st.sampled_from(_FIELDS), st.one_of(_SCALARS, _BACKOFFS),
                               min_size=1, max_size=2),
       dropped=st.sets(st.sampled_from(_FIELDS), max_size=1))
@example(GOOD | {"topic": SYSTEM}, {"messageId": "t.ns.x:0:5"}, set())
@example(GOOD, {"messageId": "t.ns.y:0:5"}, set())
@example(GOOD, {"ts": True}, set())
@example(GOOD, {"ackTimeoutRedeliveryBackoff": {"multiplier": True}}, set())
def test_the_quick_look_accepts_only_what_the_full_check_accepts(
        base: dict, changes: dict, dropped: set) -> None:
    doc = {k: v for k, v in (base | changes).items() if k not in dropped}
    doc = orjson.loads(orjson.dumps(doc))  # as the reader sees it
    system = frozenset({SYSTEM})
    if invalid._plainly_good(doc, system):
        invalid._check_event(doc, True, system)  # must not raise


def test_the_largest_numbers_allowed_leave_room_in_a_signed_64_bit_due_time() -> None:
    from dwell.core.backoff import MAX_DELAY_MS
    doc = GOOD | {"ts": invalid.MAX_TS_MS, "ackTimeoutMs": MAX_DELAY_MS,
                  "ackTimeoutRedeliveryBackoff": {"minDelayMs": MAX_DELAY_MS,
                                                  "maxDelayMs": MAX_DELAY_MS,
                                                  "multiplier": 1000},
                  "redeliveryCount": 2**31 - 1, "maxRedeliverCount": 2**31 - 1}
    assert invalid.check_ack_event(enc(doc), 1024) == doc
    assert invalid.MAX_TS_MS + 2 * MAX_DELAY_MS < 2**63 - 1


@pytest.mark.parametrize(("values", "words"), [
    ([b"tok"], "must be 'Bearer <token>'"),
    ([b""], "must be 'Bearer <token>'"),
    ([None], "must be 'Bearer <token>'"),
    ([b"Bearer "], "must be 'Bearer <token>'"),
    ([b"Bearer a b"], "must be 'Bearer <token>'"),
    ([b"Bearer \xff"], "not UTF-8"),
    ([b"Bearer a", b"Bearer b"], "sent 2 times"),
])
def test_authorization_header_types(values: list[bytes | None], words: str) -> None:
    with pytest.raises(invalid.Malformed) as exc:
        invalid.authorization(values)
    assert exc.value.kind == invalid.HEADER and words in exc.value.reason


def test_authorization_header_reads_the_token() -> None:
    assert invalid.authorization([]) is None
    assert invalid.authorization([b"Bearer eyJ.x.y"]) == "eyJ.x.y"


def test_the_invalid_record_keeps_the_bytes_and_says_where_and_why() -> None:
    topic, value, key, headers, ts = invalid.invalid_record(
        names.ACKS, 3, 77, b"k", b"\x00raw", invalid.FIELD, "r" * 5000)
    assert (topic, value, key, ts) == (names.INVALID, b"\x00raw", b"k", None)
    got = dict(headers)
    assert got[hdr.SOURCE_TOPIC] == b"dwell.acks"
    assert (got[hdr.SOURCE_PARTITION], got[hdr.SOURCE_OFFSET]) == (b"3", b"77")
    assert got[hdr.INVALID_KIND] == b"field"
    assert got[hdr.INVALID_REASON] == b"r" * invalid.MAX_REASON_CHARS
