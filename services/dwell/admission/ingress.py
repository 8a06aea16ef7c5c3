"""The Kafka ingress: a consumer group on `dwell.publish` that applies the same publish
path as HTTP and writes one result per message to `dwell.publish.results` (key = the
producer name).

Exactly-once, by transactions (chosen over an idempotent producer with at-least-once
commits): each polled batch is one Kafka transaction holding the admitted messages, their
results and the consumer offsets (`send_offsets_to_transaction`, KIP-447). A crash or a
Kafka failure aborts it, the batch is re-read from the last committed offset, and
`read_committed` readers (the tracker, the drain, results consumers) never see the
aborted copies, so nothing is lost and nothing is published twice. The cost is one
commit round trip per batch, amortised over up to `ingress_max_batch` requests; HTTP
keeps its own non-transactional producer for latency. Plain Kafka consumers of ready
topics must use `isolation.level=read_committed` to avoid seeing aborted copies.

Result record value, one per message, in request order: the HTTP answer's result (Pulsar's
`ProducerAck`) plus where it belongs, `{"messageId", "errorCode": 0, "schemaVersion",
"deliverAt", "delayed", ["delayIgnored"], "sequenceId", "topic", "requestId", "index"}` or
`{"messageId": "-1", "errorCode", "errorMsg", "schemaVersion", "sequenceId", "topic",
"requestId", "index"}`, where `requestId` is `dwell.publish:<partition>:<offset>` of the
request and `index` the message's position in it. A request refused as a whole (bad body,
unknown namespace: the HTTP 4xx cases) gives one result, errorCode 2 with that reason,
`index` null and the first message's `sequenceId` (when it can be read), however many
messages it holds; a request without messages gives none. A malformed record (not JSON,
not an object, a field that does not fit, a bad `dwell-authorization` header, bigger than
max_request_bytes, an invalid topic) also goes to `dwell.invalid` as read, with its reason
(dwell.core.invalid), in the same transaction.

With authentication on, a request carries a Kafka token in the `dwell-authorization`
header (`Bearer <token>`, as HTTP's Authorization header; Kafka headers are the analogue of
the credentials Pulsar's binary protocol sends on connect): a short-lived token from
`POST /admin/v2/kafka-tokens`, never the client's long-lived one, which the topic would
keep for its retention (dwell.auth.tokens). The ingress checks that it was valid at the
record's broker-assigned timestamp (dwell.publish has message.timestamp.type=
LogAppendTime), so a request that waited in a backlog is still accepted and an expired
token copied out of the topic is refused. It verifies the token before it parses the
value, and checks `produce` on the namespace (with authorization on) before it plans or
writes anything; a request refused gets one result with Pulsar's ServerError code:
AuthenticationError (3) or AuthorizationError (4), and the reason.
Metrics count every attempt, so a re-processed batch is counted again.

A request may cancel pending delayed messages instead of publishing
(dwell.admission.cancels): it is checked as a publish is, its cancels are handed to the
tracker, and its results join the batch's transaction like any other.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.auth.guard import GrantsSync, Guard, unauthenticated
from dwell.cache import BoundedCache
from dwell.core import invalid
from dwell.core import topics as names
from dwell.core.authz import Operation
from dwell.core.topics import InvalidTopicName, TopicName
from dwell.http import ApiError

from . import metrics
from .cancels import CancelRequest, TrackerCancels, cancel_request
from .plan import AUTHENTICATION_ERROR, AUTHORIZATION_ERROR, INVALID_MESSAGE, Plan, failed
from .publish import Publisher
from .schema import IngressRequest, PublishError, parse_request
from .settings import AdmissionSettings

log = logging.getLogger("dwell.admission.ingress")


def _request_level_result(value: bytes | None, reason: str,
                          error_code: int = INVALID_MESSAGE) -> tuple[str | None,
                                                                      dict[str, Any]]:
    """The one result of a request refused as a whole, with the producer name and the
    first message's sequenceId when they can be read: one result, however many messages
    the request holds, so that what a refusal writes does not grow with the request."""
    producer: str | None = None
    seq: Any = None
    try:
        head = _HEAD.decode(value or b"")
        producer = head.producerName if isinstance(head.producerName, str) else None
        messages = _RAWS.decode(head.messages)
        first = msgspec.json.decode(messages[0]) if messages else None
        seq = first.get("sequenceId") if isinstance(first, dict) else None
    except (ValueError, RecursionError):  # msgspec's errors, and bytes that are not UTF-8
        pass
    return producer, failed(error_code, reason) | {
        "sequenceId": seq if isinstance(seq, int) else None, "index": None}


class _Head(msgspec.Struct):
    """What a refused request's result names: its producer and its first message's
    sequenceId; the other messages are skipped unread."""

    producerName: Any = None
    messages: msgspec.Raw = msgspec.Raw(b"null")


_HEAD = msgspec.json.Decoder(_Head)
_RAWS = msgspec.json.Decoder(list[msgspec.Raw] | None)


@dataclass(slots=True)
class _Entry:
    """One record of a batch and what answers it: a plan, the results of a refusal, or
    the cancels handed to the tracker."""

    record: kafka.Record
    request_id: str
    producer_name: str | None
    plan: Plan | None = None
    sequence_ids: list[Any] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    cancel: tuple[TopicName, list[str], list[Future[list[dict[str, Any]]]]] | None = None


class OncePerBatch:
    """The policy cache caught up with the feed at most once per batch: one catch-up reads
    the feed's end after every record of the batch was written, so it covers the policy
    changes their producers had seen."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self.done = False

    def __call__(self) -> bool:
        """Catch up unless this batch has; whether it did now. PublishError 503 when it
        cannot (the batch is read again)."""
        if self.done or self._publisher.catch_up is None:
            return False
        self._publisher.caught_up_blocking()
        self.done = True
        return True

    def replan(self, plan: Plan, req: IngressRequest, version: int) -> Plan:
        """`plan` made again when the rule refused a message of it and the catch-up (this
        batch's one) brought policies newer than ``version``, the cache's when `plan` was
        made. A catch-up earlier in the batch came before `plan`: nothing newer to see."""
        if self.done or not plan.rejected:
            return plan
        self.done = True
        return self._publisher.replan_if_newer(plan, req, version)


