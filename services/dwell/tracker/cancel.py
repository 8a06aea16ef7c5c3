"""Cancelling a pending delayed message by the messageId its publish returned
(`DELETE .../messages/{messageId}` on the tracker's API).

A cancel is decided in the index (dwell.index.topic.TopicIndex.cancel, atomic against
the drain's claim) and then recorded in Kafka: a cancel mark on `dwell.delivered`
(dwell.index.marks.cancel_mark_record), which a rebuild of the index reads before it
indexes anything, so a Redis loss does not bring the message back. Only a cancel whose
mark Kafka acknowledged is answered "cancelled".

The requests are worked in batches by one thread: each batch reads its messages'
records in one pass over the delay log, asks the index in one pipeline and writes its
marks with one flush, so that a cancel costs about what a publish does.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Final

import redis as redislib

from dwell import keys
from dwell.adapters import kafka
from dwell.core.buckets import bucket_start
from dwell.core.positions import BUSY, CANCELLED, NOT_FOUND, TOO_LATE, parse_message_id
from dwell.core.topics import TopicName
from dwell.headers import DELIVER_AT, TICK_TIME
from dwell.index import topic as index
from dwell.index.marks import cancel_mark_record
from dwell.tracker.metrics import CANCELS as REQUESTS

log = logging.getLogger("dwell.tracker.cancel")

# A delivered message is not found: no pending message has its id (metrics and the
# answer's `delivered` tell it apart).
DELIVERED: Final = "delivered"
_ANSWERS: Final = {index.CANCELLED: CANCELLED, index.DELIVERED: DELIVERED,
                   index.TOO_LATE: TOO_LATE, index.BUSY: BUSY}
_DETAILS: Final = {
    CANCELLED: "message {} cancelled",
    DELIVERED: "message {} was already delivered",
    NOT_FOUND: "message {} not found",
    TOO_LATE: "message {} is due and being delivered",
}
# Requests worked in one batch, at most.
BATCH: Final = 1000
# How often requests that wait (for the ingest, for a re-filing round) are looked at again.
_RETRY_S: Final = 0.02
# Offsets this close are read through rather than sought (a seek costs a fetch round trip;
# a record read past, little).
READ_GAP: Final = 64
# The reader's fetches are small: a cancel names records anywhere in the delay log, and a
# scan's 16 MiB fetch per seek would read megabytes for each one.
READER_CONFIG: Final = {**kafka.SCAN_CONFIG, "max.partition.fetch.bytes": 256 << 10,
                        "fetch.max.bytes": 4 << 20, "queued.min.messages": 1000}
# The largest offset a record can have (Kafka's offsets are signed 64-bit).
_MAX_OFFSET: Final = 2**63 - 2


class NotRecorded(Exception):
    """Kafka did not take the cancel mark: the index holds the cancel, but a rebuild
    would not; the caller retries."""


@dataclass(frozen=True, slots=True)
class Outcome:
    answer: str  # dwell.core.positions' CANCELLED, NOT_FOUND, TOO_LATE or BUSY
    detail: str
    delivered: bool = False  # a NOT_FOUND message was delivered already


@dataclass(slots=True)
class _Request:
    topic: TopicName
    message_id: str
    partition: int
    offset: int
    deadline: float  # monotonic: past it, a request still waiting is answered busy
    future: Future[Outcome] = field(default_factory=Future)
    bucket: int | None = None  # known once its record was read
    deliver_at: int = 0
    tick: int = 0


def _int(raw: bytes | None) -> int | None:
    if raw is None or not raw.isdigit() or len(raw) > 18:
        return None
    return int(raw)


class Canceller:
    """Cancels on one tracker. ``cancel`` hands a request to the worker thread (started by
    the first one) and returns a future of its Outcome."""

    def __init__(self, r: redislib.Redis, bootstrap: str, delayed_topic: str, *,
                 wait_ms: int, margin_ms: int) -> None:
        self.redis = r
        self.bootstrap = bootstrap
        self.delayed_topic = delayed_topic
        self.wait_s = wait_ms / 1000
        self.margin_ms = margin_ms
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._waiting: list[_Request] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._reader: kafka.Consumer | None = None
        self._producer: kafka.Producer | None = None
        self._partitions = 0  # of the delay log, as last read

    def cancel(self, topic: TopicName, message_id: str) -> Future[Outcome]:
        """A future of the answer to cancelling ``message_id`` of ``topic``: an Outcome,
        or ValueError for an id that is not one, kafka.KafkaUnavailable or NotRecorded
        when the answer is not known yet."""
        kafka_topic, partition, offset = parse_message_id(message_id)
        req = _Request(topic, message_id, partition, offset, time.monotonic() + self.wait_s)
        if kafka_topic == topic.kafka_topic:
            self._answer(req, DELIVERED, f"message {message_id} was published without a "
                                         "delay and delivered at once")
        elif kafka_topic != self.delayed_topic or offset > _MAX_OFFSET:
            self._answer(req, NOT_FOUND)
        else:
            self._start()
            self._queue.put(req)
        return req.future

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._reader is not None:
            self._reader.close()
        if self._producer is not None:
            self._producer.close(1.0)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tracker-cancel",
                                                daemon=True)
                self._thread.start()

    @staticmethod
    def _answer(req: _Request, answer: str, detail: str | None = None) -> None:
        """Answer ``req``: one of _ANSWERS' values or NOT_FOUND (the metric's label)."""
        REQUESTS.labels(answer).inc()
        if answer == BUSY and detail is None:
            detail = "the index has not reached the message, or re-files its bucket"
        detail = detail or _DETAILS[answer].format(req.message_id)
        delivered = answer == DELIVERED
        req.future.set_result(Outcome(NOT_FOUND if delivered else answer, detail, delivered))

    # -- the worker

    def _run(self) -> None:
        while not self._stopping.is_set():
            batch = self._take()
            if not batch:
                continue
            try:
                self._work(batch)
            except Exception as exc:  # every request of the batch gets the error
                if not isinstance(exc, (kafka.KafkaUnavailable, NotRecorded,
                                        redislib.RedisError)):
                    log.exception("a batch of cancels failed")
                if isinstance(exc, kafka.KafkaUnavailable) and self._reader is not None:
                    self._reader.close()
                    self._reader = None
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(exc)

    def _take(self) -> list[_Request]:
        """The requests that waited and are due a new look, and what came meanwhile (up
        to BATCH); blocks a moment when there is nothing."""
        batch, self._waiting = self._waiting, []
        try:
            if not batch:
                batch.append(self._queue.get(timeout=0.5))
            while len(batch) < BATCH:
                batch.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        if batch and all(r.bucket is not None or r.future.done() for r in batch) \
                and self._queue.empty():
            time.sleep(_RETRY_S)  # only retries: give the ingest or the round a moment
        return batch

    def _work(self, batch: list[_Request]) -> None:
        fresh = [r for r in batch if r.bucket is None]
        if fresh:
            self._read(fresh)
        ready = [r for r in batch if r.bucket is not None and not r.future.done()]
        if not ready:
            return
        ingested = self.redis.hmget(keys.INGESTED, [str(r.partition) for r in ready])
        asked: list[_Request] = []
        pipe = self.redis.pipeline(transaction=False)
        now = int(time.time() * 1000)
        for req, raw in zip(ready, ingested, strict=True):
            if raw is None or int(raw) <= req.offset:
                self._wait(req)  # the ingest has not indexed it yet
                continue
            assert req.bucket is not None
            index.TopicIndex(self.redis, str(req.topic)).cancel(
                req.partition, req.offset, req.bucket, now + 1 + self.margin_ms, client=pipe)
            asked.append(req)
        if not asked:
            return
        codes = pipe.execute()
        cancelled = []
        for req, code in zip(asked, codes, strict=True):
            answer = _ANSWERS[int(code)]
            if answer == CANCELLED:
                cancelled.append(req)
            elif answer == BUSY:
                self._wait(req)
            else:
                self._answer(req, answer)
        if cancelled:
            self._record(cancelled)

    def _wait(self, req: _Request) -> None:
        """Look at ``req`` again with the next batch, or answer busy past its deadline."""
        if time.monotonic() >= req.deadline:
            self._answer(req, BUSY)
        else:
            self._waiting.append(req)

    def _read(self, reqs: list[_Request]) -> None:
        """Read the records ``reqs`` name in one pass; answer those that name no message
        of their topic, and note the bucket of the others."""
        if max(r.partition for r in reqs) >= self._partitions:
            self._partitions = kafka.partition_count(self.bootstrap, self.delayed_topic)
        wanted: dict[int, set[int]] = {}
        for req in reqs:
            if req.partition < self._partitions:
                wanted.setdefault(req.partition, set()).add(req.offset)
        found: dict[tuple[int, int], tuple[bytes | None, dict[str, bytes]]] = {}
        if wanted:
            if self._reader is None:
                self._reader = kafka.Consumer(self.bootstrap, "dwell-tracker-cancel",
                                              **READER_CONFIG)
            for msg in kafka.read_offsets(self._reader, self.delayed_topic,
                                          {p: sorted(o) for p, o in wanted.items()},
                                          READ_GAP, max(self.wait_s, 5.0)):
                found[(msg.partition(), msg.offset())] = (msg.key(), dict(msg.headers() or ()))
        for req in reqs:
            key, headers = found.get((req.partition, req.offset), (None, {}))
            deliver_at, tick = _int(headers.get(DELIVER_AT)), _int(headers.get(TICK_TIME))
            # Another topic's message is not found either: its existence is not ours to
            # tell.
            if (key != str(req.topic).encode() or deliver_at is None or tick is None
                    or tick < 1):
                self._answer(req, NOT_FOUND)
                continue
            req.deliver_at, req.tick = deliver_at, tick
            req.bucket = bucket_start(deliver_at, tick)

    def _record(self, reqs: list[_Request]) -> None:
        """The cancel marks, with one flush; ``reqs`` are answered cancelled once Kafka
        acknowledged theirs."""
        if self._producer is None:
            self._producer = kafka.Producer(self.bootstrap, linger_ms=0)
        marks = [cancel_mark_record(self.delayed_topic, str(r.topic), r.bucket or 0,
                                    r.partition, r.offset) for r in reqs]
        futures = [self._producer.send(topic, value, key)
                   for topic, value, key, _, _ in marks]
        for req, fut in zip(reqs, futures, strict=True):
            try:
                fut.result(timeout=max(self.wait_s, 10.0))
            except Exception as exc:
                req.future.set_exception(
                    NotRecorded(f"Kafka did not take the cancel mark: {exc}"))
                continue
            self._answer(req, CANCELLED)
