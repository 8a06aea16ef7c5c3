"""The backoff job: reads consumers' events on dwell.acks (Spark's Kafka source) in one
pass per partition, with no shuffle and no Spark state. Each Arrow batch of a partition is
checked (dwell_spark.invalid: malformed events go to dwell.invalid from the same pass),
decided and written to Redis by the Python worker that reads it, so the work spreads over
the executors by partitions of dwell.acks. A worker decides each batch while its writer
thread writes the one before (the wait for Redis and for the JVM's next batch overlap):
one batch's writes at a time, in order, the next one deciding on the pending entries the
one being written leaves.

The redelivery index does the timing, not Spark: when the job reads a `delivered` event
with an ack timeout, or a `nack`, it writes the future redelivery into the subscription's
redelivery index at its absolute due time, computed by dwell.core.backoff from the event's
own timestamps (PIP-130 / PIP-106); the drain claims it once its bucket has passed (never
early). An `ack` (or a later event that supersedes it) takes the pending entry out of the
index again; once the drain has claimed its bucket that is a no-op: the redelivery
happened, as in Pulsar. So a micro-batch's latency does not add to the redelivery gaps as
long as it stays below the delay.

What a later event must cancel is kept beside the index, in the subscription's pending
hash (keys.sub_pending: messageId -> due time, bucket, stored count), read for a batch's
messages in one HMGET per subscription and written with the batch's index changes. The
redelivery count rides on each event (the SDK counts redeliveries), so nothing else is
remembered. The drain deletes a message's entry once it claimed its bucket; an entry
left past its due time by more than backoff_state_grace_ms is treated as gone.

Order: a subscription's events are keyed `<topic>/<subscription>` on dwell.acks
(docs/architecture.md), so they sit in one partition, read in offset order; within a
batch each subscription's events are taken by their `ts` (ties keep their order).

Dead letters (Pulsar's DeadLetterPolicy, after maxRedeliverCount redeliveries): an
unacked delivery past the limit goes into the redelivery index like a redelivery
(``dead``: its count stored as -(count + 1)), and the drain sends it to the DLQ instead of
the retry topic once its ack timeout (plus backoff) has run out; an ack before then takes
it out again. A nack past the limit is indexed the same way, due at once.

The subscription settings ride on each event (the SDK copies what it registered at the
tracker), so SDK events need no lookup. An event without them (``ackTimeoutMs`` absent: a
plain Kafka consumer that registered its subscription over the tracker's HTTP API) takes
them from the tracker's subscription registry in Redis, cached per Python worker for
backoff_registry_ttl_ms.

Replays after a crash are skipped: Redis keeps, per partition of dwell.acks, the offset
below which it holds every event's decisions (keys.BACKOFF_APPLIED), moved after each
batch's writes; a batch replayed from before it skips what is below it, and a batch that
failed half-way is harmless to apply again (index adds are set unions, removes of what is
gone are no-ops, counts are written, not incremented). When Redis lost the indexes,
dwell_spark.recovery rebuilds them by replaying dwell.acks."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
import pyarrow as pa
import redis as redislib
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from dwell import headers as hdr
from dwell import keys, memory
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.cache import ExpiringCache
from dwell.core import invalid as invalid_core
from dwell.core import subscriptions as subs
from dwell.core import topics as names
from dwell.core.subscriptions import SubscriptionSettings
from dwell.index import subscriptions as registry
from dwell.index.bucket_index import scripts as index_scripts
from dwell.index.redelivery import PendingEntry, SubscriptionIndex
from dwell.security import spark_kafka_options

from . import invalid, metrics, recovery
from .decisions import (
    ACK,
    CANCEL,
    DEAD,
    SCHEDULE,
    Decision,
    Event,
    decide_or_fail,
    fill_settings,
)
from .settings import SparkSettings

log = logging.getLogger("dwell.spark.backoff")

# Where the backoff query checkpoints, under spark_checkpoint_dir.
CHECKPOINT: Final = "backoff-stream"
# Where earlier versions checkpointed, with a state this one does not keep: an app that
# finds one deletes it (drop_old_checkpoints).
OLD_CHECKPOINTS: Final = ("backoff", "backoff-shards", "acks-invalid")
# The columns of dwell.acks the pass reads (the Kafka source's, the record timestamp in
# ms and the `dwell-authorization` header values).
SOURCE_COLUMNS: Final = ("partition", "offset", "ts", "tsType", "key", "value", "auths")
# One row per Arrow batch the pass worked on: what the driver logs, counts and watches.
SUMMARY_SCHEMA: Final = StructType([
    StructField("partition", IntegerType()),
    StructField("next", LongType()),  # the offset after the batch's last record
    # the broker timestamp of the batch's last record: every event before it is applied
    StructField("last_ts", LongType()),
    StructField("events", LongType()),  # records read (those below the marker skipped)
    StructField("decisions", LongType()),
    StructField("lead", LongType()),  # earliest scheduled due time minus now, ms
    # kind -> how many records went to dwell.invalid (JSON), and the first one's reason
    StructField("invalid", StringType()),
    StructField("reason", StringType()),
    StructField("retries", LongType()),
    # Redis had no marker: nothing was written, the driver rebuilds
    StructField("lost", BooleanType()),
    StructField("decide_ms", DoubleType()),
    StructField("write_ms", DoubleType()),
])
DEFAULT_TICK_MS: Final = SparkSettings.model_fields["redelivery_tick_ms"].default
DEFAULT_GRACE_MS: Final = SparkSettings.model_fields["backoff_state_grace_ms"].default
DEFAULT_REGISTRY_TTL_MS: Final = SparkSettings.model_fields["backoff_registry_ttl_ms"].default

# The app's own event on dwell.acks at start (an ack of nothing): it makes an idle query
# run a first micro-batch, at which the query says "backoff ready".
WARM_UP_TOPIC = "persistent://dwell/system/backoff-warm-up"
# Topics of events the app sends itself, in the reserved tenant no user topic can have.
SYSTEM_TOPICS: Final = frozenset({WARM_UP_TOPIC})
WARM_UP_RESEND_S = 5.0
# Logged once the query's first micro-batch is written: from then on an event waits for
# no start-up work (tests and benchmarks wait for it before timing anything).
FIRST_BATCH_DONE: Final = "backoff first batch done"

# Per Python worker (workers are reused across batches): the registry reads.
_registered: ExpiringCache[tuple[str, str, str], SubscriptionSettings | None] = ExpiringCache()


@dataclass(frozen=True)
class RegistryLookup:
    """``lookup(topic, sub)``: the subscription's registered settings (the tracker's
    ``dwell:subs:{topic}`` hash), or None. Pickles as its URL, so it ships to executors;
    the client and the cache live in the worker's module state."""

    redis_url: str
    ttl_ms: int = DEFAULT_REGISTRY_TTL_MS

    def __call__(self, topic: str, sub: str) -> SubscriptionSettings | None:
        return _registered.get((self.redis_url, topic, sub), self.ttl_ms, lambda: registry.get(
            redis_adapter.shared(self.redis_url), topic, sub))


