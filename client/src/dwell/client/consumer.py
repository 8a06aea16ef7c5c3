"""The SDK's Consumer: one Pulsar subscription read as a Kafka consumer group over the
topic's ready topic and the subscription's retry topic, with Pulsar's acknowledge /
negative-acknowledge / ack-timeout model.

The consumer does not redeliver by itself. It reports every delivery, ack and nack on
``dwell.acks``; the Spark backoff job turns a missing ack (after ``ackTimeoutMs``) or a
nack into a redelivery through the subscription's retry topic, with the backoff the
subscription registered at the tracker. The consumer commits a Kafka offset only once
that record is settled (acked, or its delivered/nack event is durable on ``dwell.acks``
and the backoff job owns its redelivery), so a crash re-reads rather than loses.

By default an acknowledgement (or a delivery with an ack timeout) returns once its event
is on ``dwell.acks`` and its offset committed, so a crash right after it reads nothing
again. With ``ack_group_time_ms`` > 0 (Pulsar's ``acknowledgementsGroupTime``) events are
sent without waiting: each is kept, in order, until Kafka has taken it, its offset is
settled then, and settled offsets are committed at most that often, without waiting,
and on ``close``, waiting; a crash may then read up to that much again, as a Pulsar
consumer's grouped acknowledgements lost in a crash redeliver. A delivery's event is
then held back that long as well: a message acknowledged (or negatively acknowledged)
within it sends one event, the ack (or nack), which tells the backoff job all the pair
would, and a thread sends the held events whose time is up, whatever the application
is doing. A crash before it was sent reads the message again.

While Kafka is away, nothing raises into the application (a Pulsar consumer's acks wait
for its broker too): an event not written within ``EVENT_WAIT_S`` stays queued, in
order, and is sent again until Kafka takes it; its record's offset is settled then. The
events after it join the queue without waiting. A restart before that reads those
records again, copies the SDK's duplicate filter cannot tell from a redelivery.

With a ``token``, the events carry a short-lived Kafka token, never that token (which
``dwell.acks`` would keep for its retention): fetched from the policy service
(``policy_url``, DWELL_POLICY_URL) and refreshed at half its life (client.auth.KafkaTokens).
While none can be fetched, events stay queued as while Kafka is away.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from dwell import endpoints
from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.adapters.kafka.record import DATACLASS_SLOTS
from dwell.core import topics as names
from dwell.core.backoff import ExponentialRedeliveryBackoff, validate_ack_timeout_ms
from dwell.core.positions import format_message_id
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName, group_id, retry_topic, validate_subscription
from dwell.security import http_verify

from .auth import KafkaTokens

log = logging.getLogger("dwell.client.consumer")

# How many (messageId, redeliveryCount) pairs the duplicate filter remembers, and how many
# acknowledged messageIds.
SEEN_LIMIT = 100_000
# How long an acknowledgement (or a delivery with an ack timeout) waits for its dwell.acks
# event while Kafka takes events, and `close` for the queued ones; past it the event is
# queued (see the module's text).
EVENT_WAIT_S = 30.0
# How long one wait for an event's delivery report lasts before its deadline is looked at.
REPORT_WAIT_S = 0.1
# How often, at most, the consumer's calls serve its events' delivery reports when they
# do not wait for one: often enough that settled offsets are committed on time, and
# that few events are in flight at once.
REPORT_INTERVAL_S = 0.005
# How long librdkafka may hold grouped events (ack_group_time_ms > 0) to batch them.
EVENT_LINGER_MS = 5
# Pulsar's receiverQueueSize default, and librdkafka's bound on queued.min.messages (one
# partition's share of it).
DEFAULT_RECEIVER_QUEUE_SIZE = 1000
MAX_RECEIVER_QUEUE_SIZE = 10_000_000
# How soon librdkafka looks again at a partition whose share of the queue was full.
FETCH_QUEUE_BACKOFF_MS = 10
HEADER_PREFIX = "dwell-"

# A record: (Kafka topic, partition, offset).
_Record = tuple[str, int, int]
# A delivered event held back for the group time (`Consumer._emit`): (when to send, its
# record, messageId, redelivery count, when received in ms since the epoch).
_Held = tuple[float, _Record, str, int, int]


class SubscribeError(Exception):
    """The tracker refused the subscription settings or could not be reached."""


class _Recent:
    """The keys added lately: at least the last SEEN_LIMIT, at most twice as many. Two
    plain dicts of strings, which Python's garbage collector does not track: a filter of
    a hundred thousand keys adds nothing to its collections."""

    __slots__ = ("_new", "_old")

    def __init__(self) -> None:
        self._new: dict[str, None] = {}
        self._old: dict[str, None] = {}

    def add(self, key: str) -> None:
        new = self._new
        new[key] = None
        if len(new) >= SEEN_LIMIT:
            self._old, self._new = new, {}

    def __contains__(self, key: str) -> bool:
        return key in self._new or key in self._old


@dataclass(frozen=True, **DATACLASS_SLOTS)
class Message:
    """One received message; pass it back to acknowledge / negative_acknowledge."""

    value: bytes | None
    """The payload."""
    key: str | None
    """The message's key, if it has one."""
    properties: dict[str, str]
    """The message's properties (its record headers but dwell's own ``dwell-*``)."""
    message_id: str
    """The id the producer's ``send`` returned; every redelivery carries it too."""
    redelivery_count: int
    """0 on the first delivery, then the number of redeliveries."""
    deliver_at: int | None
    """When the message was due (ms since the epoch), for a delayed message."""
    publish_time: int | None
    """When admission received it (ms since the epoch; Pulsar's publishTime)."""
    event_time: int | None
    """The producer's ``event_time`` (ms since the epoch), when it set one."""
    topic: str
    """The Pulsar topic it was read from."""
    # Where this copy was read from, for the consumer's offset bookkeeping.
    record_topic: str = field(repr=False)
    partition: int = field(repr=False)
    offset: int = field(repr=False)

    def data(self) -> bytes | None:
        """The payload (Pulsar's ``getData``)."""
        return self.value


