"""The publish path shared by HTTP and the Kafka ingress: parse a Pulsar REST producer
request, apply `dwell.core.admit.admit` to each message with the topic's effective policy,
and write accepted messages to the topic's ready topic (immediate) or to `dwell.delayed`
(delayed), with the headers of docs/internals.md. On the HTTP path `dwell_native` (Rust,
native/, optional: see `native.py`) plans the common request straight from its JSON;
`Publisher.plan` here is the reference it is tested against and takes every other
request.

Request validation, decided here for both entry paths:

* A malformed request body is refused as a whole (HTTP 400 naming the field): not JSON,
  wrong types (`"deliverAt": "5"`), unknown fields, a missing `payload`, more than
  `max_messages_per_request` messages or none, a payload above `max_payload_bytes`
  (counted after base64 decoding), a property named like a dwell header (`dwell-*`).
* A well-formed message that cannot be published gets its own result with `errorCode` 2
  and the rest of the batch goes on: both `deliverAt` and `deliverAfterMs` set, a payload
  that is not valid base64, and the max-delay rejection (`NotAllowedError: ...`).
* `eventTime` 0 means "not set", as in Pulsar; `publishTime` is `eventTime` or the clock.
* Kafka not acknowledging every accepted message within `publish_timeout_ms` fails the
  whole request as retriable (HTTP 503): no message of it is reported as accepted, and
  a retry may duplicate the ones that did land.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import orjson
import pydantic
from pydantic import ConfigDict, Field

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.admit import Decision, Override, Reject, admit
from dwell.core.policy import MAX_LONG, EffectivePolicy
from dwell.core.topics import InvalidTopicName, TopicName

from . import metrics, native
from .cache import PolicyCache
from .settings import AdmissionSettings

log = logging.getLogger("dwell.admission")
_Long = Annotated[int, Field(ge=0, le=MAX_LONG)]
RESERVED_HEADER_PREFIX = "dwell-"
INVALID_MESSAGE = 2  # Pulsar's non-retriable errorCode
# Stands in for a policy on non-persistent topics, which admit() never consults.
_NO_POLICY = EffectivePolicy(active=False, tick_time_ms=1, max_delay_ms=0, fixed_delay_ms=0)


class MessageIn(pydantic.BaseModel):
    """One message of Pulsar's `ProduceMessageRequest` (plus dwell's `payloadEncoding`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    payload: str
    payloadEncoding: Literal["base64", "utf-8"] | None = None
    key: str | None = None
    properties: dict[str, str] | None = None
    eventTime: _Long | None = None
    sequenceId: _Long | None = None
    deliverAt: _Long | None = None
    deliverAfterMs: _Long | None = None


