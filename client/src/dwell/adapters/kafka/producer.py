"""Producers: `Producer` (futures of where each record landed), `TransactionalProducer`
(admission's exactly-once consume-transform-produce) and `BulkProducer` (the drain's and
the restage's copies, failures reported at `flush`)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Optional

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Producer as _Producer

from .config import connection
from .errors import KafkaUnavailable
from .record import Headers, OutRecord, encode_headers

if TYPE_CHECKING:
    from .consumer import Consumer

# A delivery callback, as librdkafka calls it.
OnDelivery = Callable[[Optional[KafkaError], Message], None]


def _report(then: Callable[[KafkaUnavailable | None], None], err: KafkaError | None,
            msg: Message) -> None:
    """`Producer.send_then`'s delivery callback."""
    then(None if err is None else KafkaUnavailable(f"{msg.topic()}: {err.str()}"))


class Producer:
    """An idempotent, acks=all producer whose sends return futures of
    (partition, offset). A background thread serves delivery callbacks (unless
    `poll_in_background` is False: then `poll` and `flush` serve them, on the calling
    thread)."""

    def __init__(self, bootstrap: str, *, linger_ms: int = 5, poll_in_background: bool = True,
                 compression_type: str = "none", send_timeout_s: float | None = None,
                 **extra: Any) -> None:
        conf: dict[str, Any] = {
            **connection(bootstrap),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            # Settings' kafka_compression_type: "none" unless a deployment opts in.
            "compression.type": compression_type,
            "message.timeout.ms": 30000,
            "queue.buffering.max.messages": 500000,
            "socket.connection.setup.timeout.ms": 5000,
        }
        conf.update(extra)
        self._p = _Producer(conf)
        # How long a send may wait for room in the local queue: past the time Kafka has to
        # take a queued record (message.timeout.ms), room will not come.
        self._send_timeout = (send_timeout_s if send_timeout_s is not None
                              else int(conf["message.timeout.ms"]) / 1000 + 5)
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None
        if poll_in_background:
            self._poller = threading.Thread(target=self._poll_loop, name="kafka-producer-poll",
                                            daemon=True)
            self._poller.start()

    def learn(self, topic: str, timeout: float = 10.0) -> int:
        """Fetch ``topic``'s metadata now rather than at the next refresh: a send to a
        partition added since this producer last looked fails at once otherwise
        (`Local: Unknown partition`). Returns the partitions it now knows of;
        KafkaUnavailable when Kafka does not answer."""
        try:
            meta = self._p.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(f"metadata of {topic}: {exc}") from exc
        got = meta.topics.get(topic)
        return len(got.partitions) if got is not None and got.error is None else 0

    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            self._p.poll(0.05)

    def send(self, topic: str, value: bytes | None, key: bytes | str | None = None,
             headers: Headers | None = None, partition: int | None = None,
             timestamp_ms: int | None = None) -> Future[tuple[int, int]]:
        fut: Future[tuple[int, int]] = Future()

        def _done(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                fut.set_exception(KafkaUnavailable(f"{topic}: {err.str()}"))
            else:
                fut.set_result((msg.partition(), msg.offset()))

        record = (topic, value, key, encode_headers(headers), timestamp_ms)
        self._queue((record,), lambda _: _done, -1 if partition is None else partition)
        return fut

    def send_then(self, topic: str, value: bytes | None, key: bytes | None,
                  headers: Headers | None,
                  then: Callable[[KafkaUnavailable | None], None]) -> None:
        """Send one record and call ``then(None)`` once Kafka has it, or ``then(error)``
        when it refused it; from the thread that serves delivery reports. For a caller
        sending many records one at a time: no Future (and its lock) per record. Raises
        KafkaUnavailable when the client refuses the record at once."""
        on_delivery = functools.partial(_report, then)
        hdrs = encode_headers(headers)
        try:
            self._p.produce(topic, value, key, on_delivery=on_delivery, headers=hdrs)
        except BufferError:  # the local queue is full: `_queue` waits for room
            self._queue(((topic, value, key, hdrs, None),), lambda _: on_delivery)
        except KafkaException as exc:
            raise KafkaUnavailable(f"{topic}: {exc.args[0].str()}") from exc

    def send_many(self, records: Sequence[OutRecord], partitions: Sequence[int] | None = None
                  ) -> Future[list[tuple[int, int]]]:
        """Send a batch; one future of every (partition, offset) in order, or the first
        error. Cheaper than `send` per record: no Future per message.
        Headers here are already encoded: a list of (name, bytes). `partitions`, when
        given, holds each record's partition (-1: the partitioner's choice)."""
        fut: Future[list[tuple[int, int]]] = Future()

        def settle(out: list[tuple[int, int]] | None, exc: Exception | None) -> None:
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(out)  # type: ignore[arg-type]

        self.send_many_then(records, settle, partitions)
        return fut

    def send_many_then(self, records: Sequence[OutRecord],
                       settle: Callable[[list[tuple[int, int]] | None, Exception | None], None],
                       partitions: Sequence[int] | None = None) -> None:
        """Send a batch and call `settle(offsets, None)` once every record is acknowledged,
        or `settle(None, error)` at the first failure; exactly once, from the thread that
        serves delivery reports (the poll thread, `flush`, or `poll`'s caller). Raises
        KafkaUnavailable (and never settles) when the client refuses a record at once.
        `partitions`: as for `send_many`."""
        n = len(records)
        out: list[tuple[int, int]] = [(0, 0)] * n
        if n == 0:
            settle(out, None)
            return
        left = n

        # Called once per record, from C, for every record under load: as few Python
        # operations as will do (a positional partial, a closure counter).
        def _done(i: int, err: KafkaError | None, msg: Message) -> None:
            nonlocal left
            if left <= 0:
                return  # already settled (a failure)
            if err is not None:
                left = 0
                settle(None, KafkaUnavailable(f"{msg.topic()}: {err.str()}"))
                return
            out[i] = (msg.partition(), msg.offset())
            left -= 1
            if not left:
                settle(out, None)

        # partial(partial, _done)(i) is partial(_done, i), built without a Python frame.
        self._queue(records, functools.partial(functools.partial, _done),
                    partitions=partitions)

    @property
    def polls_in_background(self) -> bool:
        return self._poller is not None

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports on this thread (a producer made with
        `poll_in_background=False`); the number served."""
        return int(self._p.poll(timeout))

    def send_unreported(self, records: Sequence[OutRecord],
                        partitions: Sequence[int] | None = None) -> None:
        """Queue records without a delivery report each, for callers that learn of
        failures otherwise: a transaction's `commit` (it raises if any record was not
        written; admission's result records) or `BulkProducer.flush`. Per-record
        callbacks would only cost time. `partitions`: as for `send_many`."""
        self._queue(records, partitions=partitions)

    def _queue(self, records: Iterable[OutRecord],
               report: Callable[[int], OnDelivery] | None = None,
               partition: int = -1, partitions: Sequence[int] | None = None) -> None:
        """Hand ``records`` to librdkafka's local queue in order; ``report(i)``, when
        given, is the i-th record's delivery callback (else the producer's own, if any).
        Every record goes to ``partition``, or the i-th to ``partitions[i]`` when that is
        given (-1: the partitioner's choice).

        While the queue is full, serve the delivery reports that empty it (unless the
        background thread does) and wait a moment: librdkafka only frees room in its
        queue on poll(), so a producer without a background thread that merely slept
        would wait forever. KafkaUnavailable once a record has waited `send_timeout_s`,
        or when the client refuses a record (e.g. its topic was deleted meanwhile): the
        records queued before it may still land, and the caller's retry can duplicate
        them, as after any unacknowledged send."""
        produce = self._p.produce
        for i, (topic, value, key, headers, ts) in enumerate(records):
            on_delivery = None if report is None else report(i)
            if partitions is not None:
                partition = partitions[i]
            deadline: float | None = None
            while True:
                try:
                    # timestamp 0: librdkafka stamps the record with the current time.
                    produce(topic, value, key, partition, on_delivery=on_delivery,
                            headers=headers, timestamp=ts or 0)
                    break
                except BufferError:
                    now = time.monotonic()
                    if deadline is None:
                        deadline = now + self._send_timeout
                    elif now > deadline:
                        raise KafkaUnavailable(
                            f"producer queue full for {self._send_timeout:.0f}s: "
                            "Kafka is not taking records") from None
                    if self._poller is None:
                        self._p.poll(0.005)
                    else:
                        time.sleep(0.005)
                except KafkaException as exc:
                    raise KafkaUnavailable(f"{topic}: {exc.args[0].str()}") from exc

    def flush(self, timeout: float = 30.0) -> None:
        if self._p.flush(timeout) > 0:
            raise KafkaUnavailable(f"messages still undelivered after {timeout}s")

    def close(self, timeout: float = 10.0) -> None:
        try:
            self._p.flush(timeout)
        finally:
            self._stop_poller()

    def _stop_poller(self) -> None:
        self._closed.set()
        if self._poller is not None:
            self._poller.join(timeout=1)


class TransactionalProducer(Producer):
    """A producer whose sends belong to transactions; `commit` also commits a consumer's
    offsets, so outputs and input progress become visible together or not at all
    (KIP-447: admission's consume-transform-produce with exactly-once)."""

    def __init__(self, bootstrap: str, transactional_id: str, *, linger_ms: int = 5,
                 timeout: float = 30.0, **extra: Any) -> None:
        super().__init__(bootstrap, linger_ms=linger_ms, **{
            "transactional.id": transactional_id, **extra})
        self._timeout = timeout
        try:
            self._p.init_transactions(timeout)
        except KafkaException as exc:
            self.close(1.0)
            raise KafkaUnavailable(f"init_transactions: {exc}") from exc

    def begin(self) -> None:
        try:
            self._p.begin_transaction()
        except KafkaException as exc:
            raise KafkaUnavailable(f"begin_transaction: {exc}") from exc

    def commit(self, consumer: Consumer, offsets: Mapping[tuple[str, int], int]) -> None:
        """Add `offsets` (next offset to read) of `consumer`'s group and commit."""
        try:
            if offsets:
                self._p.send_offsets_to_transaction(
                    [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    consumer.group_metadata(), self._timeout)
            self._p.commit_transaction(self._timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(f"commit_transaction: {exc}") from exc

    def abort(self) -> None:
        try:
            self._p.abort_transaction(self._timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(f"abort_transaction: {exc}") from exc

    def close(self, timeout: float = 10.0) -> None:
        self._stop_poller()


class BulkProducer(Producer):
    """A producer for copies whose offsets nobody asks for (the drain): librdkafka
    reports failed records only (`delivery.report.only.error`), so a delivered record
    costs no Python call, and `flush` raises if any record since the last flush failed.
    acks=all and idempotent like `Producer`."""

    def __init__(self, bootstrap: str, *, linger_ms: int = 5, **extra: Any) -> None:
        self._failures: list[str] = []
        # No background poller: failure reports are served by `flush` on the caller's
        # thread, so none can land after the flush that covers its record.
        super().__init__(bootstrap, linger_ms=linger_ms, poll_in_background=False, **{
            "delivery.report.only.error": True, "on_delivery": self._failed, **extra})

    def _failed(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._failures.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every record queued is written; KafkaUnavailable if one was not."""
        super().flush(timeout)
        failures, self._failures = self._failures, []
        if failures:
            raise KafkaUnavailable(f"{len(failures)} records not written, first {failures[0]}")
