"""The one module that talks to Kafka: producer, consumer and admin helpers over
confluent-kafka (chosen over kafka-python by measurement: 499k vs 17.5k msg/s
produce here). Everything else in dwell sees `Record`, futures and plain dicts.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING as OFFSET_BEGINNING  # re-exported for callers
from confluent_kafka import Consumer as _Consumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Producer as _Producer
from confluent_kafka.admin import AdminClient, NewTopic

from dwell.core import topics as names

Headers = Mapping[str, bytes | str]
# (topic, value, key, encoded headers, timestamp ms) for Producer.send_many
OutRecord = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None, int | None]
# (partition, offset, key, [value of each requested header]) — see Consumer.poll_headers
HeaderRow = tuple[int, int, bytes | None, list[bytes | None]]


@dataclass(frozen=True, slots=True)
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


class KafkaUnavailable(Exception):
    """Kafka could not be reached or did not acknowledge in time (retriable)."""


class TopicRefused(Exception):
    """Kafka refuses to create a topic of this name, for good: typically it collides with
    an existing topic (Kafka treats '.' and '_' in topic names alike)."""


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int

    def header(self, name: str) -> str | None:
        raw = self.headers.get(name)
        return raw.decode() if raw is not None else None


def _record(msg: Message) -> Record:
    hdrs = msg.headers() or []
    ts_type, ts = msg.timestamp()
    return Record(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                  {k: (v if v is not None else b"") for k, v in hdrs}, ts)


def _encode_headers(headers: Headers | None) -> list[tuple[str, bytes]] | None:
    if not headers:
        return None
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in headers.items()]


# ---------------------------------------------------------------- producer


class Producer:
    """An idempotent, acks=all producer whose sends return futures of
    (partition, offset). A background thread serves delivery callbacks (unless
    `poll_in_background` is False: then `poll` and `flush` serve them, on the calling
    thread)."""

    def __init__(self, bootstrap: str, *, linger_ms: int = 5, poll_in_background: bool = True,
                 compression_type: str = "none", send_timeout_s: float | None = None,
                 **extra: Any) -> None:
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
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

        kwargs: dict[str, Any] = {"value": value, "key": key, "on_delivery": _done,
                                  "headers": _encode_headers(headers)}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        deadline = None
        while True:
            try:
                self._p.produce(topic, **kwargs)
                return fut
            except BufferError:
                deadline = self._wait_for_room(deadline)

    def send_many(self, records: Sequence[OutRecord]) -> Future[list[tuple[int, int]]]:
        """Send a batch; one future of every (partition, offset) in order, or the first
        error. Cheaper than `send` per record: no Future per message.
        Headers here are already encoded: a list of (name, bytes)."""
        fut: Future[list[tuple[int, int]]] = Future()

        def settle(out: list[tuple[int, int]] | None, exc: Exception | None) -> None:
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(out)  # type: ignore[arg-type]

        self.send_many_then(records, settle)
        return fut

    def send_many_then(self, records: Sequence[OutRecord],
                       settle: Callable[[list[tuple[int, int]] | None, Exception | None], None]
                       ) -> None:
        """Send a batch and call `settle(offsets, None)` once every record is acknowledged,
        or `settle(None, error)` at the first failure; exactly once, from the thread that
        serves delivery reports (the poll thread, `flush`, or `poll`'s caller). Raises
        KafkaUnavailable (and never settles) when the client refuses a record at once."""
        n = len(records)
        out: list[tuple[int, int]] = [(0, 0)] * n
        if n == 0:
            settle(out, None)
            return
        left = n

        # Called once per record, from C: as few Python operations as will do (a positional
        # partial, a closure counter) since this runs ~100k times a second under load.
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

        produce = self._p.produce
        partial = functools.partial
        for i, (topic, value, key, headers, ts) in enumerate(records):
            deadline = None
            while True:
                try:
                    if ts is None:
                        produce(topic, value, key, on_delivery=partial(_done, i),
                                headers=headers)
                    else:
                        produce(topic, value, key, on_delivery=partial(_done, i),
                                headers=headers, timestamp=ts)
                    break
                except BufferError:
                    deadline = self._wait_for_room(deadline)
                except KafkaException as exc:  # e.g. the topic was deleted meanwhile
                    # The records queued before this one may still land: the caller's
                    # retry can duplicate them, as after any unacknowledged send.
                    raise KafkaUnavailable(f"{topic}: {exc.args[0].str()}") from exc

    @property
    def polls_in_background(self) -> bool:
        return self._poller is not None

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports on this thread (a producer made with
        `poll_in_background=False`); the number served."""
        return int(self._p.poll(timeout))

    def send_unreported(self, records: Sequence[OutRecord]) -> None:
        """Queue records without a delivery report each, for callers that learn of
        failures otherwise: a transaction's `commit` (it raises if any record was not
        written; admission's result records) or `BulkProducer.flush`. Per-record
        callbacks would only cost time."""
        produce = self._p.produce
        for topic, value, key, headers, ts in records:
            deadline = None
            while True:
                try:
                    if ts is None:
                        produce(topic, value, key, headers=headers)
                    else:
                        produce(topic, value, key, headers=headers, timestamp=ts)
                    break
                except BufferError:
                    deadline = self._wait_for_room(deadline)

    def _wait_for_room(self, deadline: float | None) -> float:
        """The local queue is full: serve the delivery reports that empty it (unless the
        background thread does) and wait a moment; KafkaUnavailable once ``deadline``
        (set on the first call) has passed. Without a poll a producer that has no
        background thread never frees its queue: a send would wait forever."""
        now = time.monotonic()
        if deadline is None:
            deadline = now + self._send_timeout
        elif now > deadline:
            raise KafkaUnavailable(f"producer queue full for {self._send_timeout:.0f}s: "
                                   "Kafka is not taking records")
        if self._poller is None:
            self._p.poll(0.005)
        else:
            time.sleep(0.005)
        return deadline

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


# ---------------------------------------------------------------- consumer


class Consumer:
    """A group consumer with manual commits: callers commit only what they have
    durably handled, so a crash re-reads rather than loses."""

    def __init__(self, bootstrap: str, group_id: str, topics: Iterable[str] | None = None, *,
                 auto_offset_reset: str = "earliest", **extra: Any) -> None:
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
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
        them: otherwise the first fetch from one waited ~1 s for librdkafka to look it up
        (measured: 950-1,000 ms for a source new to the drain's reader, 2-56 ms with
        this)."""
        for t in set(topics) - self._learned:
            try:
                self._c.list_topics(t, timeout=timeout)
            except KafkaException as exc:
                raise KafkaUnavailable(f"metadata of {t}: {exc}") from exc
            self._learned.add(t)

    def unassign(self) -> None:
        """Drop the assignment and whatever was fetched for it."""
        self._c.unassign()

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        out: list[Record] = []
        for msg in self._c.consume(max_records, timeout):
            err = msg.error()
            if err is None:
                out.append(_record(msg))
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
        .value() .headers()`), errors already handled: for copy loops (the drain) where
        building a Record per message was measured at 60% of a round."""
        out: list[Message] = []
        for msg in self._c.consume(max_records, timeout):
            err = msg.error()
            if err is None:
                out.append(msg)
            else:
                self._raise_unless_ignorable(err)
        return out

    def committed(self, partitions: Iterable[tuple[str, int]],
                  timeout: float = 10.0) -> dict[tuple[str, int], int]:
        """The group's committed offsets (negative when none)."""
        try:
            tps = self._c.committed([TopicPartition(t, p) for t, p in partitions],
                                    timeout=timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(f"committed offsets: {exc}") from exc
        return {(tp.topic, tp.partition): tp.offset for tp in tps}

    def poll_headers(self, names: tuple[str, ...], max_records: int = 10000,
                     timeout: float = 1.0) -> list[HeaderRow]:
        """A lean `poll` for hot loops (the tracker's ingest): per record only
        `(partition, offset, key, [value of each header in names])`, no Record objects."""
        out: list[HeaderRow] = []
        for msg in self._c.consume(max_records, timeout):
            if msg.error() is not None:
                self._raise_unless_ignorable(msg.error())
                continue
            found: list[bytes | None] = [None] * len(names)
            for k, v in msg.headers() or ():
                if k in names:
                    found[names.index(k)] = v
            out.append((msg.partition(), msg.offset(), msg.key(), found))
        return out

    def poll_columns(self, names: tuple[str, ...], max_records: int = 10000,
                     timeout: float = 1.0) -> Columns:
        """`poll_headers` column-wise, for the hottest loops (the tracker's ingest): the
        per-record accessors run as C-level `map`s and only the header scan is a Python
        loop, ~2x cheaper per record than building a row per record."""
        msgs = self._c.consume(max_records, timeout)
        errors = list(map(Message.error, msgs))
        if errors.count(None) != len(errors):
            for err in errors:
                if err is not None:
                    self._raise_unless_ignorable(err)
            msgs = [m for m, e in zip(msgs, errors, strict=True) if e is None]
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

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit `next offset to read` per (topic, partition), synchronously."""
        if not offsets:
            return
        try:
            self._c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                           asynchronous=False)
        except KafkaException as exc:
            raise KafkaUnavailable(str(exc)) from exc

    def assignment(self) -> list[tuple[str, int]]:
        return [(tp.topic, tp.partition) for tp in self._c.assignment()]

    def positions(self) -> dict[tuple[str, int], int]:
        """The next offset to hand to the application, per assigned partition (negative
        when nothing was consumed yet)."""
        return {(tp.topic, tp.partition): tp.offset
                for tp in self._c.position(self._c.assignment())}

    def end_offsets(self, topic: str, partitions: Iterable[int],
                    timeout: float = 5.0) -> dict[int, int]:
        """The high watermark (next offset to be written) of `partitions`, asked of the
        broker now; KafkaUnavailable when it does not answer within `timeout`."""
        return {p: _watermarks(self._c, topic, p, timeout)[1] for p in partitions}

    def close(self) -> None:
        self._c.close()


def next_offsets(records: Iterable[Record]) -> dict[tuple[str, int], int]:
    """The offsets to commit after handling records: last offset + 1 per partition."""
    out: dict[tuple[str, int], int] = {}
    for r in records:
        key = (r.topic, r.partition)
        if r.offset + 1 > out.get(key, -1):
            out[key] = r.offset + 1
    return out


# ---------------------------------------------------------------- admin


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap,
                        "socket.connection.setup.timeout.ms": 5000})


def ping(bootstrap: str, timeout: float = 2.0) -> bool:
    try:
        return bool(admin(bootstrap).list_topics(timeout=timeout).brokers)
    except KafkaException:
        return False


def ensure_topic(bootstrap: str, name: str, partitions: int = 1, replication: int = 1,
                 config: Mapping[str, str] | None = None, timeout: float = 15.0) -> bool:
    """Create a topic unless it exists; True when this call created it. An existing topic
    is taken as it is (its partition count is not checked against ``partitions``).
    TopicRefused when Kafka refuses the name, KafkaUnavailable when it cannot answer."""
    client = admin(bootstrap)
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication,
                  config=dict(config or {}))], operation_timeout=timeout)
    try:
        futures[name].result(timeout)
        created = True
    except KafkaException as exc:
        code = exc.args[0].code()
        if code == KafkaError.TOPIC_EXCEPTION:
            raise TopicRefused(exc.args[0].str()) from exc
        if code != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaUnavailable(f"cannot create topic {name}: {exc}") from exc
        created = False
    # Metadata for a new topic reaches every client a moment later.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = client.list_topics(name, timeout=timeout)
        t = md.topics.get(name)
        if t is not None and t.error is None and (
                not created or len(t.partitions) >= partitions):
            return created
        time.sleep(0.05)
    raise KafkaUnavailable(f"topic {name} not visible after {timeout}s")


DWELL_TOPIC_DEFAULTS: dict[str, tuple[int, dict[str, str]]] = {
    names.POLICIES: (1, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                         "segment.ms": "3600000"}),
    names.PUBLISH: (4, {}),
    names.PUBLISH_RESULTS: (4, {}),
    names.DELAYED: (4, {}),
    names.REFILED: (4, {}),
    names.ACKS: (4, {}),
    names.DELIVERED: (4, {}),
}


def ensure_dwell_topics(bootstrap: str, replication: int = 1,
                        partitions: Mapping[str, int] | None = None) -> None:
    for name, (default_parts, config) in DWELL_TOPIC_DEFAULTS.items():
        parts = (partitions or {}).get(name, default_parts)
        ensure_topic(bootstrap, name, parts, replication, config)


def read_all(bootstrap: str, topic: str, timeout: float = 30.0) -> list[Record]:
    """Every record of a topic from the beginning to its current end, without a group
    (admission replays the compacted policy feed this way)."""
    return read_from(bootstrap, topic, {}, timeout)


# ---------------------------------------------------------------- transactions (admission)
# Added for admission's Kafka ingress: consume-transform-produce with exactly-once
# (KIP-447: the input offsets commit in the same transaction as the outputs).


def topic_names(bootstrap: str, timeout: float = 15.0) -> set[str]:
    """Every topic the cluster has (one metadata request)."""
    try:
        return set(admin(bootstrap).list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise KafkaUnavailable(f"list_topics: {exc}") from exc


def partitions(bootstrap: str, topic: str, timeout: float = 15.0) -> list[int]:
    """The partition ids of an existing topic; KafkaUnavailable when it is not there."""
    md = admin(bootstrap).list_topics(topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise KafkaUnavailable(f"topic {topic} not found")
    return sorted(t.partitions)


# What a partition of a just-created topic answers until its leader is known everywhere.
_NO_LEADER_YET = frozenset((KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION))


def _watermarks(c: _Consumer, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    """(low, high) watermark of one partition. A topic created a moment ago may not have
    a leader this client knows yet: retried until `timeout`, then KafkaUnavailable."""
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


def end_offsets(bootstrap: str, topic: str, timeout: float = 15.0) -> dict[int, int]:
    """The high watermark (next offset to be written) of every partition of a topic."""
    c = _Consumer({"bootstrap.servers": bootstrap, "group.id": "dwell-reader"})
    try:
        return {p: _watermarks(c, topic, p, timeout)[1]
                for p in partitions(bootstrap, topic, timeout)}
    finally:
        c.close()


def start_group_at_end(bootstrap: str, group_id: str, topics: Iterable[str]) -> None:
    """Commit the current end offsets of ``topics`` (created when missing) for a fresh
    consumer group, so that it reads only what is written from now on."""
    c = Consumer(bootstrap, group_id)
    try:
        offsets: dict[tuple[str, int], int] = {}
        for t in topics:
            ensure_topic(bootstrap, t, DWELL_TOPIC_DEFAULTS.get(t, (1, {}))[0])
            offsets |= {(t, p): o for p, o in end_offsets(bootstrap, t).items()}
        c.commit(offsets)
    finally:
        c.close()


def read_from(bootstrap: str, topic: str, starts: Mapping[int, int],
              timeout: float = 30.0) -> list[Record]:
    """Every committed record of a topic from `starts` (offset per partition; partitions
    not named start at the beginning) to the end offsets at the time of the call, read
    with read_committed and without a group (tests check exactly-once outputs this way)."""
    c = _Consumer({"bootstrap.servers": bootstrap, "group.id": "dwell-reader",
                   "enable.auto.commit": False, "isolation.level": "read_committed",
                   "fetch.wait.max.ms": 50})
    try:
        marks = {p: _watermarks(c, topic, p, timeout)
                 for p in partitions(bootstrap, topic, timeout)}
        ends = {p: hi for p, (_, hi) in marks.items()}
        # A compacted or expired log may start above 0: begin at its first offset.
        begin = {p: max(starts.get(p, lo), lo) for p, (lo, _) in marks.items()}
        pending = {p for p, end in ends.items() if end > begin[p]}
        if not pending:
            return []
        c.assign([TopicPartition(topic, p, begin[p]) for p in pending])
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"reading {topic} timed out")
            for msg in c.consume(1000, 0.2):
                if msg.error() is None and msg.offset() < ends[msg.partition()]:
                    out.append(_record(msg))
            # Transaction markers leave gaps: compare the position with the end.
            for tp in c.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        return out
    finally:
        c.close()


# A consumer that reads known offset ranges as fast as the broker serves them (the drain's
# copies, the tracker's restage): large fetches, no waiting for more records, and the next
# fetch not postponed when the local queue is full (librdkafka's fetch.queue.backoff.ms
# defaults to 1 s: a scan of a few hundred MB slowed to ~45k records/s).
SCAN_CONFIG: Mapping[str, Any] = {
    "fetch.wait.max.ms": 10, "fetch.error.backoff.ms": 10, "fetch.queue.backoff.ms": 1,
    "max.partition.fetch.bytes": 16 << 20, "fetch.max.bytes": 64 << 20,
    "queued.max.messages.kbytes": 32 << 10, "queued.min.messages": 20000,
    "enable.partition.eof": False}


def read_offsets(consumer: Consumer, topic: str, wanted: Mapping[int, Sequence[int]],
                 max_gap: int, timeout: float = 60.0) -> Iterator[Message]:
    """The records at ``wanted`` offsets (sorted, per partition) of ``topic``, as
    confluent-kafka messages, partitions read side by side. Offsets at most ``max_gap``
    apart are read in one pass (reading past a few unwanted records costs less than a
    seek, which costs a fetch round trip); farther ones are sought. An offset with no
    record (a transaction marker, an aborted or expired record) is passed over.
    KafkaUnavailable when the whole read takes longer than ``timeout`` s."""
    todo: dict[int, list[tuple[int, int]]] = {}  # partition -> spans (first, last) left
    for p, offs in wanted.items():
        spans: list[tuple[int, int]] = []
        for o in offs:
            if spans and o - spans[-1][1] <= max_gap:
                spans[-1] = (spans[-1][0], int(o))
            else:
                spans.append((int(o), int(o)))
        if spans:
            todo[p] = spans[::-1]  # popped from the end
    if not todo:
        return
    members = {p: frozenset(int(o) for o in offs) for p, offs in wanted.items()}
    consumer.learn([topic])
    c = consumer._c
    c.assign([TopicPartition(topic, p, spans[-1][0]) for p, spans in todo.items()])
    expect = {p: spans[-1][0] for p, spans in todo.items()}
    deadline = time.monotonic() + timeout

    def advance(p: int) -> None:
        todo[p].pop()
        if todo[p]:
            expect[p] = todo[p][-1][0]
            c.seek(TopicPartition(topic, p, expect[p]))
        else:
            del todo[p]

    try:
        while todo:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"reading {topic} timed out: " + ", ".join(
                    f"[{p}] {expect[p]}..{spans[-1][1]}" for p, spans in todo.items()))
            # Ask for what the current spans still hold: consume() returns as soon as
            # it has that many, where a larger ask waits out its timeout.
            left = sum(spans[-1][1] - expect[p] + 1 for p, spans in todo.items())
            msgs = c.consume(max(1, min(left, 100000)), 0.2)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    consumer._raise_unless_ignorable(err)
                    continue
                p, off = msg.partition(), msg.offset()
                if p not in todo or off < expect[p]:
                    continue  # fetched before a seek, or past a finished partition
                expect[p] = off + 1
                if off in members[p]:
                    yield msg
                if off >= todo[p][-1][1]:
                    advance(p)
            if not msgs:
                # Markers or aborted records at a span's end leave no message to see.
                for tp in c.position([TopicPartition(topic, p) for p in todo]):
                    if tp.offset > todo[tp.partition][-1][1]:
                        advance(tp.partition)
    finally:
        c.unassign()


def seek(consumer: Consumer, offsets: Mapping[tuple[str, int], int]) -> None:
    """Move an assigned consumer back (or on) to `offset` per (topic, partition)."""
    for (t, p), o in offsets.items():
        try:
            consumer._c.seek(TopicPartition(t, p, o))
        except KafkaException as exc:
            raise KafkaUnavailable(f"seek {t}[{p}] to {o}: {exc}") from exc


class TransactionalProducer(Producer):
    """A producer whose sends belong to transactions; `commit` also commits a consumer's
    offsets, so outputs and input progress become visible together or not at all."""

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
                    consumer._c.consumer_group_metadata(), self._timeout)
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
