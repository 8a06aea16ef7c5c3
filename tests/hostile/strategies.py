"""Hypothesis strategies for hostile input: records of the right shape for `dwell.publish`,
`dwell.acks` and `dwell.policies` whose values are not what a reader expects, their
headers, and HTTP bodies and headers for the three services' routes.

Big inputs are built from a drawn size, not drawn item by item: hypothesis would spend
the run generating them, and a size near a limit is what finds the bugs."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from dwell import headers as hdr

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)

# Names the fuzzed records and requests aim at: the fuzzer's own tenant, another tenant
# that exists (the victim), dwell's reserved tenant and its backoff warm-up topic.
OWN = "fz"
VICTIM = "victim"
WARM_UP_TOPIC = "persistent://dwell/system/backoff-warm-up"
TENANTS = (OWN, VICTIM, "dwell", "", "a_b", "a.b", "x" * 300, "ünï", "../..")
TOPICS = (f"persistent://{OWN}/ns/x", f"persistent://{VICTIM}/ns/secret", WARM_UP_TOPIC,
          f"non-persistent://{OWN}/ns/x", f"persistent://{OWN}/ns/x-partition-99999999999",
          f"persistent://{OWN}/ns", "persistent://a/b/c/d", f"persistent://{OWN}/ns/" + "y" * 300,
          "persistent:///ns/x", "kafka://fz/ns/x", "", "dwell.delayed", "dwell.publish")
# messageIds naming records of other topics: the victim's ready topic, dwell's internal
# topics (dwell.publish keeps other clients' tokens in its headers), and out-of-range
# partitions and offsets.
MESSAGE_IDS = (f"{OWN}.ns.x:0:0", f"{VICTIM}.ns.secret:0:0", "dwell.delayed:0:0",
               "dwell.publish:0:0", "dwell.acks:0:0", f"{OWN}.ns.x:-1:-1",
               f"{OWN}.ns.x:{LONG_MAX}:{LONG_MAX}", f"{OWN}.ns.x:0:{2**64}", "a:b:c", "",
               f"{OWN}.ns.x-s-DLQ:0:0", "::", "x" * 1000 + ":0:0")

# Objects nested past Python's recursion limit: JSON parsers that recurse fail on it with
# RecursionError, which is not a ValueError.
DEEP_OBJECT = b'{"a":' * 1000 + b"1" + b"}" * 1000
# Arrays nested deeper still: a parser that recurses in native code overflows its stack.
DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000

_NUMBERS = (0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**53 + 1, LONG_MAX, LONG_MIN, LONG_MAX + 1,
            2**64, 10**30, -(10**30))


def numbers() -> st.SearchStrategy[Any]:
    """Integers at the edges of every width a reader might convert to, and floats."""
    return st.one_of(st.sampled_from(_NUMBERS), st.integers(),
                     st.floats(allow_nan=False, allow_infinity=False), st.just(1e308))


def long_text() -> st.SearchStrategy[str]:
    return st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "\u0000", "💥"]),
                     st.sampled_from([1_000, 20_000, 200_000]))


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.booleans(), numbers(), st.text(max_size=20), long_text())


def _nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def small() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.booleans(), st.sampled_from(_NUMBERS), st.text(max_size=5))


def many(item: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """A list of one drawn (small) item repeated a drawn number of times, up to past every
    cap: 2,000 bad items made admission's memory grow with their square."""
    return st.builds(lambda x, n: [x] * n, item, st.sampled_from([0, 2, 1001, 2000]))


def values() -> st.SearchStrategy[Any]:
    """Any JSON value, hostile ones weighted in: deep nesting, many items, big numbers."""
    return st.one_of(
        scalars(),
        st.builds(_nested, st.sampled_from([50, 900]), scalars()),
        many(small()),
        st.recursive(scalars(), lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner,
                                                         max_size=4)), max_leaves=8))


