"""The group consumer with manual commits, and the watermark lookup that the admin
helpers and the offset scans share."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer as _Consumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from .config import connection
from .errors import KafkaUnavailable
from .record import Record, record_of

log = logging.getLogger("dwell.adapters.kafka")

# How long a commit is retried while the group coordinator is loading or moving.
COMMIT_RETRY_S = 30.0
# How long closing a consumer may take before the caller goes on without it (close_within).
CLOSE_TIMEOUT_S = 30.0
# Refusals that pass once the coordinator is ready (librdkafka does not flag all of them
# retriable on a synchronous commit).
RETRIABLE_COMMIT = frozenset({KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                              KafkaError.NOT_COORDINATOR,
                              KafkaError.COORDINATOR_NOT_AVAILABLE,
                              KafkaError.REQUEST_TIMED_OUT})


@dataclass(frozen=True)
class Columns:
    """A polled batch column-wise (`Consumer.poll_columns`): entry i of every list belongs
    to the i-th record; `headers[j]` holds the value of the j-th requested header name
    (None when absent; the last one when repeated)."""

    partitions: list[int]
    offsets: list[int]
    keys: list[bytes | None]
    headers: list[list[bytes | None]]

    def __len__(self) -> int:
        return len(self.offsets)


class Consumer:
    """A group consumer with manual commits: callers commit only what they have
    durably handled, so a crash re-reads rather than loses."""

    def __init__(self, bootstrap: str, group_id: str, topics: Iterable[str] | None = None, *,
                 auto_offset_reset: str = "earliest", **extra: Any) -> None:
        conf: dict[str, Any] = {
            **connection(bootstrap),
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": auto_offset_reset,
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "max.poll.interval.ms": 300000,
            "fetch.wait.max.ms": 50,
            "socket.connection.setup.timeout.ms": 5000,
        }
        conf.update(extra)
        self._c = _Consumer(conf)
        self._learned: set[str] = set()
        if topics:
            self._c.subscribe(list(topics))

    def subscribe(self, topics: Iterable[str], on_assign: Any = None,
                  on_revoke: Any = None) -> None:
        kwargs: dict[str, Any] = {}
        if on_assign:
            kwargs["on_assign"] = on_assign
        if on_revoke:
            kwargs["on_revoke"] = on_revoke
        self._c.subscribe(list(topics), **kwargs)

    def assign(self, assignments: Iterable[tuple[str, int, int]]) -> None:
        self._c.assign([TopicPartition(t, p, o) for t, p, o in assignments])

    def learn(self, topics: Iterable[str], timeout: float = 10.0) -> None:
        """Fetch the metadata of topics this consumer has not read yet, before assigning
        them: otherwise librdkafka looks a topic up on its first fetch, which then waits
        for about a second."""
        for t in set(topics) - self._learned:
            try:
                self._c.list_topics(t, timeout=timeout)
            except KafkaException as exc:
                raise KafkaUnavailable(f"metadata of {t}: {exc}") from exc
            self._learned.add(t)

    def unassign(self) -> None:
        """Drop the assignment and whatever was fetched for it."""
        self._c.unassign()

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Move an assigned consumer back (or on) to `offset` per (topic, partition)."""
        for (t, p), o in offsets.items():
            try:
                self._c.seek(TopicPartition(t, p, o))
            except KafkaException as exc:
                raise KafkaUnavailable(f"seek {t}[{p}] to {o}: {exc}") from exc

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        out: list[Record] = []
        for msg in self._c.consume(max_records, timeout):
            err = msg.error()
            if err is None:
                out.append(record_of(msg))
            elif err.code() == KafkaError._PARTITION_EOF:
                continue
            elif err.fatal() or not err.retriable():
                if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                  KafkaError._UNKNOWN_PARTITION):
                    continue
                raise KafkaUnavailable(err.str())
        return out

    def poll_messages(self, max_records: int = 10000, timeout: float = 1.0) -> list[Message]:
        """confluent-kafka's own message objects (`.topic() .partition() .offset() .key()
        .value() .headers()`), errors already handled: for copy loops (the offset scans)
        that pass each record on and would only pay for building a Record."""
        out: list[Message] = []
        for msg in self._c.consume(max_records, timeout):
            err = msg.error()
            if err is None:
                out.append(msg)
            else:
                self._raise_unless_ignorable(err)
        return out

    def poll_columns(self, names: tuple[str, ...], max_records: int = 10000,
                     timeout: float = 1.0) -> Columns:
        """A lean `poll` for the hottest loops (the tracker's ingest): per record only
        partition, offset, key and the headers in ``names``, column-wise. The per-record
        accessors run as C-level `map`s and only the header scan is a Python loop."""
        msgs = self._c.consume(max_records, timeout)
        errors = list(map(Message.error, msgs))
        if errors.count(None) != len(errors):
            for err in errors:
                if err is not None:
                    self._raise_unless_ignorable(err)
            msgs = [m for m, e in zip(msgs, errors) if e is None]
        n = len(msgs)
        cols: list[list[bytes | None]] = [[None] * n for _ in names]
        slot = {name: cols[j] for j, name in enumerate(names)}.get
        for i, hdrs in enumerate(map(Message.headers, msgs)):
            for k, v in hdrs or ():
                col = slot(k)
                if col is not None:
                    col[i] = v
        return Columns(list(map(Message.partition, msgs)), list(map(Message.offset, msgs)),
                       list(map(Message.key, msgs)), cols)

    @staticmethod
    def _raise_unless_ignorable(err: KafkaError) -> None:
        if err.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART,
                          KafkaError._UNKNOWN_PARTITION):
            return
        if err.fatal() or not err.retriable():
            raise KafkaUnavailable(err.str())

    def committed(self, partitions: Iterable[tuple[str, int]],
                  timeout: float = 10.0) -> dict[tuple[str, int], int]:
        """The group's committed offsets (negative when none)."""
        try:
            tps = self._c.committed([TopicPartition(t, p) for t, p in partitions],
                                    timeout=timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(f"committed offsets: {exc}") from exc
        return {(tp.topic, tp.partition): tp.offset for tp in tps}

    def commit(self, offsets: Mapping[tuple[str, int], int],
               timeout: float = COMMIT_RETRY_S) -> None:
        """Commit `next offset to read` per (topic, partition), synchronously, within
        ``timeout`` seconds: a retriable refusal (the group coordinator still loading its
        offsets after a broker start, or moving) is tried again until then, and a commit
        still unanswered then raises KafkaUnavailable (librdkafka can keep a synchronous
        commit queued without end for a coordinator it never reconnects to; that one is
        left to finish on a daemon thread)."""
        if not offsets:
            return
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        deadline = time.monotonic() + timeout
        while True:
            try:
                if not run_within(lambda: self._c.commit(offsets=tps, asynchronous=False),
                                  max(0.0, deadline - time.monotonic()), "kafka-commit"):
                    raise KafkaUnavailable(
                        f"an offset commit was not answered within {timeout:.0f} s")
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                retriable = isinstance(err, KafkaError) and (
                    err.retriable() or err.code() in RETRIABLE_COMMIT)
                if not retriable or time.monotonic() > deadline:
                    raise KafkaUnavailable(str(exc)) from exc
            time.sleep(0.2)

    def commit_in_background(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit `next offset to read` per (topic, partition) without waiting for it, for
        a caller whose later commits cover a failed one. A synchronous commit can wait
        without end: after a broker restart, librdkafka may keep the request queued for a
        coordinator it never reconnects to."""
        if not offsets:
            return
        try:
            self._c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                           asynchronous=True)
        except KafkaException as exc:
            raise KafkaUnavailable(str(exc)) from exc

    def group_metadata(self) -> object:
        """The group's metadata, for a transaction that commits this consumer's offsets
        (`TransactionalProducer.commit`)."""
        return self._c.consumer_group_metadata()

    def assignment(self) -> list[tuple[str, int]]:
        return [(tp.topic, tp.partition) for tp in self._c.assignment()]

    def positions(self, partitions: Iterable[tuple[str, int]] | None = None
                  ) -> dict[tuple[str, int], int]:
        """The next offset to hand to the application, per partition of ``partitions``
        (default: every assigned one); negative when nothing was consumed yet."""
        tps = (self._c.assignment() if partitions is None
               else [TopicPartition(t, p) for t, p in partitions])
        return {(tp.topic, tp.partition): tp.offset for tp in self._c.position(tps)}

    def end_offsets(self, topic: str, partitions: Iterable[int],
                    timeout: float = 5.0) -> dict[int, int]:
        """The high watermark (next offset to be written) of `partitions`, asked of the
        broker now; KafkaUnavailable when it does not answer within `timeout`."""
        return {p: watermarks(self._c, topic, p, timeout)[1] for p in partitions}

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Leave the group (a rebalance callback may run) and free the client, within
        ``timeout_s`` (`close_within`)."""
        close_within(self._c, timeout_s)


def run_within(call: Callable[[], object], timeout_s: float, name: str) -> bool:
    """Run ``call`` on a daemon thread named ``name`` and wait at most ``timeout_s``: True
    once it returned (an error it raised is raised here), False while it still runs (it
    is left to finish in the background). For librdkafka calls that can wait without
    end on a group coordinator."""
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the caller below
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not done.wait(timeout_s):
        return False
    if failure:
        raise failure[0]
    return True


def close_within(client: _Consumer, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close a librdkafka consumer, waiting at most ``timeout_s``: librdkafka's close can
    wait without end for a group coordinator it keeps looking for. A close that takes
    longer is left to finish on a daemon thread (its client stays allocated until then),
    and logged; an error it raises in time is raised here."""
    if not run_within(client.close, timeout_s, "kafka-consumer-close"):
        log.warning("closing a Kafka consumer took over %.0f s (its group coordinator out of "
                    "reach?); left to finish in the background", timeout_s)


def next_offsets(records: Iterable[Record]) -> dict[tuple[str, int], int]:
    """The offsets to commit after handling records: last offset + 1 per partition."""
    out: dict[tuple[str, int], int] = {}
    for r in records:
        key = (r.topic, r.partition)
        if r.offset + 1 > out.get(key, -1):
            out[key] = r.offset + 1
    return out


# What a partition of a just-created topic answers until its leader is known everywhere.
_NO_LEADER_YET = frozenset((KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION))


def watermarks(c: _Consumer, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    """(low, high) watermark of one partition, asked through confluent-kafka consumer
    ``c``. A topic created a moment ago may not have a leader this client knows yet:
    retried until `timeout`, then KafkaUnavailable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
            return lo, hi
        except KafkaException as exc:
            err = exc.args[0]
            transient = err.retriable() or err.code() in _NO_LEADER_YET
            if not transient or time.monotonic() > deadline:
                raise KafkaUnavailable(f"{topic}[{partition}] watermarks: {err.str()}") from exc
            time.sleep(0.1)