# An index entry: (sourceKafkaTopic, partition, offset, bucket).
Entry = tuple[str, int, int, int]


@dataclass
class Changes:
    """One subscription's net changes from a batch of decisions: entries to drop (from
    earlier batches), entries to add (with their due time), and counts to store (None:
    forget). A cancel of an entry added earlier in the same batch drops the add."""

    removes: set[Entry] = field(default_factory=set)
    adds: dict[Entry, int] = field(default_factory=dict)
    counts: dict[str, int | None] = field(default_factory=dict)

    def fold(self, decisions: Sequence[Decision]) -> None:
        for mid, action, at, bucket, count in decisions:
            if action == ACK:
                self.counts[mid] = None
                continue
            # The id passed the event check (parse_message_id): its two numbers are digits.
            source, partition, offset = mid.rsplit(":", 2)
            entry = (source, int(partition), int(offset), int(bucket or 0))
            if action == CANCEL:
                if self.adds.pop(entry, None) is None:
                    self.removes.add(entry)
            else:
                # A dead letter's count is stored as -(count + 1), which tells the drain
                # to send it to the DLQ (drain.redelivery_ranges).
                self.counts[mid] = count if action == SCHEDULE else -count - 1
                self.adds[entry] = at

    def write(self, idx: SubscriptionIndex, tick_ms: int) -> None:
        """Cancels before anything else (a cancelled entry the drain claims meanwhile is
        redelivered, as in Pulsar); counts before the entries the drain reads them for."""
        by_bucket: dict[int, list[tuple[str, int, int]]] = {}
        for src, part, off, bucket in self.removes:
            by_bucket.setdefault(bucket, []).append((src, part, off))
        for bucket, positions in by_bucket.items():
            idx.remove_many(bucket, positions)
        idx.forget(*(mid for mid, c in self.counts.items() if c is None))
        idx.store_counts({mid: c for mid, c in self.counts.items() if c is not None})
        idx.add([(src, part, off, at) for (src, part, off, _), at in self.adds.items()],
                tick_ms)