def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: valid half the time, hostile otherwise."""
    return st.one_of(valid, values())


def shaped(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with the given fields, each of them possibly missing, plus stray keys."""
    return st.builds(
        lambda present, extra: {k: v for k, v in present.items() if v is not _MISSING} | extra,
        st.fixed_dictionaries({k: st.one_of(st.just(_MISSING), field(v))
                               for k, v in fields.items()}),
        st.dictionaries(st.text(max_size=10), values(), max_size=2))


_MISSING = object()


def encoded(doc: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """The document as JSON, or mangled: invalid UTF-8 spliced in, cut short, deep
    nesting past any parser's recursion limit, NaN, not JSON at all."""
    as_json = doc.map(lambda d: json.dumps(d).encode())
    return st.one_of(
        as_json, as_json, as_json,
        st.builds(lambda b, at: b[:at % (len(b) + 1)] + b"\xff\xfe" + b[at % (len(b) + 1):],
                  as_json, st.integers(0, 10_000)),
        st.builds(lambda b, at: b[:at % (len(b) + 1)], as_json, st.integers(0, 10_000)),
        st.builds(lambda n: b"[" * n + b"]" * n, st.sampled_from([1_000, 10_000])),
        st.just(DEEP_ARRAY),
        st.just(DEEP_OBJECT), st.builds(lambda n: b'{"a":' * n + b"1" + b"}" * n,
                                        st.sampled_from([100, 50_000])),
        st.just(b'{"ts": NaN, "x": Infinity}'), st.binary(max_size=64), st.just(b""))


def _header_value() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.just(b"Bearer "), st.just(b"Bearer x.y.z"), st.just(b"\xff\xfe"),
        st.just(b"Bearer " + b"a" * 100_000), st.binary(max_size=32),
        numbers().map(lambda n: str(n).encode()))


def headers(names: tuple[str, ...]) -> st.SearchStrategy[list[tuple[str, bytes]]]:
    """Kafka headers as a list (names may repeat): dwell's own names with hostile values,
    duplicated, and many unknown ones."""
    named = st.lists(st.tuples(st.sampled_from(names), _header_value()), max_size=4)
    crowd = st.builds(lambda n: [(f"h{i}", b"v") for i in range(n)],
                      st.sampled_from([0, 0, 0, 2000]))
    return st.builds(lambda a, b: a + b, named, crowd)


def message() -> st.SearchStrategy[dict[str, Any]]:
    return shaped({"payload": st.text(max_size=20), "key": st.text(max_size=10),
                   "properties": st.dictionaries(st.text(max_size=5), st.text(max_size=5),
                                                 max_size=2),
                   "eventTime": st.integers(0, 2**41), "sequenceId": st.integers(0, 2**40),
                   "deliverAt": st.integers(0, 2**42),
                   "deliverAfterMs": st.integers(0, 10**6)})


def publish_request(with_topic: bool) -> st.SearchStrategy[dict[str, Any]]:
    """A publish request (the HTTP body; on dwell.publish with its `topic`, or a cancel
    request)."""
    fields: dict[str, st.SearchStrategy[Any]] = {
        "producerName": st.text(max_size=10),
        "messages": st.one_of(
            st.lists(message(), max_size=3), many(st.just(1)),
            many(st.fixed_dictionaries({"payload": st.text(max_size=3),
                                        "deliverAfterMs": small()})))}
    if with_topic:
        fields["topic"] = st.sampled_from(TOPICS)
        # A cancel request (dwell.admission.cancels): ids of any topic and shape, past
        # the cap, with or without messages beside it.
        fields["cancel"] = st.one_of(st.lists(st.sampled_from(MESSAGE_IDS), max_size=3),
                                     many(st.sampled_from(MESSAGE_IDS)))
    return shaped(fields)


def backoff() -> st.SearchStrategy[dict[str, Any]]:
    return shaped({"minDelayMs": st.integers(0, 10_000), "maxDelayMs": st.integers(0, 60_000),
                   "multiplier": st.floats(1, 10)})


def subscription_settings() -> dict[str, st.SearchStrategy[Any]]:
    return {"ackTimeoutMs": st.integers(0, 10**6),
            "ackTimeoutRedeliveryBackoff": backoff(),
            "negativeAckRedeliveryBackoff": backoff(),
            "maxRedeliverCount": st.integers(0, 20)}