class PublishRequest(pydantic.BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    producerName: str | None = None
    payloadEncoding: Literal["base64", "utf-8"] | None = None
    messages: list[MessageIn]


class IngressRequest(PublishRequest):
    """A record on `dwell.publish`: the HTTP body plus the Pulsar `topic`."""

    topic: str | None = None


class Message(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, gc=False):
    """A validated message: `MessageIn` as decoded on the hot path (see `parse_request`).
    A field not sent reads as None. Not tracked by the cycle collector (`gc=False`): it
    holds strings, integers and a dict of strings, so it cannot be part of a cycle."""

    payload: str
    payloadEncoding: Literal["base64", "utf-8"] | None = None
    key: str | None = None
    properties: dict[str, str] | None = None
    eventTime: Annotated[int, msgspec.Meta(ge=0, le=MAX_LONG)] | None = None
    sequenceId: Annotated[int, msgspec.Meta(ge=0, le=MAX_LONG)] | None = None
    deliverAt: Annotated[int, msgspec.Meta(ge=0, le=MAX_LONG)] | None = None
    deliverAfterMs: Annotated[int, msgspec.Meta(ge=0, le=MAX_LONG)] | None = None


class _PublishBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    messages: list[Message]
    producerName: str | None = None
    payloadEncoding: Literal["base64", "utf-8"] | None = None


class _IngressBody(_PublishBody, kw_only=True, forbid_unknown_fields=True):
    topic: str | None = None


_DECODERS = {PublishRequest: msgspec.json.Decoder(_PublishBody),
             IngressRequest: msgspec.json.Decoder(_IngressBody)}


@dataclass(slots=True)
class Request:
    """A validated publish request."""

    producerName: str | None
    payloadEncoding: str | None
    messages: list[Message]
    topic: str | None = None


class PublishError(Exception):
    """The whole request fails: `status` is the HTTP status it answers with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def describe(exc: pydantic.ValidationError) -> str:
    """One clause per bad field, e.g. `messages[2].deliverAt: must be an integer`."""
    parts: list[str] = []
    for err in exc.errors(include_url=False):
        where = ""
        for p in err["loc"]:
            where += f"[{p}]" if isinstance(p, int) else (f".{p}" if where else str(p))
        kind = err["type"]
        if kind == "json_invalid":
            return f"body: is not valid JSON ({err.get('ctx', {}).get('error', '')})"
        text = {"extra_forbidden": "unknown field", "missing": "is required",
                "int_type": "must be an integer", "string_type": "must be a string",
                "list_type": "must be a list", "dict_type": "must be a JSON object",
                "model_type": "must be a JSON object"}.get(kind, err["msg"])
        parts.append(f"{where or 'body'}: {text}")
    return "; ".join(dict.fromkeys(parts))


def parse_request(body: bytes, model: type[PublishRequest] = PublishRequest) -> Request:
    """Parse and validate a request body against `model`; PublishError 400 naming the
    field when it does not fit.

    The hot path decodes with msgspec into `Message` structs: validation and decoding in
    one C pass, ~4x cheaper than JSON parsing plus a check of the decoded dicts. The
    pydantic model stays the authority: a body msgspec refuses goes to pydantic, which
    words the error (every bad field, named as in `describe`); tests hold the two to
    accepting the same bodies with the same values."""
    try:
        got = _DECODERS[model].decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    else:
        return Request(got.producerName, got.payloadEncoding, got.messages,
                       getattr(got, "topic", None))
    try:
        req = model.model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise PublishError(400, describe(exc)) from None
    return Request(req.producerName, req.payloadEncoding,
                   [Message(**m.model_dump()) for m in req.messages],
                   getattr(req, "topic", None))


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


def _decode_payload(text: str, encoding: str | None) -> bytes | str:
    """The payload bytes, or an error text for a per-message failure."""
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            return "payload is not valid base64"
    return text.encode("utf-8", "surrogatepass")


# A decision as plan() uses it: the result fields, the delay headers (None: rejected,
# empty: immediate) and whether it counts as a fixed-delay override (0 or 1).
_Decided = tuple[dict[str, Any], tuple[tuple[str, bytes], ...] | None, int]
# ... and, as plan() keeps it, with its accepted results' head (see `Plan.heads`).
_Planned = tuple[dict[str, Any], tuple[tuple[str, bytes], ...] | None, int, str]


def _head(fields: dict[str, Any], kafka_topic: str) -> str:
    """An accepted result's JSON up to its messageId's partition (Kafka topic names
    need no JSON escaping)."""
    return orjson.dumps(fields)[:-1].decode() + f',"messageId":"{kafka_topic}:'


def _decide(decision: Decision, tick_b: bytes) -> _Decided:
    if type(decision) is Reject:
        return {"errorCode": decision.error_code, "error": decision.full_error}, None, 0
    result: dict[str, Any] = {"errorCode": 0, "deliverAt": decision.deliver_at,
                              "delayed": decision.delayed}
    delay_ignored = getattr(decision, "delay_ignored", None)
    if delay_ignored:
        result["delayIgnored"] = delay_ignored
    delay_h: tuple[tuple[str, bytes], ...] = ()
    if decision.delayed:
        delay_h = (("dwell-deliver-at", b"%d" % decision.deliver_at), ("dwell-tick-time", tick_b))
    counts = type(decision) is Override and decision.counts_as_override
    return result, delay_h, int(counts)


class Publisher:
    """Applies the publish rule and writes the records; one per process, both paths."""

    def __init__(self, settings: AdmissionSettings, cache: PolicyCache, producer: kafka.Producer,
                 clock: Callable[[], float] = time.time,
                 catch_up: Callable[[], Future[bool]] | None = None) -> None:
        self.settings = settings
        self.cache = cache
        # The policy follower's catch_up (see cache.py): asked before a miss is answered.
        self.catch_up = catch_up
        self.clock = clock
        self.strict = settings.delayed_delivery_deliver_at_time_strict
        self.native = native.load(settings.native)
        self._topics: dict[tuple[str, str, str, str], TopicName | str] = {}
        self._ready_topics: set[str] = set()
        self._labels: dict[str, tuple[Any, Any]] = {}
        self._bytes: dict[TopicName, tuple[bytes, str]] = {}
        self._counters: dict[tuple[str, str], Any] = {}
        self.deliveries = Deliveries(producer, settings.publish_timeout_ms / 1000 + 1.0)

    # -- topics

    def topic(self, domain: str, tenant: str, namespace: str, local: str) -> TopicName:
        """Parse and remember a topic; 404 for an unknown domain, 400 for a bad name."""
        key = (domain, tenant, namespace, local)
        got = self._topics.get(key)
        if got is None:
            if len(self._topics) > 100_000:
                self._topics.clear()
            try:
                got = TopicName.of(domain, tenant, namespace, local)
            except InvalidTopicName as exc:
                got = str(exc)
            self._topics[key] = got
        if isinstance(got, str):
            raise PublishError(400 if domain in names.DOMAINS else 404, f"topic: {got}")
        return got

    def ready_topic_missing(self, topic: TopicName) -> bool:
        """Whether `ensure_ready_topic` still has to create the topic's ready topic."""
        return self._topic_bytes(topic)[1] not in self._ready_topics

    def ensure_ready_topic(self, topic: TopicName) -> None:
        """Create a topic's ready topic on first use (blocking admin call, once per
        process); PublishError 409 when Kafka refuses its name. Every plan with records
        needs it, delayed ones too: the drain will write them there, and a name Kafka
        refuses must be refused now rather than when they come due."""
        kafka_topic = self._topic_bytes(topic)[1]
        if kafka_topic not in self._ready_topics:
            try:
                kafka.ensure_topic(self.settings.kafka_bootstrap, kafka_topic,
                                   self.settings.ready_topic_partitions,
                                   self.settings.kafka_replication_factor)
            except kafka.TopicRefused as exc:
                raise PublishError(409, f"topic: {topic} maps to the Kafka topic {kafka_topic}"
                                        f", which Kafka refuses ({exc}); Kafka treats '.' "
                                        "and '_' in topic names alike") from None
            self._ready_topics.add(kafka_topic)

    # -- the rule

    def plan(self, topic: TopicName, req: Request) -> Plan:
        """Check a request and decide every message; raises PublishError for the request."""
        s = self.settings
        self._check_publishable(topic)
        msgs = req.messages
        if not msgs:
            raise PublishError(400, "messages: must contain at least one message")
        if len(msgs) > s.max_messages_per_request:
            raise PublishError(400, f"messages: {len(msgs)} messages; the limit per request "
                                    f"is {s.max_messages_per_request}")

        now = int(self.clock() * 1000)
        topic_b, ready = self._topic_bytes(topic)
        decide = self._decider(topic, now, ready)
        topic_h = ("dwell-topic", topic_b)
        producer_h = ("dwell-producer", (req.producerName or "").encode())
        # The dwell headers every message of the request gets when it has no eventTime.
        now_hs = [topic_h, ("dwell-publish-time", b"%d" % now), producer_h]
        default_encoding = req.payloadEncoding
        max_payload = s.max_payload_bytes
        # admit() is a pure function of these and of what `decide` holds fixed for the
        # request: messages asking the same thing share one decision, with its result
        # fields and delay headers. Likewise the encoded properties.
        decisions: dict[tuple[int | None, int | None, int], _Planned] = {}
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
            if not is_bytes:
                results.append({"errorCode": INVALID_MESSAGE, "error": payload})
                plan.invalid += 1
                continue
            deliver_at = m.deliverAt
            deliver_after = m.deliverAfterMs
            if deliver_at is not None and deliver_after is not None:
                results.append({"errorCode": INVALID_MESSAGE,
                                "error": "deliverAt and deliverAfterMs are both set; "
                                         "send one of them"})
                plan.invalid += 1
                continue
            publish_time = m.eventTime or now
            asked = (deliver_at, deliver_after, publish_time)
            decided = decisions.get(asked)
            if decided is None:
                decided = decisions[asked] = decide(*asked)
            proto, delay_h, counts_override, head = decided
            if delay_h is None:  # rejected
                results.append(proto.copy())
                plan.rejected += 1
                continue
            overridden += counts_override
            if publish_time == now:
                headers = props_h + now_hs if props_h else now_hs.copy()
            else:
                headers = props_h.copy() if props_h else []
                headers += (topic_h, ("dwell-publish-time", b"%d" % publish_time), producer_h)
            seq = m.sequenceId
            if seq is not None:
                headers.append(("dwell-sequence-id", b"%d" % seq))
            key = m.key
            key_b = key.encode() if key is not None else None
            if delay_h:
                headers += delay_h
                if key_b is not None:
                    headers.append(("dwell-key", key_b))
                sends.append((delayed_topic, payload, topic_b, headers, publish_time))
                delayed += 1
            else:
                sends.append((ready, payload, key_b, headers, publish_time))
            index.append(i)
            heads.append(head)
            # Shared by the messages with this decision until finish() gives each its own.
            results.append(proto)

        plan.delayed = delayed
        plan.immediate = len(sends) - delayed
        plan.overridden = overridden
        return plan

    def plan_body(self, topic: TopicName, body: bytes) -> Plan:
        """`plan(topic, parse_request(body))`, decided by `dwell_native.plan` (when
        admission has it) straight from the JSON when the request is the common case
        (every message published or rejected by the rule); any other request, and every
        error, goes the Python way. The same records, results and answer:
        tests/unit/admission/test_native.py."""
        s = self.settings
        accel = self.native
        if accel is not None and self.cache.ready.is_set() and self.cache.namespace_known(
                topic.tenant, topic.namespace):
            now = int(self.clock() * 1000)
            topic_b, ready = self._topic_bytes(topic)
            got = accel.plan(body, self._decider(topic, now, ready), topic_b, ready,
                                    names.DELAYED, now, s.max_payload_bytes,
                                    s.max_messages_per_request)
            if got is not None:
                results, sends, index, heads, delayed, rejected, overridden = got
                return Plan(topic, results, sends, index, heads, immediate=len(sends) - delayed,
                            delayed=delayed, rejected=rejected, overridden=overridden)
        return self.plan(topic, parse_request(body, PublishRequest))

    def misses(self, topic: TopicName) -> bool:
        """Whether the topic's namespace is unknown here, so that the policy feed must be
        caught up with (`caught_up`) before the publish is answered 404."""
        return (self.catch_up is not None and self.cache.ready.is_set()
                and not self.cache.namespace_known(topic.tenant, topic.namespace))

    def _not_caught_up(self) -> PublishError:
        return PublishError(503, "policies: could not catch up with dwell.policies within "
                                 f"{self.settings.policy_catch_up_timeout_ms} ms "
                                 "(policy_catch_up_timeout_ms); retry shortly")

    async def _catch_up(self) -> bool:
        assert self.catch_up is not None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.catch_up()),
                                          self.settings.policy_catch_up_timeout_ms / 1000 + 1)
        except TimeoutError:  # the catch-up thread's own deadline should come first
            return False

    async def caught_up(self) -> None:
        """Wait until the cache holds every policy change acknowledged before this call;
        PublishError 503 when that cannot be done in time (the answer is not known)."""
        if not await self._catch_up():
            raise self._not_caught_up()

    def replan_if_newer(self, plan: Plan, req: Request, version: int) -> Plan:
        """`plan` again from `req` when the rule refused a message of it and the policy
        feed, caught up with now, holds policies newer than `version` (the cache's when
        `plan` was made): the Kafka ingress's counterpart of what `publish` does."""
        if not plan.rejected or self.catch_up is None:
            return plan
        if self._catch_up_blocking() and self.cache.version != version:
            return self.plan(plan.topic, req)
        return plan

    def _catch_up_blocking(self) -> bool:
        assert self.catch_up is not None
        try:
            return self.catch_up().result(self.settings.policy_catch_up_timeout_ms / 1000 + 1.0)
        except TimeoutError:  # the catch-up thread's own deadline should come first
            return False

    def caught_up_blocking(self) -> None:
        """`caught_up` for a thread (the Kafka ingress)."""
        if not self._catch_up_blocking():
            raise self._not_caught_up()

    def _check_publishable(self, topic: TopicName) -> None:
        if not self.cache.ready.is_set():
            raise PublishError(503, "policies not loaded yet; retry shortly")
        if not self.cache.namespace_known(topic.tenant, topic.namespace):
            raise PublishError(404, f"Namespace {topic.namespace_name} does not exist")

    def _decider(self, topic: TopicName, now: int,
                 ready: str) -> Callable[[int | None, int | None, int], _Planned]:
        """A request's decisions: `decide(deliver_at, deliver_after_ms, publish_time)`
        applies admit() with the topic's policy at `now`, as `_Planned` (`ready`: the
        topic's ready topic, for the heads of immediate results)."""
        persistent = topic.persistent
        policy = self.cache.effective(topic) if persistent else _NO_POLICY
        tick_b = b"%d" % policy.tick_time_ms
        strict = self.strict

        def decide(deliver_at: int | None, deliver_after: int | None,
                   publish_time: int) -> _Planned:
            proto, delay_h, counts_override = _decide(
                admit(deliver_at=deliver_at, deliver_after_ms=deliver_after, policy=policy,
                      persistent=persistent, publish_time=publish_time, now=now,
                      strict=strict), tick_b)
            head = "" if delay_h is None else _head(proto, names.DELAYED if delay_h else ready)
            return proto, delay_h, counts_override, head

        return decide

    def _count_policy_outcomes(self, topic: TopicName, rejected: int, overridden: int) -> None:
        if rejected or overridden:
            rejected_c, overridden_c = self._topic_counters(topic)
            if rejected:
                rejected_c.inc(rejected)
            if overridden:
                overridden_c.inc(overridden)

    def _topic_bytes(self, topic: TopicName) -> tuple[bytes, str]:
        """The topic's name as header bytes and its ready topic, computed once per topic."""
        got = self._bytes.get(topic)
        if got is None:
            if len(self._bytes) > 100_000:
                self._bytes.clear()
            got = self._bytes[topic] = (str(topic).encode(), topic.kafka_topic)
        return got

    def _topic_counters(self, topic: TopicName) -> tuple[Any, Any]:
        key = str(topic)
        got = self._labels.get(key)
        if got is None:
            labels = (self.settings.cluster, topic.namespace_name, key)
            got = (metrics.DELAYED_REJECTED.labels(*labels),
                   metrics.FIXED_DELAY_OVERRIDDEN.labels(*labels))
            self._labels[key] = got
        return got

    # -- writing

    @staticmethod
    def send(plan: Plan, producer: kafka.Producer) -> Future[list[tuple[int, int]]]:
        """Write a plan's records as one batch through `producer` (the ingress's; the HTTP
        path sends through `deliveries`): a future of their (partition, offset)s."""
        return producer.send_many(plan.sends)

    @staticmethod
    def finish(plan: Plan, offsets: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        """Fill in the messageIds, `<kafkaTopic>:<partition>:<offset>`; every accepted
        result becomes a dict of its own (the caller may add fields to it)."""
        results = plan.results
        for i, out, (partition, offset) in zip(plan.index, plan.sends, offsets, strict=True):
            results[i] = {**results[i], "messageId": f"{out[0]}:{partition}:{offset}"}
        return results

    def answer(self, plan: Plan, offsets: Sequence[tuple[int, int]]) -> bytes:
        """The HTTP answer: the bytes of `{"messagePublishResults": finish(plan, offsets)}`
        as orjson writes them, without a dict per message: an accepted result is its
        head (`Plan.heads`) and `<partition>:<offset>"}` (spliced by dwell_native, when
        admission has it, if every message was accepted)."""
        results = plan.results
        if len(plan.heads) == len(results) and self.native is not None:
            return self.native.answer(plan.heads, offsets)  # type: ignore[no-any-return]
        parts = [f'{head}{partition}:{offset}"}}'
                 for head, (partition, offset) in zip(plan.heads, offsets, strict=True)]
        if len(parts) != len(results):
            accepted = dict(zip(plan.index, parts, strict=True))
            parts = [accepted.get(i) or orjson.dumps(r).decode()
                     for i, r in enumerate(results)]
        return ('{"messagePublishResults":[' + ",".join(parts) + "]}").encode()

    def count(self, plan: Plan, path: str) -> None:
        """Count a plan's messages by outcome, and its policy outcomes per topic."""
        self._count_policy_outcomes(plan.topic, plan.rejected, plan.overridden)
        for outcome, n in (("immediate", plan.immediate), ("delayed", plan.delayed),
                           ("rejected", plan.rejected), ("invalid", plan.invalid)):
            if n:
                counter = self._counters.get((outcome, path))
                if counter is None:
                    counter = self._counters[outcome, path] = metrics.MESSAGES.labels(outcome,
                                                                                      path)
                counter.inc(n)

    async def publish(self, topic: TopicName, body: bytes) -> bytes:
        """The HTTP path: the JSON answer (see `answer`) to a request's body once Kafka
        acknowledged every accepted message.

        Nothing the answer does not need waits for Kafka's acks with it: the body goes
        once planned and the records once the producer has copied them, so that the next
        requests reuse memory still in the CPU's caches. The caller must not keep `body`
        either (admission's handler lets it go). Holding them cost 64 concurrent clients
        ~30% of the throughput (bench/admission.py)."""
        if self.misses(topic):
            await self.caught_up()
        version = self.cache.version
        plan = self.plan_body(topic, body)
        # The rule refused a message: answer that from the policies in force now (a max
        # delay may have been raised a moment ago). A catch-up that fails leaves the
        # answer to the policies applied.
        if (plan.rejected and self.catch_up is not None and await self._catch_up()
                and self.cache.version != version):
            plan = self.plan_body(topic, body)
        del body
        offsets: list[tuple[int, int]] = []
        sends = len(plan.sends)
        if sends:
            try:
                if self.ready_topic_missing(topic):
                    await asyncio.get_running_loop().run_in_executor(
                        None, self.ensure_ready_topic, topic)
                acked = self.deliveries.send(plan.sends)
                plan.sends = []
                offsets = await acked
            except (kafka.KafkaUnavailable, TimeoutError) as exc:
                metrics.MESSAGES.labels("unavailable", "http").inc(sends)
                raise PublishError(503, f"Kafka unavailable: {exc}") from None
        self.count(plan, "http")
        return self.answer(plan, offsets)


class Deliveries:
    """Sends batches from the event loop and serves their delivery reports on it too.

    A thread polling the producer contends with the loop for the GIL on every batch and
    hands each result over through `call_soon_threadsafe`; here the loop polls the
    producer itself, every `interval_s` while a batch is unsettled (not at all when
    idle), and settles asyncio futures directly.

    Each batch also gets a deadline, checked on the same tick (all batches share one
    timeout, so the oldest is always first): the producer's message.timeout.ms fails a
    send by itself, this only guards against a delivery report that never comes."""

    def __init__(self, producer: kafka.Producer, timeout_s: float,
                 interval_s: float = 0.001) -> None:
        if producer.polls_in_background:
            raise ValueError("Deliveries needs a producer made with poll_in_background=False")
        self.producer = producer
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        # (deadline, future) of every batch sent and not yet dropped, oldest first.
        self._waiting: deque[tuple[float, asyncio.Future[list[tuple[int, int]]]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    def send(self, records: Sequence[kafka.OutRecord]) -> asyncio.Future[list[tuple[int, int]]]:
        """A future of every record's (partition, offset), or of the first failure
        (KafkaUnavailable, or TimeoutError after `timeout_s`)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[tuple[int, int]]] = loop.create_future()

        def settle(out: list[tuple[int, int]] | None, exc: Exception | None) -> None:
            # Timed out, or the request went away; or its loop did (tests run one loop
            # after another, while the producer lives on).
            if fut.done() or loop.is_closed():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(out)  # type: ignore[arg-type]

        self.producer.send_many_then(records, settle)
        if loop is not self._loop:
            self._waiting.clear()  # futures of a loop that is gone
            self._loop = None
        if not self._waiting:
            self._loop = loop
            loop.call_later(self.interval_s, self._tick, loop)
        self._waiting.append((loop.time() + self.timeout_s, fut))
        return fut

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a loop that is gone (tests run one loop after another)
        try:
            self.producer.poll(0)
        except Exception:  # keep ticking: the deadlines below still fail the waiting
            log.exception("serving delivery reports")
        waiting = self._waiting
        now = loop.time()
        while waiting:
            deadline, fut = waiting[0]
            if not fut.done():
                if deadline > now:
                    break
                fut.set_exception(TimeoutError(f"no delivery report in {self.timeout_s:g} s"))
            waiting.popleft()
        if waiting:
            loop.call_later(self.interval_s, self._tick, loop)