@dataclass
class Decided:
    """What a batch's events call for, before anything is written: per subscription its
    decisions and the pending entries they leave, and the events set aside (kind, reason,
    partition, offset, key, value)."""

    decisions: dict[tuple[str, str], list[Decision]] = field(default_factory=dict)
    pending: dict[tuple[str, str], dict[str, PendingEntry | None]] = field(
        default_factory=dict)
    aside: list[tuple[str, str, int, int, bytes | None, bytes | None]] = field(
        default_factory=list)
    events: int = 0

    def lead_ms(self, now_ms: int) -> int | None:
        dues = [d[2] for ds in self.decisions.values() for d in ds if d[1] in (SCHEDULE, DEAD)]
        return min(dues) - now_ms if dues else None


# Pending entries of a batch's subscriptions, messageId -> entry, read before deciding.
PendingReader = Callable[[str, str, list[str]], dict[str, PendingEntry]]


@dataclass(frozen=True)
class Pass:
    """The work on dwell.acks records: checks, decisions, and (``__call__``, the function
    mapInArrow runs on each partition) the writes. Pickles as its settings, so it ships to
    the executors; clients live in the worker's module state."""

    redis_url: str
    bootstrap: str
    compression_type: str
    tick_ms: int
    grace_ms: int
    max_bytes: int
    write_timeout_s: float
    auth: invalid.AckAuth | None
    subscriptions: invalid.SubscriptionCheck
    lookup: RegistryLookup

    @classmethod
    def of(cls, settings: SparkSettings) -> Pass:
        return cls(settings.redis_url, settings.kafka_bootstrap,
                   settings.kafka_compression_type, settings.redelivery_tick_ms,
                   settings.backoff_state_grace_ms, settings.acks_max_event_bytes,
                   settings.backoff_write_timeout_ms / 1000, invalid.AckAuth.of(settings),
                   invalid.SubscriptionCheck.of(settings),
                   RegistryLookup(settings.redis_url, settings.backoff_registry_ttl_ms))

    def decide(self, cols: Mapping[str, Sequence[Any]], read_pending: PendingReader,
               now_ms: int) -> Decided:
        """Check and decide the records in ``cols`` (SOURCE_COLUMNS, in offset order);
        ``read_pending`` supplies what is pending for a subscription's messages."""
        out = Decided()
        checked = invalid.check_records(cols["value"], cols["auths"], self.max_bytes,
                                        SYSTEM_TOPICS, self.auth, cols["ts"], cols["tsType"],
                                        self.subscriptions)
        by_sub: dict[tuple[str, str], list[tuple[int, Event]]] = {}
        for i, (kind, reason, doc) in enumerate(checked):
            if doc is None:
                out.aside.append((kind or invalid_core.FIELD, reason or "",
                                  cols["partition"][i], cols["offset"][i], cols["key"][i],
                                  cols["value"][i]))
                continue
            if doc["topic"] in SYSTEM_TOPICS:
                continue
            # A delivery without an ack timeout schedules nothing and changes nothing.
            if doc["event"] == "delivered" and doc.get(subs.ACK_TIMEOUT_MS) == 0:
                continue
            by_sub.setdefault((doc["topic"], doc["subscription"]), []).append((i, doc))
        for (topic, sub), rows in by_sub.items():
            events = [doc for _, doc in rows]
            if any(ev.get(subs.ACK_TIMEOUT_MS) is None for ev in events):
                events = fill_settings(events, self.lookup(topic, sub))
            order = sorted(range(len(events)), key=[ev["ts"] for ev in events].__getitem__)
            mids = list(dict.fromkeys(ev["messageId"] for ev in events))
            read = read_pending(topic, sub, mids)
            live = {mid: e for mid, e in read.items() if e[0] + self.grace_ms > now_ms}
            pending = dict(live)
            decisions: list[Decision] = []
            for k in order:
                ev = events[k]
                why = decide_or_fail(ev, pending, decisions, self.tick_ms)
                if why is not None:
                    i = rows[k][0]
                    out.aside.append((invalid_core.FAILED, why, cols["partition"][i],
                                      cols["offset"][i], cols["key"][i], cols["value"][i]))
            out.events += len(events)
            if decisions:
                out.decisions[(topic, sub)] = decisions
            # The entries that changed (None: delete it; a stale one read goes too).
            changed = {mid: pending.get(mid) for mid in mids
                       if pending.get(mid) != read.get(mid)}
            if changed or decisions:
                out.pending[(topic, sub)] = changed
        return out

    def read_pending(self, topic: str, sub: str, mids: list[str]) -> dict[str, PendingEntry]:
        idx = SubscriptionIndex(redis_adapter.shared(self.redis_url), topic, sub)
        return {mid: e for mid, e in zip(mids, idx.pending(mids), strict=True)
                if e is not None}

    def write(self, decided: Decided) -> None:
        """A batch's decisions into Redis (idempotent: a failed try is tried again whole)."""
        r = redis_adapter.shared(self.redis_url)
        for (topic, sub), touched in decided.pending.items():
            idx = SubscriptionIndex(r, topic, sub)
            ch = Changes()
            ch.fold(decided.decisions.get((topic, sub), ()))
            ch.write(idx, self.tick_ms)
            # Last: a replay after a crash before it finds the old entries and cancels them.
            idx.write_pending(touched)

    def set_aside(self, decided: Decided) -> None:
        if not decided.aside:
            return
        p = _producer(self.bootstrap, self.compression_type)
        futures = []
        for kind, reason, part, off, key, value in decided.aside:
            topic, v, k, headers, _ = invalid_core.invalid_record(
                names.ACKS, int(part), int(off), key, value, kind, reason)
            futures.append(p.send(topic, v, k, dict(headers)))
        for f in futures:
            f.result(30)

    def run(self, cols: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
        """One Arrow batch of one partition: skip what Redis already holds, decide, write,
        move the marker; each step tried again while Redis or Kafka does not answer (a
        try that failed half-way is harmless to repeat). Its SUMMARY_SCHEMA row."""
        return self.commit(self.prepare(cols))

    def prepare(self, cols: Mapping[str, Sequence[Any]],
                unwritten: Mapping[tuple[str, str], Mapping[str, PendingEntry | None]]
                | None = None) -> Prepared:
        """Skip what Redis already holds and decide the rest, tried again while Redis does
        not answer. ``unwritten``: the pending entries a batch decided before this one
        leaves, per subscription, while its writes may still be under way; they stand in
        for what Redis holds of those messages."""
        part = int(cols["partition"][0])
        done: list[Prepared] = []
        tries = write_retrying(lambda: done.append(self._prepare(part, cols, unwritten or {})),
                               self.write_timeout_s, part)
        done[-1].summary["retries"] = tries - 1
        return done[-1]

    def _prepare(self, part: int, cols: Mapping[str, Sequence[Any]],
                 unwritten: Mapping[tuple[str, str], Mapping[str, PendingEntry | None]]
                 ) -> Prepared:
        r = redis_adapter.shared(self.redis_url)
        # The drain trusts last_ts to say how far this partition is read (IndexKeeper's
        # read_to): only a broker's timestamp does; a producer's (dwell.acks made without
        # LogAppendTime) says nothing, and 0 holds redeliveries until the backoff is level.
        last_ts = (int(cols["ts"][-1])
                   if int(cols["tsType"][-1]) == invalid.LOG_APPEND_TIME else 0)
        summary: dict[str, Any] = {"partition": part, "next": int(cols["offset"][-1]) + 1,
                                   "last_ts": last_ts,
                                   "events": 0, "decisions": 0, "lead": None,
                                   "invalid": None, "reason": None, "retries": 0,
                                   "lost": False, "decide_ms": 0.0, "write_ms": 0.0}
        pipe = r.pipeline(transaction=False)
        pipe.exists(keys.BACKOFF_APPLIED)
        pipe.hget(keys.BACKOFF_APPLIED, part)
        exists, applied = pipe.execute()
        if not exists:
            summary["lost"] = True
            return Prepared(part, summary, None)
        # A marker read while an earlier batch's writes are under way is at most behind:
        # it only ever moves past that batch, whose offsets are all below this one's.
        start = int(applied or 0)
        first = next((i for i, o in enumerate(cols["offset"]) if o >= start), None)
        if first is None:
            return Prepared(part, summary, None)
        if first:
            cols = {k: v[first:] for k, v in cols.items()}
        started = time.monotonic()

        def read_pending(topic: str, sub: str, mids: list[str]) -> dict[str, PendingEntry]:
            got = self.read_pending(topic, sub, mids)
            for mid, entry in unwritten.get((topic, sub), {}).items():
                if entry is None:
                    got.pop(mid, None)
                else:
                    got[mid] = entry
            return got

        decided = self.decide(cols, read_pending, int(time.time() * 1000))
        summary["decide_ms"] = (time.monotonic() - started) * 1000
        return Prepared(part, summary, decided)

    def commit(self, prepared: Prepared) -> dict[str, Any]:
        """Write what ``prepared`` decided and move the partition's marker past it, tried
        again while Redis or Kafka does not answer. Its SUMMARY_SCHEMA row."""
        summary, decided = prepared.summary, prepared.decided
        if decided is None:
            return summary
        started = time.monotonic()
        moved: list[int] = []
        tries = write_retrying(lambda: moved.append(self._commit(prepared.part, decided,
                                                                  summary["next"])),
                               self.write_timeout_s, prepared.part)
        kinds: dict[str, int] = {}
        for kind, *_ in decided.aside:
            kinds[kind] = kinds.get(kind, 0) + 1
        return summary | {
            "events": decided.events,
            "decisions": sum(map(len, decided.decisions.values())),
            "lead": decided.lead_ms(int(time.time() * 1000)),
            "invalid": json.dumps(kinds) if kinds else None,
            "reason": decided.aside[0][1] if decided.aside else None,
            "retries": summary["retries"] + tries - 1,
            "lost": moved[-1] == 0, "write_ms": (time.monotonic() - started) * 1000}

    def _commit(self, part: int, decided: Decided, after: int) -> int:
        self.set_aside(decided)
        self.write(decided)
        return int(index_scripts(redis_adapter.shared(self.redis_url)).run(
            "applied", [keys.BACKOFF_APPLIED], [part, after]))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """mapInArrow's function: each batch decided while the one before it is written
        (on the worker's writer thread), so the wait for Redis and for the next batch from
        the JVM overlap. One batch's writes at a time, in order; the next one decides on
        the pending entries the one being written leaves."""
        writing: tuple[Future[dict[str, Any]], Prepared] | None = None
        try:
            for batch in batches:
                if not batch.num_rows:
                    continue
                # A batch makes a few objects per record and no cycles: the cyclic
                # collector would only scan them again and again (a third of the time).
                with memory.cycles_paused():
                    unwritten = ({} if writing is None or writing[1].decided is None
                                 else writing[1].decided.pending)
                    prepared = self.prepare(batch.to_pydict(), unwritten)
                if writing is not None:
                    yield _summary_batch(writing[0].result())
                writing = (_writer().submit(self._commit_paused, prepared), prepared)
            if writing is not None:
                yield _summary_batch(writing[0].result())
                writing = None
        finally:
            # Failed or closed early: the batch being written finishes first, so a retry
            # of the task never writes beside it.
            if writing is not None:
                wait([writing[0]])

    def _commit_paused(self, prepared: Prepared) -> dict[str, Any]:
        with memory.cycles_paused():
            return self.commit(prepared)


@dataclass
class Prepared:
    """A batch of one partition decided and not yet written: its summary so far, and what
    it decided (None: nothing to write, as Redis lost its marker or holds the batch)."""

    part: int
    summary: dict[str, Any]
    decided: Decided | None


def _summary_batch(row: dict[str, Any]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([row], schema=_SUMMARY_ARROW)


# Per Python worker: the thread that writes the batches' decisions (one at a time).
_writers: list[ThreadPoolExecutor] = []
_writers_lock = threading.Lock()


def _writer() -> ThreadPoolExecutor:
    with _writers_lock:
        if not _writers:
            _writers.append(ThreadPoolExecutor(1, thread_name_prefix="backoff-writer"))
        return _writers[0]


_SUMMARY_ARROW: Final = pa.schema([
    pa.field("partition", pa.int32()), pa.field("next", pa.int64()),
    pa.field("last_ts", pa.int64()),
    pa.field("events", pa.int64()), pa.field("decisions", pa.int64()),
    pa.field("lead", pa.int64()), pa.field("invalid", pa.string()),
    pa.field("reason", pa.string()), pa.field("retries", pa.int64()),
    pa.field("lost", pa.bool_()), pa.field("decide_ms", pa.float64()),
    pa.field("write_ms", pa.float64())])

# Per Python worker: one producer for the records set aside.
_producers: dict[tuple[str, str], kafka.Producer] = {}
_producers_lock = threading.Lock()


def _producer(bootstrap: str, compression_type: str) -> kafka.Producer:
    with _producers_lock:
        p = _producers.get((bootstrap, compression_type))
        if p is None:
            p = _producers[(bootstrap, compression_type)] = kafka.Producer(
                bootstrap, linger_ms=0, compression_type=compression_type)
        return p


def send_warm_up(p: kafka.Producer) -> None:
    """One warm-up event on dwell.acks; it also makes an idle query run a micro-batch."""
    body = {"event": ACK, "topic": WARM_UP_TOPIC, "subscription": "warm-up",
            "messageId": "dwell.delayed:0:0", "ts": int(time.time() * 1000)}
    p.send(names.ACKS, orjson.dumps(body), key=f"{WARM_UP_TOPIC}/warm-up".encode()).result(10)


def warm_up(bootstrap: str, done: threading.Event, compression_type: str = "none") -> None:
    """Send the warm-up event until a micro-batch has run: one sent before the query has
    fixed its starting offsets is never read."""
    p = kafka.Producer(bootstrap, linger_ms=0, compression_type=compression_type)
    try:
        while not done.is_set():
            try:
                send_warm_up(p)
            except Exception:
                log.warning("backoff warm-up event not sent; retrying", exc_info=True)
            done.wait(WARM_UP_RESEND_S)
    finally:
        p.close()


# Errors of a write that a later try may not meet: Redis or Kafka not answering.
TRANSIENT: Final = (redislib.RedisError, OSError, kafka.KafkaUnavailable)


def write_retrying(write: Callable[[], None], timeout_s: float, what: int,
                   first_wait_s: float = 0.2) -> int:
    """``write()``, tried again while it fails with a TRANSIENT error, waiting 0.2 s, 0.4 s,
    ... (at most 5 s) in between, until ``timeout_s`` has passed; then the error goes up
    and fails the query. How many tries it took. ``what``: the dwell.acks partition."""
    deadline = time.monotonic() + timeout_s
    wait = first_wait_s
    tries = 1
    while True:
        try:
            write()
            return tries
        except TRANSIENT as exc:
            if time.monotonic() + wait > deadline:
                log.error("backoff: partition %d's batch not written after %d tries: %s",
                          what, tries, exc)
                raise
            log.warning("backoff: writing partition %d's batch failed (%s); trying again in "
                        "%.1f s", what, exc, wait)
        time.sleep(wait)
        wait = min(wait * 2, 5.0)
        tries += 1


def drop_old_checkpoints(spark: SparkSession, root: str) -> None:
    """Delete the checkpoints earlier versions kept (OLD_CHECKPOINTS under ``root``), if
    there are any. Nothing reads them any more, and left alone they would keep their
    state's disk for good. Through Hadoop's FileSystem, as Spark reaches the checkpoint: a
    local directory, HDFS or an object store alike."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for name in OLD_CHECKPOINTS:
        path = jvm.org.apache.hadoop.fs.Path(f"{root}/{name}")
        fs = path.getFileSystem(conf)
        if fs.exists(path):
            fs.delete(path, True)
            log.warning("backoff: deleted %s/%s, the checkpoint of an earlier version whose "
                        "state this one does not keep", root, name)


def _exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists, through Hadoop's FileSystem as Spark reaches it."""
    p = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path)
    return bool(p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(p))


def _auth_values() -> Any:
    """The record's `dwell-authorization` header values (an empty array without one)."""
    headers = F.coalesce(F.col("headers"), F.array().cast("array<struct<key:string,"
                                                          "value:binary>>"))
    return F.transform(F.filter(headers, lambda h: h["key"] == F.lit(hdr.AUTHORIZATION)),
                       lambda h: h["value"])


# kafka.fetch.max.wait.ms of the query: an event waits at most this long in the broker.
FETCH_MAX_WAIT_MS: Final = 10


def acks(spark: SparkSession, settings: SparkSettings, starting: Mapping[int, int]) -> DataFrame:
    """dwell.acks as a stream of SOURCE_COLUMNS; a new checkpoint starts at ``starting``
    (offset per partition)."""
    start = json.dumps({names.ACKS: {str(p): o for p, o in starting.items()}})
    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .options(**spark_kafka_options(settings))
           .option("subscribe", names.ACKS)
           .option("startingOffsets", start)
           .option("maxOffsetsPerTrigger", str(settings.acks_max_events_per_batch))
           .option("failOnDataLoss", "false")
           .option("includeHeaders", "true")
           .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
           .load())
    return raw.select("partition", "offset", F.unix_millis(F.col("timestamp")).alias("ts"),
                      F.col("timestampType").alias("tsType"), "key", "value",
                      _auth_values().alias("auths"))