def ack_event() -> st.SearchStrategy[dict[str, Any]]:
    return shaped({"event": st.sampled_from(["delivered", "ack", "nack", "settled"]),
                   "topic": st.sampled_from(TOPICS),
                   "subscription": st.sampled_from(["s", "", "a" * 300, "x/y", "s-DLQ"]),
                   "messageId": st.sampled_from(MESSAGE_IDS),
                   "redeliveryCount": st.integers(0, 20), "ts": numbers(),
                   **subscription_settings()})


def tenant_info() -> st.SearchStrategy[dict[str, Any]]:
    roles = st.one_of(st.lists(st.text(max_size=10), max_size=3),
                      st.builds(lambda n: [f"role-{i:010d}" for i in range(n)],
                                st.sampled_from([1_000, 90_000])))
    return shaped({"adminRoles": roles, "allowedClusters": st.lists(st.text(max_size=8),
                                                                     max_size=2)})


def delayed_delivery() -> st.SearchStrategy[dict[str, Any]]:
    return shaped({"active": st.booleans(), "tickTime": st.integers(1, 10**6),
                   "maxDeliveryDelayInMillis": st.integers(0, 10**9),
                   "fixedDeliveryDelayInMillis": st.integers(0, 10**9)})


def policy_scope() -> st.SearchStrategy[str]:
    """`dwell.policies` keys: every kind of scope, on the fuzzer's and the victim's names."""
    return st.one_of(
        st.builds(lambda k, n: f"{k}:{n}",
                  st.sampled_from(["tenant", "namespace", "ns", "topic", "cluster", ""]),
                  st.sampled_from([*TENANTS, f"{OWN}/ns", f"{VICTIM}/ns", "dwell/system",
                                   *TOPICS])),
        st.text(max_size=20), long_text())


def policy_value() -> st.SearchStrategy[bytes | None]:
    """A feed record's value as the policy service writes them (`version` plus the
    scope's object), with hostile values; None is a tombstone."""
    version = st.one_of(numbers(), st.just(1e300))
    doc = st.one_of(
        shaped({"version": version, "tenant": field(tenant_info())}),
        shaped({"version": version, "permissions": values(), "policies": values()}),
        shaped({"version": version, "policy": field(delayed_delivery()),
                "partitioned": values()}))
    overflow = st.sampled_from([b'{"version": 1e400}', b'{"version": -1e400, "tenant": {}}',
                                b'{"version": 1, "tenant": "x"}',
                                b'{"version": 1, "tenant": {"adminRoles": 7}}'])
    return st.one_of(st.none(), encoded(doc), overflow)


POLICY_HEADERS = (hdr.VERSION,)
PUBLISH_HEADERS = (hdr.AUTHORIZATION,)
ACK_HEADERS = (hdr.AUTHORIZATION,)


def http_headers() -> st.SearchStrategy[list[tuple[str, str]]]:
    """Request headers beyond the client's own: a huge one, many, odd content types,
    and a forged token."""
    one = st.one_of(
        st.just(("content-type", "application/json")), st.just(("content-type", "text/plain")),
        st.just(("content-type", "application/json; charset=latin-1")),
        st.just(("authorization", "Bearer x.y.z")), st.just(("authorization", "Basic Zm9v")),
        st.builds(lambda n: ("x-big", "a" * n), st.sampled_from([10_000, 200_000])),
        st.just(("content-encoding", "gzip")), st.just(("expect", "100-continue")))
    crowd = st.builds(lambda n: [(f"x-h{i}", "v") for i in range(n)],
                      st.sampled_from([0, 0, 0, 500]))
    return st.builds(lambda a, b: a + b, st.lists(one, max_size=3), crowd)


def oversized_body() -> st.SearchStrategy[bytes]:
    return st.builds(lambda n: b'{"pad": "' + b"x" * n + b'"}',
                     st.sampled_from([2 * 2**20, 9 * 2**20]))