class Ingress:
    """The consume-transform-produce loop, run in a daemon thread."""

    def __init__(self, settings: AdmissionSettings, publisher: Publisher,
                 guard: Guard | None = None, grants: GrantsSync | None = None) -> None:
        self.settings = settings
        self.publisher = publisher
        self.guard = guard if guard is not None and guard.authentication else None
        self.grants = grants
        self.assigned = threading.Event()
        self.error: str | None = None
        self._topics: BoundedCache[str, TopicName] = BoundedCache()
        self.cancels = TrackerCancels(settings, self.guard.kafka_key if self.guard else None)
        # Tenants' results topics: True once made, False when Kafka refused the name
        # (names.tenant_results_topic).
        self._results_topics: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publish-ingress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _producer(self) -> kafka.TransactionalProducer:
        s = self.settings
        return kafka.TransactionalProducer(
            s.kafka_bootstrap, s.transactional_id(), linger_ms=s.producer_linger_ms,
            compression_type=s.kafka_compression_type,
            **{"transaction.timeout.ms": s.ingress_transaction_timeout_ms,
               "message.timeout.ms": min(s.publish_timeout_ms,
                                         s.ingress_transaction_timeout_ms)})

    def _run(self) -> None:
        s = self.settings
        while not self._stop.is_set():
            try:
                producer = self._producer()
                break
            except kafka.KafkaUnavailable as exc:
                self.error = str(exc)
                log.warning("ingress producer: %s; retrying", exc)
                time.sleep(1.0)
        else:
            return
        consumer = kafka.Consumer(s.kafka_bootstrap, s.ingress_group,
                                  auto_offset_reset=s.ingress_offset_reset)
        consumer.subscribe([names.PUBLISH], on_assign=lambda c, parts: self.assigned.set())
        try:
            while not self._stop.is_set():
                try:
                    records = consumer.poll(s.ingress_max_batch, 0.2)
                except kafka.KafkaUnavailable as exc:
                    self.error = str(exc)
                    time.sleep(0.5)
                    continue
                if not records:
                    continue
                try:
                    self.process(records, producer, consumer)
                    self.error = None
                except kafka.KafkaUnavailable as exc:
                    self.error = str(exc)
                    metrics.INGRESS_BATCHES_FAILED.inc()
                    log.warning("ingress batch failed, re-reading it: %s", exc)
                    # A topic it wrote to may have been deleted since it was made.
                    self.publisher.forget_routes()
                    self._results_topics.clear()
                    producer = self._recover(producer)
                    consumer.seek(_first_offsets(records))
                    time.sleep(0.5)
        except Exception as exc:
            # Nothing reads dwell.publish any more: /readyz says so, rather than a live
            # process that silently stopped publishing.
            self.error = f"ingress stopped: {type(exc).__name__}: {exc}"[:500]
            log.exception("the dwell.publish ingress stopped")
            raise
        finally:
            consumer.close()
            producer.close()
            self.cancels.close()

    def _recover(self, producer: kafka.TransactionalProducer) -> kafka.TransactionalProducer:
        try:
            producer.abort()
            return producer
        except kafka.KafkaUnavailable:
            producer.close()
            while not self._stop.is_set():
                try:
                    return self._producer()  # init_transactions fences the old one
                except kafka.KafkaUnavailable as exc:
                    log.warning("ingress producer: %s; retrying", exc)
                    time.sleep(1.0)
            raise

    def process(self, records: list[kafka.Record], producer: kafka.TransactionalProducer,
                consumer: kafka.Consumer) -> None:
        """One transaction: the batch's messages, their results and its offsets."""
        started = time.perf_counter()
        # The transaction's timeout counts from here: so do the cancels' answers.
        cancels_due = time.monotonic() + self.cancels.timeout_s
        pub = self.publisher
        producer.begin()
        planned: list[_Entry] = []
        futures: list[Future[list[tuple[int, int]]]] = []
        catch_up = OncePerBatch(pub)
        invalids: list[kafka.OutRecord] = []
        for r in records:
            request_id = f"{r.topic}:{r.partition}:{r.offset}"
            try:
                req, topic, role = self._read(r, catch_up)
                if isinstance(req, CancelRequest):
                    ids = req.cancel
                    planned.append(_Entry(r, request_id, req.producerName, cancel=(
                        topic, ids, self.cancels.submit(topic, ids, role))))
                    continue
                if pub.misses(topic):
                    catch_up()
                version = pub.cache.version
                plan = catch_up.replan(pub.plan(topic, req), req, version)
                if plan.results:
                    pub.route(topic, producer)
                futures.append(pub.send(plan, producer))
                planned.append(_Entry(r, request_id, req.producerName, plan,
                                      [m.sequenceId for m in req.messages]))
                pub.count(plan, "kafka")
            except invalid.Malformed as exc:
                self._set_aside(r, request_id, exc, planned, invalids)
            except PublishError as exc:
                if exc.status == 503:
                    raise kafka.KafkaUnavailable(exc.reason) from None
                code = {401: AUTHENTICATION_ERROR, 403: AUTHORIZATION_ERROR}.get(
                    exc.status, INVALID_MESSAGE)
                self._refuse(r, request_id, exc.reason, planned, code)
                metrics.REQUESTS.labels("kafka", str(exc.status)).inc()
            except kafka.KafkaUnavailable:
                raise
            except Exception as exc:
                # A record no check foresaw must not stop the ingress: re-read, it would
                # fail the same way on every replica, for good.
                log.exception("dwell.publish record %s failed; set aside on %s", request_id,
                              names.INVALID)
                self._set_aside(r, request_id, invalid.Malformed(
                    invalid.FAILED, f"{type(exc).__name__} while reading the request"),
                    planned, invalids)
        timeout = self.settings.publish_timeout_ms / 1000
        _, not_done = wait(futures, timeout=timeout)
        if not_done or any(f.exception() is not None for f in futures):
            first = next((f.exception() for f in futures if f.done() and f.exception()), None)
            raise kafka.KafkaUnavailable(f"outputs not acknowledged: {first or 'timeout'}")
        # The results need no acknowledgement of their own: commit_transaction flushes
        # them and fails (so the batch is aborted and re-read) if any was not written.
        out: list[kafka.OutRecord] = invalids
        dumps = orjson.dumps
        sent = iter(futures)
        ok = 0
        for e in planned:
            key = e.producer_name.encode() if e.producer_name else None
            topic_s: str | None
            if e.cancel is not None:
                topic, ids, answers = e.cancel
                results = self.cancels.results(answers, ids, cancels_due)
                topic_s = str(topic)
                tenant_topic = self._tenant_results(topic.tenant)
                for i, res in enumerate(results):
                    res |= {"sequenceId": None, "index": i, "requestId": e.request_id}
                ok += 1
            elif e.plan is None:
                results = e.refused
                topic_s = (e.record.key.decode("utf-8", "replace") if e.record.key
                           else None)
                # What names a request refused as a whole is not vouched for: a copy in
                # the tenant it names would let anyone forge results there.
                tenant_topic = None
            else:
                results = Publisher.finish(e.plan, next(sent).result())
                topic_s = str(e.plan.topic)
                tenant_topic = self._tenant_results(e.plan.topic.tenant)
                for i, res in enumerate(results):
                    res["sequenceId"] = e.sequence_ids[i]
                    res["index"] = i
                    res["requestId"] = e.request_id
                ok += 1
            for res in results:
                res["topic"] = topic_s
                value = dumps(res)
                out.append((names.PUBLISH_RESULTS, value, key, None, None))
                if tenant_topic is not None:
                    out.append((tenant_topic, value, key, None, None))
        producer.send_unreported(out)
        if ok:
            metrics.REQUESTS.labels("kafka", "200").inc(ok)
        producer.commit(consumer, kafka.next_offsets(records))
        metrics.PUBLISH_LATENCY.labels("kafka").observe(time.perf_counter() - started)

    def _tenant_results(self, tenant: str) -> str | None:
        """The results topic of `tenant` (made on first use), or None when dwell knows no
        such tenant: a results topic is made only for a tenant that exists."""
        if tenant not in self.publisher.cache.tenants:
            return None
        name = names.tenant_results_topic(tenant)
        made = self._results_topics.get(name)
        if made is None:
            s = self.settings
            try:
                kafka.ensure_topic(s.kafka_bootstrap, name, 1, s.kafka_replication_factor)
                made = True
            except kafka.TopicRefused as exc:
                # Kafka takes '.' and '_' alike: a name can collide with another
                # tenant's topic. The results stay on dwell.publish.results alone.
                log.warning("no results topic for tenant %r: %s", tenant[:200], exc)
                made = False
            self._results_topics[name] = made
        return name if made else None

    def _read(self, r: kafka.Record, catch_up: OncePerBatch) -> tuple[
            IngressRequest | CancelRequest, TopicName, str | None]:
        """The request a record holds, the topic it names and the sender's role (None
        with authentication off); Malformed when it is not one (PublishError for a
        well-formed request refused later, as over HTTP)."""
        invalid.check_size(r.value, self.settings.max_request_bytes, "max_request_bytes",
                           "request")
        auth = r.headers.get(hdr.AUTHORIZATION)
        token = invalid.authorization([] if auth is None else [auth])
        # Who sent it, before any work on what it holds: an unauthenticated sender costs
        # one token check, whatever its body.
        role = self._authenticate(token, r)
        req: IngressRequest | CancelRequest | None
        try:
            req = cancel_request(r.value or b"", self.settings.max_messages_per_request)
            if req is None:
                req = parse_request(r.value or b"", IngressRequest,
                                    self.settings.max_messages_per_request)
        except PublishError as exc:
            invalid.json_object(r.value)  # not JSON, not an object: that kind instead
            raise invalid.Malformed(invalid.FIELD, exc.reason) from None
        try:
            topic = self._topic(req.topic or (r.key.decode("utf-8", "replace")
                                              if r.key else ""))
        except PublishError as exc:
            raise invalid.Malformed(invalid.FIELD, exc.reason) from None
        self._authorize(role, topic, catch_up)
        return req, topic, role

    def _authenticate(self, token: str | None, r: kafka.Record) -> str | None:
        """The sender's role: PublishError 401 unless the token is a Kafka token valid
        when the record was written (None with authentication off)."""
        if self.guard is None:
            return None
        try:
            if not r.log_append_time:
                # A producer-set timestamp would let an expired token be replayed.
                raise unauthenticated(f"{r.topic} records need broker timestamps "
                                      "(message.timestamp.type=LogAppendTime)")
            return self.guard.kafka_role(token, r.timestamp_ms)
        except ApiError as exc:
            raise PublishError(exc.status, exc.reason) from None

    def _authorize(self, role: str | None, topic: TopicName, catch_up: OncePerBatch) -> None:
        """PublishError 403 unless the role may produce on the topic's namespace (nothing
        to check with authentication off); a grant the policy service acknowledged but
        this replica has not read yet counts, as over HTTP."""
        if self.guard is None or role is None:
            return
        try:
            self.guard.authorize_sync(role, Operation.PRODUCE, topic.tenant, topic.namespace,
                                      self.grants, catch_up)
        except ApiError as exc:
            raise PublishError(exc.status, exc.reason) from None

    def _set_aside(self, r: kafka.Record, request_id: str, exc: invalid.Malformed,
                   planned: list[_Entry], invalids: list[kafka.OutRecord]) -> None:
        """A malformed request: its refusal on the results, the record on dwell.invalid."""
        self._refuse(r, request_id, exc.reason, planned)
        invalids.append(invalid.invalid_record(r.topic, r.partition, r.offset, r.key,
                                               r.value, exc.kind, exc.reason))
        metrics.INVALID_RECORDS.labels(r.topic, exc.kind).inc()
        status = 413 if exc.kind == invalid.OVERSIZED else 400
        metrics.REQUESTS.labels("kafka", str(status)).inc()

    @staticmethod
    def _refuse(r: kafka.Record, request_id: str, reason: str,
                planned: list[_Entry], error_code: int = INVALID_MESSAGE) -> None:
        """The results of a request refused as a whole."""
        producer_name, result = _request_level_result(r.value, reason, error_code)
        result["requestId"] = request_id
        planned.append(_Entry(r, request_id, producer_name, refused=[result]))

    def _topic(self, name: str) -> TopicName:
        """The Pulsar topic a record names, parsed once per distinct name."""
        got = self._topics.get(name)
        if got is None:
            try:
                tn = TopicName.parse(name)
            except InvalidTopicName as exc:
                raise PublishError(400, f"topic: {exc}") from None
            got = self.publisher.topic(tn.domain, tn.tenant, tn.namespace, tn.local)
            self._topics.put(name, got)
        return got


def _first_offsets(records: list[kafka.Record]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for r in records:
        key = (r.topic, r.partition)
        if key not in out or r.offset < out[key]:
            out[key] = r.offset
    return out