class AcksReadTo:
    """What the drain asks before it claims redeliveries (its ``acks_read_to``): the
    backoff's IndexKeeper.read_to once `start` made one, 0 before (nothing read yet)."""

    def __init__(self) -> None:
        self.keeper: recovery.IndexKeeper | None = None

    def __call__(self) -> int:
        return 0 if self.keeper is None else self.keeper.read_to()


def start(spark: SparkSession, settings: SparkSettings, redis: redislib.Redis,
          read_to: AcksReadTo | None = None):
    """The backoff query; ``read_to`` is given its IndexKeeper."""
    checkpoint = f"{settings.spark_checkpoint_dir}/{CHECKPOINT}"
    drop_old_checkpoints(spark, settings.spark_checkpoint_dir)
    work = Pass.of(settings)
    warmed, first_done = threading.Event(), threading.Event()
    metrics.expect_query("backoff")
    nudger = kafka.Producer(settings.kafka_bootstrap, linger_ms=0,
                            compression_type=settings.kafka_compression_type)
    keeper = recovery.IndexKeeper(settings, redis, work, lambda: send_warm_up(nudger))
    if read_to is not None:
        read_to.keeper = keeper
    # A new checkpoint with no decisions in Redis starts where acks_starting_offsets says.
    fresh = not _exists(spark, f"{checkpoint}/offsets")
    starting = keeper.start(replay=not fresh or settings.acks_starting_offsets == "earliest")

    def _apply(df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        # The query runs its first batch: its source is read and its plan made. A backlog
        # is worked through from here on (dwell_backoff_lag_events shows how much is left).
        if not warmed.is_set():
            warmed.set()
            metrics.mark_ready("backoff")
        # Before this batch's writes: Redis must hold those of the batches before it.
        keeper.before()
        rows = df.collect()
        keeper.saw(rows)
        if any(r.lost for r in rows):
            keeper.rebuild("lost")
        if not first_done.is_set():
            first_done.set()
            log.info("%s in %d ms (%d events)", FIRST_BATCH_DONE,
                     (time.monotonic() - started) * 1000, sum(r.events for r in rows))
        events = sum(r.events for r in rows)
        decisions = sum(r.decisions for r in rows)
        retries = sum(r.retries for r in rows)
        if retries:
            metrics.BACKOFF_WRITE_RETRIES.inc(retries)
        for r in rows:
            for kind, n in json.loads(r.invalid or "{}").items():
                metrics.INVALID_RECORDS.labels(names.ACKS, kind).inc(n)
        aside = [r for r in rows if r.invalid]
        if aside:
            log.warning("dwell.acks: %d events set aside on %s (first: %s)",
                        sum(sum(json.loads(r.invalid).values()) for r in aside),
                        names.INVALID, aside[0].reason)
        if decisions:
            leads = [r.lead for r in rows if r.lead is not None]
            # Lead: how long before its due time the earliest redelivery reached the index
            # (negative: the batch came too late for it, and it goes at once).
            log.info("backoff: %d decisions from %d events; earliest scheduled redelivery "
                     "due in %s ms (batch %d in %d ms: decided in %d ms, written in %d ms, "
                     "summed over %d partition batches)", decisions, events,
                     min(leads) if leads else "-", batch_id,
                     (time.monotonic() - started) * 1000, sum(r.decide_ms for r in rows),
                     sum(r.write_ms for r in rows), len(rows))

    def _batch(df: DataFrame, batch_id: int) -> None:
        with metrics.batch_running("backoff"):
            _apply(df, batch_id)

    summaries = acks(spark, settings, starting).mapInArrow(work, SUMMARY_SCHEMA)
    query = (summaries.writeStream.queryName("dwell-backoff")
             .foreachBatch(_batch)
             .trigger(processingTime=f"{settings.backoff_trigger_ms} milliseconds")
             .option("checkpointLocation", checkpoint)
             .start())
    threading.Thread(target=warm_up, args=(settings.kafka_bootstrap, warmed,
                                           settings.kafka_compression_type),
                     name="backoff-warm-up", daemon=True).start()
    threading.Thread(target=keeper.run, args=(threading.Event(),), name="backoff-redis-check",
                     daemon=True).start()
    return query
