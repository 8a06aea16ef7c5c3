"""The publish path shared by HTTP and the Kafka ingress: parse a Pulsar REST producer
request, apply `dwell.core.admit.admit` to each message with the topic's effective policy,
and write accepted messages to the topic's ready topic (immediate) or to `dwell.delayed`
(delayed), with the headers of docs/internals.md.

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
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

import pydantic
from pydantic import ConfigDict, Field

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.admit import Override, Reject, admit
from dwell.core.policy import MAX_LONG, EffectivePolicy
from dwell.core.topics import InvalidTopicName, TopicName

from . import metrics
from .cache import PolicyCache
from .settings import AdmissionSettings

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


_R = TypeVar("_R", bound=PublishRequest)


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


def parse_request(body: bytes, model: type[_R]) -> _R:
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise PublishError(400, describe(exc)) from None


@dataclass(slots=True)
class Plan:
    """A request after the checks: per-message results (accepted ones still without a
    messageId) and the records to write, each with the index of its result."""

    topic: TopicName
    results: list[dict[str, Any]]
    sends: list[kafka.OutRecord] = field(default_factory=list)
    index: list[int] = field(default_factory=list)  # result index of each send
    needs_ready_topic: bool = False
    immediate: int = 0
    delayed: int = 0
    invalid: int = 0
    rejected: int = 0


def _decode_payload(text: str, encoding: str | None) -> bytes | str:
    """The payload bytes, or an error text for a per-message failure."""
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            return "payload is not valid base64"
    return text.encode("utf-8", "surrogatepass")


class Publisher:
    """Applies the publish rule and writes the records; one per process, both paths."""

    def __init__(self, settings: AdmissionSettings, cache: PolicyCache, producer: kafka.Producer,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.cache = cache
        self.producer = producer
        self.clock = clock
        self.strict = settings.delayed_delivery_deliver_at_time_strict
        self._topics: dict[tuple[str, str, str, str], TopicName | str] = {}
        self._ready_topics: set[str] = set()
        self._labels: dict[str, tuple[Any, Any]] = {}

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

    def ensure_ready_topic(self, kafka_topic: str) -> None:
        """Create a ready topic on first use (blocking admin call, once per process)."""
        if kafka_topic not in self._ready_topics:
            kafka.ensure_topic(self.settings.kafka_bootstrap, kafka_topic,
                               self.settings.ready_topic_partitions,
                               self.settings.kafka_replication_factor)
            self._ready_topics.add(kafka_topic)

    def ready_topic_known(self, kafka_topic: str) -> bool:
        return kafka_topic in self._ready_topics

    # -- the rule

    def plan(self, topic: TopicName, req: PublishRequest) -> Plan:
        """Check a request and decide every message; raises PublishError for the request."""
        s = self.settings
        if not self.cache.ready.is_set():
            raise PublishError(503, "policies not loaded yet; retry shortly")
        if not self.cache.namespace_known(topic.tenant, topic.namespace):
            raise PublishError(404, f"Namespace {topic.namespace_name} does not exist")
        msgs = req.messages
        if not msgs:
            raise PublishError(400, "messages: must contain at least one message")
        if len(msgs) > s.max_messages_per_request:
            raise PublishError(400, f"messages: {len(msgs)} messages; the limit per request "
                                    f"is {s.max_messages_per_request}")
        payloads: list[bytes | str] = []
        for i, m in enumerate(msgs):
            p = _decode_payload(m.payload, m.payloadEncoding or req.payloadEncoding)
            if isinstance(p, bytes) and len(p) > s.max_payload_bytes:
                raise PublishError(400, f"messages[{i}].payload: {len(p)} bytes; the limit is "
                                        f"{s.max_payload_bytes} bytes (max_payload_bytes)")
            if m.properties:
                for name in m.properties:
                    if name.lower().startswith(RESERVED_HEADER_PREFIX):
                        raise PublishError(400, f"messages[{i}].properties.{name}: names "
                                                f"starting with 'dwell-' are reserved")
            payloads.append(p)

        persistent = topic.persistent
        policy = self.cache.effective(topic) if persistent else None
        now = int(self.clock() * 1000)
        topic_name = str(topic)
        topic_b = topic_name.encode()
        ready = topic.kafka_topic
        tick_b = str(policy.tick_time_ms).encode() if policy else b""
        producer_b = (req.producerName or "").encode()
        plan = Plan(topic, [])
        results = plan.results
        overridden = 0
        for i, m in enumerate(msgs):
            payload = payloads[i]
            if isinstance(payload, str):
                results.append({"errorCode": INVALID_MESSAGE, "error": payload})
                plan.invalid += 1
                continue
            if m.deliverAt is not None and m.deliverAfterMs is not None:
                results.append({"errorCode": INVALID_MESSAGE,
                                "error": "deliverAt and deliverAfterMs are both set; "
                                         "send one of them"})
                plan.invalid += 1
                continue
            publish_time = m.eventTime or now
            decision = admit(deliver_at=m.deliverAt, deliver_after_ms=m.deliverAfterMs,
                             policy=policy if policy is not None else _NO_POLICY,
                             persistent=persistent, publish_time=publish_time, now=now,
                             strict=self.strict)
            if isinstance(decision, Reject):
                results.append({"errorCode": decision.error_code, "error": decision.full_error})
                plan.rejected += 1
                continue
            if isinstance(decision, Override) and decision.counts_as_override:
                overridden += 1
            headers = [(k, v.encode()) for k, v in m.properties.items()] if m.properties else []
            headers += (("dwell-topic", topic_b), ("dwell-publish-time", b"%d" % publish_time),
                        ("dwell-producer", producer_b))
            if m.sequenceId is not None:
                headers.append(("dwell-sequence-id", b"%d" % m.sequenceId))
            key_b = m.key.encode() if m.key is not None else None
            result: dict[str, Any] = {"errorCode": 0, "deliverAt": decision.deliver_at,
                                      "delayed": decision.delayed}
            delay_ignored = getattr(decision, "delay_ignored", None)
            if delay_ignored:
                result["delayIgnored"] = delay_ignored
            if decision.delayed:
                headers += (("dwell-deliver-at", b"%d" % decision.deliver_at),
                            ("dwell-tick-time", tick_b))
                if key_b is not None:
                    headers.append(("dwell-key", key_b))
                plan.sends.append((names.DELAYED, payload, topic_b, headers, publish_time))
                plan.delayed += 1
            else:
                plan.sends.append((ready, payload, key_b, headers, publish_time))
                plan.needs_ready_topic = True
                plan.immediate += 1
            plan.index.append(i)
            results.append(result)

        if plan.rejected or overridden:
            rejected_c, overridden_c = self._topic_counters(topic)
            if plan.rejected:
                rejected_c.inc(plan.rejected)
            if overridden:
                overridden_c.inc(overridden)
        return plan

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

    def send(self, plan: Plan, producer: kafka.Producer | None = None
             ) -> Future[list[tuple[int, int]]]:
        """Write a plan's records as one batch: a future of their (partition, offset)s."""
        return (producer or self.producer).send_many(plan.sends)

    @staticmethod
    def finish(plan: Plan, offsets: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        """Fill in the messageIds, `<kafkaTopic>:<partition>:<offset>`."""
        results = plan.results
        for i, out, (partition, offset) in zip(plan.index, plan.sends, offsets, strict=True):
            results[i]["messageId"] = f"{out[0]}:{partition}:{offset}"
        return plan.results

    def count(self, plan: Plan, path: str) -> None:
        for outcome, n in (("immediate", plan.immediate), ("delayed", plan.delayed),
                           ("rejected", plan.rejected), ("invalid", plan.invalid)):
            if n:
                metrics.MESSAGES.labels(outcome, path).inc(n)

    async def publish(self, topic: TopicName, req: PublishRequest) -> list[dict[str, Any]]:
        """The HTTP path: results once Kafka acknowledged every accepted message."""
        plan = self.plan(topic, req)
        offsets: list[tuple[int, int]] = []
        if plan.sends:
            timeout = self.settings.publish_timeout_ms / 1000
            try:
                if plan.needs_ready_topic and not self.ready_topic_known(topic.kafka_topic):
                    await asyncio.get_running_loop().run_in_executor(
                        None, self.ensure_ready_topic, topic.kafka_topic)
                done = self.send(plan)
                offsets = await asyncio.wait_for(asyncio.wrap_future(done), timeout + 1.0)
            except (kafka.KafkaUnavailable, TimeoutError) as exc:
                metrics.MESSAGES.labels("unavailable", "http").inc(len(plan.sends))
                raise PublishError(503, f"Kafka unavailable: {exc}") from None
        self.count(plan, "http")
        return self.finish(plan, offsets)
