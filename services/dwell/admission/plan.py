"""A publish request's plan: every message checked and decided by `dwell.core.admit.admit`
with the topic's effective policy, and the records to write for the accepted ones (to the
topic's ready topic when immediate, to `dwell.delayed` when delayed, with the headers of
docs/internals.md), then the answer once Kafka has them.

Validation, decided here for both entry paths (the body's shape is `schema.py`'s):

* A request is refused as a whole (HTTP 400 naming the field) for more than
  `max_messages_per_request` messages, a payload above `max_payload_bytes` (counted after
  base64 decoding), a property named like a dwell header (`dwell-*`), an `eventTime`
  string past Long.MAX_VALUE. A request without messages gets no results, as in Pulsar.
  After the plan, `Publisher.route` refuses (404) a topic that does not exist when topics
  are not auto-created, and a partition `x-partition-N` that x does not have.
* A well-formed message that cannot be published gets its own result, Pulsar's
  `ProducerAck` with `messageId` "-1", `errorCode` 2 and an `errorMsg`, and the rest of
  the batch goes on: a payload that is not valid base64, and the max-delay rejection
  (`...BrokerServiceException$NotAllowedException: Exceeds max allowed delivery delay of
  N milliseconds`).
* The publish time is when admission received the request (Pulsar's publishTime), and
  `deliverAfterMs` and the max delay count from it. `eventTime` is the application's own
  field, carried in `dwell-event-time` (0 or "" mean not set, as in Pulsar). `deliverAt`
  and `deliverAfterMs` 0 mean not set (Pulsar's primitive longs); with both set,
  `deliverAt` wins, as in Pulsar.
* `scheduleKey` (dwell's own): a delayed message carries it in `dwell-schedule-key` and
  replaces the topic's pending message with that key when the tracker indexes it; an
  immediate one goes to its ready topic as any other, plus a release on `dwell.delayed`
  (the key and no deliver-at) that cancels the pending one. It is ignored on
  non-persistent topics, which hold nothing pending. An empty key, or one over
  MAX_SCHEDULE_KEY_BYTES, refuses the request (400).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from dwell.adapters import kafka
from dwell.cache import BoundedCache
from dwell.core import topics as names
from dwell.core.admit import Decision, Override, Reject, admit
from dwell.core.policy import MAX_LONG, EffectivePolicy
from dwell.core.topics import TopicName
from dwell.headers import (
    DELIVER_AT,
    EVENT_TIME,
    KEY,
    MAX_SCHEDULE_KEY_BYTES,
    PARTITION,
    PRODUCER,
    PUBLISH_TIME,
    SCHEDULE_KEY,
    SEQUENCE_ID,
    TICK_TIME,
    TOPIC,
)
from dwell.policy_view import PolicyCache

from .schema import PublishError, PublishRequest, parse_request, too_many
from .settings import AdmissionSettings

RESERVED_HEADER_PREFIX = "dwell-"
INVALID_MESSAGE = 2  # Pulsar's non-retriable errorCode
# Pulsar's ServerError codes (PulsarApi.proto) for a request refused for its credentials.
AUTHENTICATION_ERROR = 3
AUTHORIZATION_ERROR = 4
# ProducerAck's and ProducerAcks' schemaVersion: dwell keeps payloads as sent, under no
# registered schema.
SCHEMA_VERSION = 0
FAILED_MESSAGE_ID = "-1"  # a failed ProducerAck's messageId, as Pulsar's REST producer's
# Stands in for a policy on non-persistent topics, which admit() never consults.
_NO_POLICY = EffectivePolicy(active=False, tick_time_ms=1, max_delay_ms=0, fixed_delay_ms=0)

Headers = tuple[tuple[str, bytes], ...]


class Decided(NamedTuple):
    """One decision as a plan uses it, shared by the messages of a request that ask the
    same thing."""

    result: dict[str, Any]  # the result's fields before its messageId
    delay_headers: Headers | None  # None: rejected; empty: immediate
    counts_override: int  # 1 when it counts as a fixed-delay override
    head: str  # an accepted result's JSON up to its messageId's partition ("": rejected)


@dataclass(slots=True)
class Plan:
    """A request after the checks: per-message results and the records to write, each
    with the index of its result. An accepted message's result is its decision's fields,
    the same dict for every message decided alike, until `finish` (or `answer`) adds
    its messageId."""

    topic: TopicName
    results: list[dict[str, Any]]
    sends: list[kafka.OutRecord] = field(default_factory=list)
    index: list[int] = field(default_factory=list)  # result index of each send
    # Each send's result as JSON up to its messageId's partition: the decision's fields,
    # then `"messageId":"<kafkaTopic>:` (see `answer`).
    heads: list[str] = field(default_factory=list)
    immediate: int = 0
    delayed: int = 0
    invalid: int = 0
    rejected: int = 0
    overridden: int = 0  # accepted messages that count as fixed-delay overrides
    # Releases of schedule keys (immediate messages with a key), the last sends: they
    # have no result of their own.
    releases: int = 0

    def partitions(self) -> list[int] | None:
        """Each send's Kafka partition (-1: the partitioner's choice), or None when the
        partitioner chooses for every send: the immediate messages of a partition
        `x-partition-N` go to partition N of x's ready topic; its delayed ones go to the
        delay log as any other (the drain reads N from their dwell-partition)."""
        index = self.topic.partition_index
        if index < 0:
            return None
        ready = self.topic.partitioned_topic.kafka_topic
        return [index if out[0] == ready else -1 for out in self.sends]


def failed(error_code: int, error_msg: str) -> dict[str, Any]:
    """A message's result when it was not published: Pulsar's ProducerAck."""
    return {"messageId": FAILED_MESSAGE_ID, "errorCode": error_code, "errorMsg": error_msg,
            "schemaVersion": SCHEMA_VERSION}


def _decode_payload(text: str, encoding: str | None) -> bytes | str:
    """The payload bytes, or an error text for a per-message failure."""
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            return "payload is not valid base64"
    return text.encode("utf-8", "surrogatepass")


def _head(fields: dict[str, Any], kafka_topic: str) -> str:
    """An accepted result's JSON up to its messageId's partition (Kafka topic names
    need no JSON escaping)."""
    return orjson.dumps(fields)[:-1].decode() + f',"messageId":"{kafka_topic}:'


def _schedule_key(i: int, key: str) -> bytes:
    """A message's schedule key as header bytes; PublishError 400 when empty or longer
    than MAX_SCHEDULE_KEY_BYTES."""
    raw = key.encode()  # msgspec refused lone surrogates while parsing
    if not raw or len(raw) > MAX_SCHEDULE_KEY_BYTES:
        raise PublishError(400, f"messages[{i}].scheduleKey: {len(raw)} bytes; a schedule key "
                                f"has 1 to {MAX_SCHEDULE_KEY_BYTES} bytes")
    return raw


def _decided(decision: Decision, tick_b: bytes, ready: str, partition_h: Headers) -> Decided:
    if type(decision) is Reject:
        return Decided(failed(decision.error_code, decision.full_error), None, 0, "")
    result: dict[str, Any] = {"errorCode": 0, "schemaVersion": SCHEMA_VERSION,
                              "deliverAt": decision.deliver_at, "delayed": decision.delayed}
    delay_ignored = getattr(decision, "delay_ignored", None)
    if delay_ignored:
        result["delayIgnored"] = delay_ignored
    delay_h: Headers = ()
    if decision.delayed:
        delay_h = ((DELIVER_AT, b"%d" % decision.deliver_at), (TICK_TIME, tick_b),
                   *partition_h)
    counts = type(decision) is Override and decision.counts_as_override
    return Decided(result, delay_h, int(counts),
                   _head(result, names.DELAYED if delay_h else ready))


class Planner:
    """Plans requests against the policy cache and writes their answers."""

    def __init__(self, settings: AdmissionSettings, cache: PolicyCache,
                 clock: Callable[[], float]) -> None:
        self.settings = settings
        self.cache = cache
        self.clock = clock
        self.strict = settings.delayed_delivery_deliver_at_time_strict
        self._bytes: BoundedCache[TopicName, tuple[bytes, str]] = BoundedCache()

    def plan(self, topic: TopicName, req: PublishRequest) -> Plan:
        """Check a request and decide every message; raises PublishError for the request."""
        s = self.settings
        self._check_publishable(topic)
        msgs = req.messages
        if len(msgs) > s.max_messages_per_request:
            raise too_many(len(msgs), s.max_messages_per_request)

        now = int(self.clock() * 1000)
        topic_b, ready = self._topic_bytes(topic)
        decide = self._decider(topic, now, ready)
        topic_h = (TOPIC, topic_b)
        producer_h = (PRODUCER, (req.producerName or "").encode())
        # The dwell headers every message of the request starts with.
        now_hs = [topic_h, (PUBLISH_TIME, b"%d" % now), producer_h]
        default_encoding = req.payloadEncoding
        max_payload = s.max_payload_bytes
        # admit() is a pure function of these and of what `decide` holds fixed for the
        # request: messages asking the same thing share one decision, with its result
        # fields and delay headers. Likewise the encoded properties.
        decisions: dict[tuple[int | None, int | None], Decided] = {}
        encoded_props: dict[tuple[tuple[str, str], ...], list[tuple[str, bytes]]] = {}
        last_props: dict[str, str] | None = None
        last_props_h: list[tuple[str, bytes]] | None = None
        plan = Plan(topic, [])
        results = plan.results
        sends = plan.sends
        index = plan.index
        heads = plan.heads
        delayed_topic = names.DELAYED
        overridden = delayed = 0
        releases: list[kafka.OutRecord] = []
        # Request-level errors (payload size, reserved property names) raise from inside
        # the loop; the per-message outcomes gathered before are thrown away with the plan.
        for i, m in enumerate(msgs):
            text = m.payload
            if (m.payloadEncoding or default_encoding) == "base64":
                payload = _decode_payload(text, "base64")
            else:
                payload = text.encode("utf-8", "surrogatepass")
            is_bytes = type(payload) is bytes
            if is_bytes and len(payload) > max_payload:
                raise PublishError(400, f"messages[{i}].payload: {len(payload)} bytes; the "
                                        f"limit is {max_payload} bytes (max_payload_bytes)")
            props = m.properties
            if not props:
                props_h = None
            elif props == last_props:  # batches often repeat them: skip building the key
                props_h = last_props_h
            else:
                pkey = tuple(props.items())
                props_h = encoded_props.get(pkey)
                if props_h is None:
                    for name in props:
                        if name.lower().startswith(RESERVED_HEADER_PREFIX):
                            raise PublishError(400, f"messages[{i}].properties.{name}: names "
                                                    f"starting with 'dwell-' are reserved")
                    props_h = encoded_props[pkey] = [(k, v.encode()) for k, v in pkey]
                last_props, last_props_h = props, props_h
            event_time = m.eventTime
            if type(event_time) is str:
                event_time = int(event_time) if event_time else None
                if event_time is not None and event_time > MAX_LONG:
                    raise PublishError(400, f"messages[{i}].eventTime: {m.eventTime} is past "
                                            f"Long.MAX_VALUE ({MAX_LONG})")
            if not is_bytes:
                results.append(failed(INVALID_MESSAGE, str(payload)))
                plan.invalid += 1
                continue
            deliver_at = m.deliverAt or None
            asked = (deliver_at, None if deliver_at else m.deliverAfterMs or None)
            decided = decisions.get(asked)
            if decided is None:
                decided = decisions[asked] = decide(*asked)
            proto, delay_h, counts_override, head = decided
            if delay_h is None:  # rejected
                results.append(proto.copy())
                plan.rejected += 1
                continue
            overridden += counts_override
            headers = props_h + now_hs if props_h else now_hs.copy()
            seq = m.sequenceId
            if seq is not None:
                headers.append((SEQUENCE_ID, b"%d" % seq))
            if event_time:
                headers.append((EVENT_TIME, b"%d" % event_time))
            key = m.key
            key_b = key.encode() if key is not None else None
            schedule_key = m.scheduleKey
            if schedule_key is not None:
                schedule_b = _schedule_key(i, schedule_key)
            if delay_h:
                headers += delay_h
                if key_b is not None:
                    headers.append((KEY, key_b))
                if schedule_key is not None:
                    headers.append((SCHEDULE_KEY, schedule_b))
                sends.append((delayed_topic, payload, topic_b, headers, now))
                delayed += 1
            else:
                sends.append((ready, payload, key_b, headers, now))
                if schedule_key is not None and topic.persistent:
                    releases.append((delayed_topic, b"", topic_b,
                                     [topic_h, now_hs[1], (SCHEDULE_KEY, schedule_b)], now))
            index.append(i)
            heads.append(head)
            # Shared by the messages with this decision until finish() gives each its own.
            results.append(proto)

        plan.delayed = delayed
        plan.immediate = len(sends) - delayed
        plan.overridden = overridden
        plan.releases = len(releases)
        sends += releases
        return plan

    def plan_body(self, topic: TopicName, body: bytes) -> Plan:
        """`plan(topic, parse_request(body))`: the HTTP body as sent."""
        return self.plan(topic, parse_request(body, PublishRequest,
                                              self.settings.max_messages_per_request))

    def _check_publishable(self, topic: TopicName) -> None:
        if not self.cache.ready.is_set():
            raise PublishError(503, "policies not loaded yet; retry shortly")
        if not self.cache.namespace_known(topic.tenant, topic.namespace):
            raise PublishError(404, f"Namespace {topic.namespace_name} does not exist")

    def _decider(self, topic: TopicName, now: int,
                 ready: str) -> Callable[[int | None, int | None], Decided]:
        """A request's decisions: `decide(deliver_at, deliver_after_ms)` applies admit()
        with the topic's policy to a message received at `now` (`ready`: the topic's
        ready topic, for the heads of immediate results).

        A partition `x-partition-N` runs with x's policy (its topic policy, then the
        namespace's), as Pulsar applies a partitioned topic's policies to its partitions,
        and its delayed messages carry N (dwell-partition) for the drain."""
        persistent = topic.persistent
        policy = self.cache.effective(topic.partitioned_topic) if persistent else _NO_POLICY
        tick_b = b"%d" % policy.tick_time_ms
        strict = self.strict
        limit = self.settings.delayed_delivery_delay_limit_ms
        index = topic.partition_index
        partition_h: Headers = ((PARTITION, b"%d" % index),) if index >= 0 else ()

        def decide(deliver_at: int | None, deliver_after: int | None) -> Decided:
            return _decided(admit(deliver_at=deliver_at, deliver_after_ms=deliver_after,
                                  policy=policy, persistent=persistent, publish_time=now,
                                  now=now, strict=strict, delay_limit_ms=limit),
                            tick_b, ready, partition_h)

        return decide

    def _topic_bytes(self, topic: TopicName) -> tuple[bytes, str]:
        """The topic's name as header bytes (dwell-topic, and the delay log's record key)
        and its ready topic, computed once per topic. For a partition `x-partition-N`
        both are x's: the messages live in x's ready topic (partition N), and their
        delayed ones in x's index (docs/internals.md, "Partitions")."""
        got = self._bytes.get(topic)
        if got is None:
            owner = topic.partitioned_topic
            got = self._bytes.put(topic, (str(owner).encode(), owner.kafka_topic))
        return got

    @staticmethod
    def finish(plan: Plan, offsets: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        """Fill in the messageIds, `<kafkaTopic>:<partition>:<offset>`; every accepted
        result becomes a dict of its own (the caller may add fields to it)."""
        results = plan.results
        accepted = len(plan.index)
        for i, out, (partition, offset) in zip(plan.index, plan.sends[:accepted],
                                               offsets[:accepted], strict=True):
            results[i] = {**results[i], "messageId": f"{out[0]}:{partition}:{offset}"}
        return results

    def answer(self, plan: Plan, offsets: Sequence[tuple[int, int]]) -> bytes:
        """The HTTP answer, Pulsar's ProducerAcks: the bytes of
        `{"messagePublishResults": finish(plan, offsets), "schemaVersion": 0}` as orjson
        writes them, without a dict per message: an accepted result is its
        head (`Plan.heads`) and `<partition>:<offset>"}`."""
        results = plan.results
        parts = [f'{head}{partition}:{offset}"}}' for head, (partition, offset)
                 in zip(plan.heads, offsets[:len(plan.heads)], strict=True)]
        if len(parts) != len(results):
            accepted = dict(zip(plan.index, parts, strict=True))
            parts = [accepted.get(i) or orjson.dumps(r).decode()
                     for i, r in enumerate(results)]
        return ('{"messagePublishResults":[' + ",".join(parts)
                + f'],"schemaVersion":{SCHEMA_VERSION}}}').encode()