def _int_header(headers: Mapping[str, bytes], name: str) -> int | None:
    """Header ``name`` as an integer; None when it is missing or not one (anyone who can
    write to the ready topic sets headers: a bad one must not raise out of `receive`)."""
    raw = headers.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


class _Offsets:
    """Per partition: offsets received and not yet settled, to commit the settled prefix."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, int], set[int]] = {}
        self.highest: dict[tuple[str, int], int] = {}

    def received(self, tp: tuple[str, int], offset: int) -> None:
        self.pending.setdefault(tp, set()).add(offset)
        self.highest[tp] = max(self.highest.get(tp, -1), offset)

    def settle(self, tp: tuple[str, int], offset: int) -> None:
        self.pending.get(tp, set()).discard(offset)

    def skip(self, tp: tuple[str, int], offset: int) -> None:
        """A record read and not given to the application: its offset may be committed,
        unless an earlier receipt of the same record is still pending (a rebalance handed
        its partition back before it was committed): that one settles it."""
        if offset not in self.pending.get(tp, ()):
            self.highest[tp] = max(self.highest.get(tp, -1), offset)

    def committable(self) -> dict[tuple[str, int], int]:
        out = {}
        for tp, high in self.highest.items():
            pend = self.pending.get(tp)
            out[tp] = min(pend) if pend else high + 1
        return out


class Consumer:
    """``Consumer("persistent://t/ns/x", "sub", ack_timeout_ms=10000)``; then ``receive``,
    ``acknowledge`` and ``negative_acknowledge`` as in Pulsar. ``ack_group_time_ms`` > 0
    sends their events without waiting and commits offsets at most that often (see the
    module's text): many thousand messages a second instead of one round trip each.

    The subscription reads as the Kafka consumer group ``group_id``:
    ``<ready topic>/<subscription>`` (``acme.orders.created/billing``), so that two
    tenants' (or two topics') subscriptions of one name never share a group. A group named
    after the bare subscription, as earlier SDKs used, hands its committed offsets over
    once, when the new group has none (``_start_offsets``).

    ``topic`` is a Pulsar topic name (a partition ``x-partition-N`` is read alone) and
    ``subscription`` the subscription's name. ``ack_timeout_ms`` (0: off, else at least
    1000) redelivers a message not acknowledged that long after it was received, plus
    the delay of ``ack_timeout_redelivery_backoff`` when one is given.
    ``negative_ack_redelivery_backoff`` times the redelivery of a negatively acknowledged
    message (60 s without one). After ``max_redeliver_count`` redeliveries (None: no
    limit) a message goes to the subscription's dead letter topic,
    ``<ready topic>-<subscription>-DLQ``, instead. ``initial_position`` (``latest`` or
    ``earliest``) is where a new subscription starts. ``bootstrap``, ``tracker_url`` and
    ``policy_url`` default to DWELL_KAFKA_BOOTSTRAP, DWELL_TRACKER_URL and
    DWELL_POLICY_URL, else the local addresses. ``ready_topic_partitions`` is the
    partition count of the ready and retry topics when the consumer creates them.
    ``token`` is the JWT sent to the tracker and exchanged for Kafka tokens.
    ``receiver_queue_size`` (Pulsar's, and its default of 1000) bounds how many messages
    the consumer fetches ahead of ``receive``, spread over its partitions: a redelivery,
    read from the retry topic, queues behind no more than that while the consumer works
    through a backlog.

    The constructor raises ValueError for a setting out of range and SubscribeError when
    the tracker refuses the subscription's settings or cannot be reached."""

    def __init__(self, topic: str, subscription: str, *, ack_timeout_ms: int = 0,
                 ack_timeout_redelivery_backoff: ExponentialRedeliveryBackoff | None = None,
                 negative_ack_redelivery_backoff: ExponentialRedeliveryBackoff | None = None,
                 max_redeliver_count: int | None = None,
                 initial_position: str = "latest",
                 bootstrap: str | None = None, tracker_url: str | None = None,
                 ready_topic_partitions: int = 4, token: str | None = None,
                 policy_url: str | None = None, ack_group_time_ms: int = 0,
                 receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE_SIZE) -> None:
        self.topic = TopicName.parse(topic)
        self.subscription = validate_subscription(subscription)
        self.ack_timeout_ms = validate_ack_timeout_ms(ack_timeout_ms)
        if initial_position not in ("latest", "earliest"):
            raise ValueError("initial_position must be 'latest' or 'earliest'")
        if max_redeliver_count is not None and max_redeliver_count < 1:
            raise ValueError("max_redeliver_count must be >= 1")
        if ack_group_time_ms < 0:
            raise ValueError("ack_group_time_ms must be >= 0")
        if not 1 <= receiver_queue_size <= MAX_RECEIVER_QUEUE_SIZE:
            raise ValueError(f"receiver_queue_size must be in 1..{MAX_RECEIVER_QUEUE_SIZE:,}")
        # 0: each acknowledgement waits for its event and commits; else events are sent
        # without waiting and settled offsets committed at most this often.
        self._group_s = ack_group_time_ms / 1000
        self.ack_timeout_backoff = ack_timeout_redelivery_backoff
        self.nack_backoff = negative_ack_redelivery_backoff
        self.max_redeliver_count = max_redeliver_count
        self.settings = SubscriptionSettings(self.ack_timeout_ms, ack_timeout_redelivery_backoff,
                                             negative_ack_redelivery_backoff,
                                             max_redeliver_count)
        # What the tracker registers and every event carries (unset fields left out).
        self._settings_json = self.settings.to_json(omit_unset=True)
        self._bootstrap = endpoints.kafka_bootstrap(bootstrap)
        self._tracker = endpoints.tracker_url(tracker_url)
        # A partition `x-partition-N` is Kafka partition N of x's ready topic (where
        # admission and the drain write its messages); -1: every partition.
        self.partition = self.topic.partition_index
        self.ready_topic = self.topic.partitioned_topic.kafka_topic
        self.retry_topic = retry_topic(self.topic, self.subscription)
        self.group_id = group_id(self.topic, self.subscription)
        # The JWT sent to the tracker as `Authorization: Bearer` when authentication is on.
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        # Its dwell.acks events carry Kafka tokens got with it (dwell.headers.AUTHORIZATION).
        self._kafka_tokens = KafkaTokens(
            endpoints.policy_url(policy_url),
            token) if token else None
        if self.partition >= 0:
            self._check_partition()  # before the subscription is registered
        self._register()
        # Both topics must exist before subscribing: a group on a missing topic only sees
        # it after the next metadata refresh (minutes), long after the first message.
        for name in (self.ready_topic, self.retry_topic)[self.partition >= 0:]:
            try:
                kafka.partitions(self._bootstrap, name)
            except kafka.KafkaUnavailable:
                kafka.ensure_topic(self._bootstrap, name, ready_topic_partitions)
        # Grouped events are not waited for: a few ms of linger let librdkafka batch them
        # instead of waking its broker thread for each. Their delivery reports are served
        # by the consumer's own calls (`_serve_reports`), not by a thread of the producer
        # that would take the GIL from the application for each report.
        self._events = kafka.Producer(self._bootstrap,
                                      linger_ms=0 if self._group_s == 0 else EVENT_LINGER_MS,
                                      poll_in_background=False)
        # dwell.acks events Kafka has not taken yet, oldest first; how many of them wait to
        # be sent (no Kafka token yet, or refused and to be sent again in their order).
        self._unwritten: deque[_Event] = deque()
        self._unsent = 0
        # When `_write_events` serves delivery reports next (time.monotonic()).
        self._serve_at = 0.0
        self._event_heads, self._event_tail = _event_parts(self.topic, self.subscription,
                                                           self._settings_json)
        self._committed_at = 0.0
        self._to_commit = False
        # Guards the event queue for the thread that sends held delivered events.
        self._lock = threading.Lock()
        # Delivered events held back: (when to send, record, messageId, redelivery count,
        # when received in ms since the epoch) oldest first, and the last of each record
        # by its record. Plain values, not objects: held by the thousand, they are
        # nothing for the garbage collector to trace.
        self._held: deque[_Held] = deque()
        self._held_by: dict[_Record, _Held] = {}
        self._closing = threading.Event()
        parts = self._parts()
        reset = ("earliest" if self._start_offsets(initial_position, parts)
                 else initial_position)
        # librdkafka keeps fetching while a partition has fewer than queued.min.messages
        # waiting, and once it has more looks again fetch.queue.backoff.ms later: at its
        # default of a second, a queue of 1000 halved the msg/s; at 10 ms it costs none.
        fetch: dict[str, Any] = {
            "fetch.wait.max.ms": 10, "fetch.error.backoff.ms": 10,
            "queued.min.messages": max(1, receiver_queue_size // len(parts)),
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS}
        self._consumer = kafka.Consumer(self._bootstrap, self.group_id,
                                        auto_offset_reset=reset, **fetch)
        if self.partition < 0:
            self._consumer.subscribe([self.ready_topic, self.retry_topic])
        else:
            # One partition is read alone, as a Pulsar subscription's default Exclusive
            # consumer reads it: assigned, from the group's committed offsets.
            self._consumer.assign([(t, p, kafka.OFFSET_STORED) for t, p in parts])
        self._buffer: list[kafka.Record] = []
        self._offsets = _Offsets()
        # The duplicate filter ("<redelivery count>/<messageId>") and the acknowledged ids.
        self._seen = _Recent()
        self._acked = _Recent()
        self._event_key = f"{self.topic}/{self.subscription}".encode()
        self._releaser: threading.Thread | None = None
        if self.ack_timeout_ms > 0 and self._group_s > 0:
            self._hold_delivered_events()

    def _hold_delivered_events(self) -> None:
        """Hold delivered events back for the group time, and start the thread that sends
        them once it is up (see the module's text)."""
        self._releaser = threading.Thread(target=self._release_loop, daemon=True,
                                          name="dwell-consumer-held-events")
        self._releaser.start()

    def _check_partition(self) -> None:
        """SubscribeError unless x of `x-partition-N` is a partitioned topic with a
        partition N (Pulsar's wording)."""
        owner = self.topic.partitioned_topic
        count = kafka.partition_count(self._bootstrap, self.ready_topic)
        if count == 0:
            raise SubscribeError(f"Topic {self.topic} not found: {owner} is not a "
                                 "partitioned topic")
        if self.partition >= count:
            raise SubscribeError(f"Illegal topic partition name {self.topic} with max "
                                 f"allowed {count} partitions")

    def _parts(self) -> list[tuple[str, int]]:
        """The (Kafka topic, partition) pairs the subscription reads."""
        ready = ([self.partition] if self.partition >= 0
                 else kafka.partitions(self._bootstrap, self.ready_topic))
        return ([(self.ready_topic, p) for p in ready]
                + [(self.retry_topic, p)
                   for p in kafka.partitions(self._bootstrap, self.retry_topic)])

    def _start_offsets(self, initial_position: str, parts: list[tuple[str, int]]) -> bool:
        """Give the group a committed offset on every partition it reads, unless it has
        some already: those of the group named after the bare subscription (the SDK's
        group before it was unique per topic), else, for ``latest``, the current ends.
        Then a partition without one is a partition added since (`pulsar-admin topics
        update-partitioned-topic`), and the consumer reads it from its start, as Pulsar
        starts a subscription's new partitions at the earliest position: what is written
        there before this consumer sees it is not skipped. False when the ends could not
        be committed (another consumer of the new subscription is connected); the
        consumer then starts where ``initial_position`` says on every partition. ``parts``:
        `_parts`."""
        mine = kafka.Consumer(self._bootstrap, self.group_id)
        try:
            if any(o >= 0 for o in mine.committed(parts).values()):
                return True
            if self._adopt_offsets(mine, parts) or initial_position == "earliest":
                return True
            wanted = set(parts)
            ends = {(t, p): o for t in {t for t, _ in parts}
                    for p, o in kafka.end_offsets(self._bootstrap, t).items()
                    if (t, p) in wanted}
            try:
                mine.commit(ends)
            except kafka.KafkaUnavailable as exc:
                log.warning("subscription %s of %s: could not start it at the latest "
                            "offsets (%s); partitions added later are read from their "
                            "end", self.subscription, self.topic, exc)
                return False
            return True
        finally:
            mine.close()

    def _adopt_offsets(self, mine: kafka.Consumer, parts: list[tuple[str, int]]) -> bool:
        """Carry the committed offsets of the group named after the bare subscription over
        to `group_id` (``mine``, which has none): an upgraded consumer goes on where it
        was. Whether there were any."""
        try:
            legacy = kafka.Consumer(self._bootstrap, self.subscription)
            try:
                found = {tp: o for tp, o in legacy.committed(parts).items() if o >= 0}
            finally:
                legacy.close()
            if found:
                mine.commit(found)
                log.info("subscription %s of %s: took over the offsets of group %r as %r",
                         self.subscription, self.topic, self.subscription, self.group_id)
        except kafka.KafkaUnavailable as exc:  # the group starts at initial_position
            log.warning("could not look up group %r's offsets: %s", self.subscription, exc)
            return False
        return bool(found)

    # -- subscription registration (tracker)
    def _register(self) -> None:
        t = self.topic
        url = (f"{self._tracker.rstrip('/')}/v1/topics/{t.domain}/{t.tenant}/{t.namespace}/"
               f"{t.local}/subscriptions/{self.subscription}")
        try:
            resp = httpx.put(url, json=self._settings_json, timeout=10, headers=self._auth,
                             verify=http_verify())
        except httpx.HTTPError as exc:
            raise SubscribeError(f"tracker unreachable at {self._tracker}: {exc}") from exc
        if resp.status_code >= 300:
            try:
                reason = resp.json().get("reason", resp.text)
            except ValueError:
                reason = resp.text
            raise SubscribeError(f"tracker refused subscription: HTTP {resp.status_code}: "
                                 f"{reason}")

    # -- receiving
    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None when ``timeout`` seconds pass without one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self._buffer:
                msg = self._accept(self._buffer.pop(0))
                if msg is not None:
                    return msg
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return None
            if self._unwritten:
                with self._lock:
                    self._write_events(0)
            self._commit()
            self._buffer = self._consumer.poll(500, min(left, 1.0))

    def _accept(self, rec: kafka.Record) -> Message | None:
        tp = (rec.topic, rec.partition)
        headers = rec.headers
        raw_id = headers.get(hdr.MESSAGE_ID)
        message_id = (raw_id.decode(errors="replace") if raw_id
                      else format_message_id(rec.topic, rec.partition, rec.offset))
        count = max(0, _int_header(headers, hdr.REDELIVERY_COUNT) or 0)
        dedupe = f"{count}/{message_id}"
        if dedupe in self._seen or message_id in self._acked:
            # A drain that crashed between writing and completing re-emits a bucket; a
            # redelivery the backoff job scheduled before it read this consumer's ack (the
            # ack came within its ack timeout, but in its next micro-batch) comes after
            # the ack. An acknowledged message is not given to the application again: a
            # Pulsar consumer too ignores "a message as it was already being acked earlier
            # by same consumer" (ConsumerImpl.messageReceived).
            self._offsets.skip(tp, rec.offset)
            return None
        self._offsets.received(tp, rec.offset)
        self._seen.add(dedupe)
        key = rec.key.decode(errors="replace") if rec.key is not None else None
        msg = Message(rec.value, key, properties_of(headers), message_id, count,
                      _int_header(headers, hdr.DELIVER_AT),
                      _int_header(headers, hdr.PUBLISH_TIME),
                      _int_header(headers, hdr.EVENT_TIME), str(self.topic), rec.topic,
                      rec.partition, rec.offset)
        if self.ack_timeout_ms > 0:
            # The ack timeout's clock starts here; once the event is durable the backoff
            # job owns this message's redelivery. Without an ack timeout a delivery
            # schedules nothing (dwell_spark.backoff.step), so it sends no event.
            self._emit("delivered", msg)
        return msg

    # -- acknowledging
    def acknowledge(self, msg: Message) -> None:
        """Acknowledge ``msg``: it is not redelivered. Without ``ack_group_time_ms`` this
        returns once the ack is on ``dwell.acks`` and the offset committed (or queued while
        Kafka is away: see the module's text)."""
        self._acked.add(msg.message_id)
        self._emit("ack", msg)

    def negative_acknowledge(self, msg: Message) -> None:
        """Ask for ``msg`` again: it is redelivered after the delay of
        ``negative_ack_redelivery_backoff`` (60 s without one), or goes to the dead letter
        topic once it has had ``max_redeliver_count`` redeliveries."""
        self._emit("nack", msg)

    def _settle(self, record: _Record) -> None:
        """``record`` (topic, partition, offset) is the application's or the backoff
        job's now: its offset may be committed."""
        topic, partition, offset = record
        self._offsets.settle((topic, partition), offset)
        self._to_commit = True

    def _commit(self, now: bool = False) -> None:
        """Commit the settled offsets, at most every ``ack_group_time_ms`` unless ``now``."""
        if not self._to_commit or (
                not now and time.monotonic() - self._committed_at < self._group_s):
            return
        self._committed_at = time.monotonic()
        try:
            if self._group_s > 0 and not now:
                # Not waited for: a commit that fails leaves its offsets to the next one
                # (each carries every settled offset), and `close` commits and waits.
                self._consumer.commit_in_background(self._offsets.committable())
            else:
                self._consumer.commit(self._offsets.committable())
            self._to_commit = False
        except kafka.KafkaUnavailable as exc:
            # The messages are settled all the same (their events are written): the next
            # commit carries their offsets. Until one succeeds, a restart or a rebalance
            # reads them again, and a copy is what an ack lost in a Pulsar broker's outage
            # gives too.
            log.warning("offsets not committed (the next commit carries them): %s", exc)

    def _emit(self, event: str, msg: Message) -> None:
        """Send ``event`` of ``msg`` to dwell.acks; its offset is settled once Kafka has
        taken it (offsets are committed on the strength of the event). Without grouping
        it waits for that, unless older events are queued (Kafka away): then it joins
        their queue without waiting. With grouping and an ack timeout, a delivered event
        is held back for the group time, and an ack or nack of its message meanwhile is
        sent in its place (see the module's text)."""
        ts = int(time.time() * 1000)
        record = (msg.record_topic, msg.partition, msg.offset)
        with self._lock:
            if self._releaser is not None:
                if event == "delivered":
                    # Its event is made when it is sent, if it is: most are not.
                    held = (time.monotonic() + self._group_s, record, msg.message_id,
                            msg.redelivery_count, ts)
                    self._held.append(held)
                    self._held_by[record] = held
                    return
                # Held, it is not sent: this event says all it would have.
                self._held_by.pop(record, None)
            ev = _Event(record, self._body(event, msg.message_id, msg.redelivery_count, ts))
            self._queue(ev)
            self._write_events(EVENT_WAIT_S if self._group_s == 0
                               and len(self._unwritten) == 1 else 0)

    def _body(self, event: str, message_id: str, redelivery_count: int, ts: int) -> bytes:
        """The JSON text of a message's ``event`` at ``ts`` (ms since the epoch)."""
        return (f"{self._event_heads[event]}{json.dumps(message_id)}, "
                f'"redeliveryCount": {redelivery_count}, '
                f'"ts": {ts}{self._event_tail}').encode()

    def _queue(self, ev: _Event) -> None:
        """Send ``ev`` now unless an older event waits to be sent (again): events go in
        order. Kafka refuses a partition's events in the order they were sent, so one it
        refused is the oldest still queued."""
        unwritten = self._unwritten
        waiting = self._unsent > 0 or (
            bool(unwritten) and isinstance(unwritten[0].state, Exception))
        headers = None if waiting else self._event_headers()
        unwritten.append(ev)
        if headers is None:
            self._unsent += 1
        else:
            self._send(ev, headers)

    def _release_loop(self) -> None:
        """Send held delivered events once their time is up, until `close`."""
        while not self._closing.wait(self._group_s / 2):
            # Reports too, for an application that calls nothing for a while: its settled
            # offsets are committed by its next call.
            self._serve_reports(0)
            with self._lock:
                self._release(time.monotonic())

    def _release(self, now: float) -> None:
        """Queue the held delivered events due by ``now``, oldest first; call with
        ``_lock`` held."""
        held, held_by = self._held, self._held_by
        while held and held[0][0] <= now:
            entry = held.popleft()
            _, record, message_id, count, ts = entry
            if held_by.get(record) is not entry:
                continue  # acknowledged meanwhile, or received again and held again
            del held_by[record]
            # Stamped when the message was received: the ack timeout runs from there.
            ev = _Event(record, self._body("delivered", message_id, count, ts))
            try:
                self._queue(ev)
            except kafka.KafkaUnavailable as exc:
                # Queued, not sent: the next event, `receive` or `close` sends it again.
                self._unsent += 1
                log.warning("a delivered event was refused (%s); sent again later", exc)

    def _send(self, ev: _Event, headers: dict[str, str]) -> None:
        # Marked before the send: its report may come before send_then returns.
        ev.state = _SENT
        try:
            self._events.send_then(names.ACKS, ev.body, self._event_key, headers or None,
                                   ev.reported)
        except kafka.KafkaUnavailable:
            ev.state = None  # refused at once: not sent
            raise

    def _write_events(self, wait_s: float) -> None:
        """Settle the events Kafka has taken, oldest first, and commit (`_commit`); send
        the ones not sent yet and send again, in their order, the ones Kafka refused; wait
        up to ``wait_s`` for the oldest. Call with ``_lock`` held."""
        now = time.monotonic()
        deadline = now + wait_s if wait_s > 0 else 0.0
        if now >= self._serve_at:
            self._serve_at = now + REPORT_INTERVAL_S
            self._serve_reports(0)
        unwritten = self._unwritten
        try:
            while unwritten:
                first = unwritten[0]
                state = first.state
                if state is True:
                    unwritten.popleft()
                    self._settle(first.record)
                    continue
                # Not sent, or refused: send again.
                if state is not _SENT and not self._send_again():
                    if wait_s > 0:
                        log.warning("%d dwell.acks events not written yet (no Kafka "
                                    "token); kept, their offsets wait for them",
                                    len(unwritten))
                    return
                if wait_s <= 0:
                    return
                while first.state is _SENT:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._serve_reports(min(left, REPORT_WAIT_S))
                state = first.state
                if state is _SENT:
                    log.warning("%d dwell.acks events not written yet (Kafka away?); "
                                "kept, their offsets wait for them", len(unwritten))
                    return
                if isinstance(state, Exception):
                    if time.monotonic() >= deadline:
                        log.warning("dwell.acks event not written (%s); sent again later",
                                    state)
                        return
                    time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        finally:
            self._commit()

    def _serve_reports(self, timeout: float) -> None:
        """Serve the delivery reports of events (`_Event.reported`) on this thread,
        waiting up to ``timeout`` for one."""
        self._events.poll(timeout)

    def _send_again(self) -> bool:
        """Send, in their order, every queued event not sent yet or refused by Kafka;
        False when there is no Kafka token to send them with."""
        headers = self._event_headers()
        if headers is None:
            return False
        for ev in self._unwritten:
            if ev.state is None or isinstance(ev.state, Exception):
                self._send(ev, headers)
        self._unsent = 0
        return True

    def _event_headers(self) -> dict[str, str] | None:
        """The headers of events sent now; None when they need a Kafka token and there is
        none yet."""
        tokens = self._kafka_tokens
        if tokens is None:
            return {}
        header = tokens.header()
        if header is not None:
            return {hdr.AUTHORIZATION: header}
        return {} if tokens.disabled else None

    def close(self) -> None:
        """Write the queued events (waiting up to EVENT_WAIT_S for them), commit the
        settled offsets and leave the consumer group."""
        try:
            self._closing.set()
            if self._releaser is not None:
                self._releaser.join()
            with self._lock:
                self._release(float("inf"))
                if self._unwritten:
                    # A last chance for the queued events: what stays unwritten is read
                    # again.
                    self._write_events(EVENT_WAIT_S)
            self._commit(now=True)
            self._consumer.close()
        finally:
            self._events.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# `_Event.state` of an event sent and not reported yet.
_SENT = object()


class _Event:
    """A dwell.acks event of the message read from ``record`` (its JSON ``body``) and its
    ``state``: None until sent, then _SENT, then True once Kafka has it or the
    KafkaUnavailable it was refused with (set by `reported`, on the thread serving the
    producer's delivery reports: `Consumer._serve_reports`)."""

    __slots__ = ("record", "body", "state")

    def __init__(self, record: _Record, body: bytes) -> None:
        self.record = record
        self.body = body
        self.state: object = None

    def reported(self, error: kafka.KafkaUnavailable | None) -> None:
        self.state = True if error is None else error


def _event_parts(topic: TopicName, subscription: str, settings: Mapping[str, Any]
                 ) -> tuple[dict[str, str], str]:
    """What every dwell.acks event of a subscription shares, per event kind the JSON up
    to its ``messageId`` and the tail after its ``ts``, so that `Consumer._emit` formats
    only the three fields of its message: the text ``json.dumps`` gives of
    ``{"event", "topic", "subscription", "messageId", "redeliveryCount", "ts",
    **settings}``. Settings ride along so the backoff job needs no lookup per event
    (docs/architecture.md's dwell.acks row); the tracker's registration is the record."""
    heads = {event: json.dumps({"event": event, "topic": str(topic),
                                "subscription": subscription})[:-1] + ', "messageId": '
             for event in ("delivered", "ack", "nack")}
    tail = ", " + json.dumps(dict(settings))[1:] if settings else "}"
    return heads, tail


def properties_of(headers: Mapping[str, bytes]) -> dict[str, str]:
    """A record's Pulsar properties: every header that is not dwell's own."""
    return {k: v.decode(errors="replace") for k, v in headers.items()
            if not k.startswith(HEADER_PREFIX)}
