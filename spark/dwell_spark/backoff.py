"""The backoff job: reads consumers' events on dwell.acks (Spark's Kafka source) and keeps
a state per shard of each (topic, subscription) (dwell_spark.state), with every pending
redelivery of the shard's messages. The redelivery index does the timing, not Spark: when
the job reads a `delivered` event with an ack timeout, or a `nack`, it writes
the future redelivery into the subscription's redelivery index at its absolute due time,
computed by dwell.core.backoff from the event's own timestamps (PIP-130 / PIP-106); the
drain claims it once its bucket has passed (never early). An `ack` (or a later event that
supersedes it) takes the pending entry out of the index again; once the drain has claimed
its bucket that is a no-op: the redelivery happened, as in Pulsar. So a micro-batch's
latency does not add to the redelivery gaps as long as it stays below the delay.

Dead letters (Pulsar's DeadLetterPolicy, after maxRedeliverCount redeliveries): a nack
past the limit dead-letters at once (nothing can cancel a nack); an unacked delivery past
the limit goes into the redelivery index like a redelivery (``dead``: its count stored
as -(count + 1)), and the drain sends it to the DLQ instead of the retry topic once its
ack timeout (plus backoff) has run out; an ack before then takes it out again. So the
index does all the timing and the state's processing-time timers only clean up: the
query runs no micro-batch without new events (``noDataMicroBatches`` off), so an idle
app does not run a batch every trigger just to look for timeouts.

The subscription settings ride on each event (the SDK copies what it registered at the
tracker), so SDK events need no lookup. An event without them (``ackTimeoutMs`` absent: a
plain Kafka consumer that registered its subscription over the tracker's HTTP API) takes
them from the tracker's subscription registry in Redis, cached per Python worker for
backoff_registry_ttl_ms. Replays after a crash are harmless: index adds are set unions, removes
of what is gone are no-ops, and the redelivery count is written, not incremented. The
state holds every pending redelivery, so after Redis lost the indexes dwell_spark.recovery
puts them back from it before the next batch's decisions are applied."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pandas as pd
import redis as redislib
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.cache import ExpiringCache
from dwell.core import invalid as invalid_core
from dwell.core import subscriptions as subs
from dwell.core import topics as names
from dwell.core.backoff import (
    ExponentialRedeliveryBackoff,
    ack_timeout_redelivery_at,
    nack_redelivery_at,
)
from dwell.core.buckets import bucket_start
from dwell.core.positions import parse_message_id
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName, dlq_topic
from dwell.index import subscriptions as registry
from dwell.index.redelivery import SubscriptionIndex

from . import invalid, metrics, recovery
from .drain import TopicCache, write_ranges
from .records import Range
from .settings import SparkSettings
from .state import (
    CHECKPOINT,
    OLD_CHECKPOINT,
    SHARDS_FILE,
    STATE_SCHEMA,
    StateEntry,
    decode_pending,
    encode_pending,
)

log = logging.getLogger("dwell.spark.backoff")
# Backoff objects stay JSON text (Spark keeps a nested object's raw text for a string field).
EVENT_SCHEMA = StructType([
    StructField("event", StringType()),
    StructField("topic", StringType()),
    StructField("subscription", StringType()),
    StructField("messageId", StringType()),
    StructField("redeliveryCount", LongType()),
    StructField("ts", LongType()),
    *(StructField(name, LongType() if name in subs.INTEGER_FIELDS else StringType())
      for name in subs.FIELDS),
])
OUTPUT_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("subscription", StringType()),
    StructField("messageId", StringType()),
    StructField("action", StringType()),  # schedule | dead | cancel | dlq | ack
    StructField("at", LongType()),
    StructField("bucket", LongType()),  # schedule, dead, cancel: the index bucket
    StructField("redeliveryCount", LongType()),
    # set aside: why, and the event as the state function read it (JSON)
    StructField("reason", StringType()),
    StructField("event", StringType()),
])
SCHEDULE, DEAD, CANCEL, DLQ, ACK = "schedule", "dead", "cancel", "dlq", "ack"
# An event the state function failed on: it goes to dwell.invalid (its `at` and `bucket`
# carry the event's offset and partition on dwell.acks), and the batch goes on.
SET_ASIDE = "set_aside"
# Where an event was read on dwell.acks: the columns the state function gets beside
# EVENT_SCHEMA's.
SOURCE_COLUMNS: Final = ("partition", "offset")
# What every decision row of a signed 64-bit column must fit in (Arrow's int64).
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
# The settings' defaults, for step() and RegistryLookup built without them (tests).
# start() hands the configured values to the state function and the lookup, which
# carry them to the executors' Python workers (those do not see the driver's DWELL_*
# environment).
DEFAULT_TICK_MS: Final = SparkSettings.model_fields["redelivery_tick_ms"].default
DEFAULT_STATE_GRACE_MS: Final = SparkSettings.model_fields["backoff_state_grace_ms"].default
DEFAULT_REGISTRY_TTL_MS: Final = SparkSettings.model_fields["backoff_registry_ttl_ms"].default

Lookup = Callable[[str, str], "SubscriptionSettings | None"]


def _backoff(raw: Any) -> ExponentialRedeliveryBackoff | None:
    if raw is None or (isinstance(raw, float) and pd.isna(raw)) or raw == "":
        return None
    return _parse_backoff(raw)


@functools.lru_cache(maxsize=1024)
def _parse_backoff(raw: str) -> ExponentialRedeliveryBackoff:
    # A subscription's events all carry the same text: parsed once per worker.
    return ExponentialRedeliveryBackoff.from_json(json.loads(raw))


def _opt_int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def _position(v: Any) -> int:
    """A source partition or offset, -1 when unknown."""
    found = _opt_int(v)
    return -1 if found is None else found


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


Event = dict[str, Any]
EVENT_COLUMNS: Final = (*(f.name for f in EVENT_SCHEMA.fields), *SOURCE_COLUMNS)
OUTPUT_COLUMNS: Final = pd.Index([f.name for f in OUTPUT_SCHEMA.fields])


def group_events(batches: Iterator[pd.DataFrame]) -> list[Event]:
    """A group's events as dicts, oldest first (``ts``; ties keep their order). The
    state function runs once per message, so it works on plain rows: a pandas
    operation costs more than the decision itself."""
    rows: list[Event] = []
    for frame in batches:
        columns = [frame[c].tolist() if c in frame else [None] * len(frame)
                   for c in EVENT_COLUMNS]
        rows.extend(dict(zip(EVENT_COLUMNS, values, strict=True))
                    for values in zip(*columns, strict=True))
    rows.sort(key=lambda r: r["ts"])
    return rows


def fill_settings(events: list[Event], settings: SubscriptionSettings | None) -> list[Event]:
    """``events`` with the registered ``settings`` on every row that carries none
    (``ackTimeoutMs`` missing); rows that carry settings keep theirs."""
    if settings is None:
        return events
    # The rows take the settings in their dwell.acks shape (backoffs as JSON text).
    values = {name: json.dumps(value) if name in subs.BACKOFF_FIELDS and value is not None
              else value for name, value in settings.to_json().items()}
    return [ev | values if _opt_int(ev.get(subs.ACK_TIMEOUT_MS)) is None else ev
            for ev in events]


def decisions_frame(out: list[tuple]) -> pd.DataFrame:
    """The state function's output rows as the frame OUTPUT_SCHEMA describes. Object
    columns keep Python ints and None as they are (Arrow reads them as int64 and null);
    a typed frame costs ~10 times as much to build, once per message."""
    rows = np.empty((len(out), len(OUTPUT_COLUMNS)), dtype=object)
    if out:
        rows[:] = out
    return pd.DataFrame(rows, columns=OUTPUT_COLUMNS, copy=False)


def pending_of(state: GroupState) -> dict[str, StateEntry]:
    """A shard's state as messageId -> its pending entry."""
    return decode_pending(state.get[0]) if state.exists else {}


def step(key: tuple[str, str, int], batches: Iterator[pd.DataFrame],
         state: GroupState, lookup: Lookup | None = None,
         tick_ms: int = DEFAULT_TICK_MS,
         grace_ms: int = DEFAULT_STATE_GRACE_MS) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState function for one shard of a (topic, subscription): the
    index writes (``schedule`` / ``cancel``), dead letters and acks its events call for,
    each message's in event order. ``lookup(topic, sub)`` supplies the settings of events
    that carry none; ``tick_ms`` is the redelivery index's bucket width; ``grace_ms`` how
    long a scheduled redelivery's entry outlives its due time (backoff_state_grace_ms).
    Spark calls Python once per group and batch: a shard holds many messages, so that
    call is made once per shard with events, not once per message."""
    topic, sub, _ = key
    out: list[tuple] = []
    pending = pending_of(state)
    events = [] if state.hasTimedOut else group_events(batches)
    if lookup is not None and any(_opt_int(ev[subs.ACK_TIMEOUT_MS]) is None
                                  for ev in events):
        events = fill_settings(events, lookup(topic, sub))
    for ev in events:
        decide_or_set_aside(topic, sub, ev, pending, out, tick_ms)
    # An entry is kept for acks that may still cancel it, then dropped (at the shard's
    # first micro-batch after that: batches run only when events come).
    now = int(time.time() * 1000)
    live = {mid: p for mid, p in pending.items() if p[0] + grace_ms > now}
    if live:
        state.update((encode_pending(live),))
        state.setTimeoutDuration(max(1, min(p[0] for p in live.values()) + grace_ms - now))
    elif state.exists:
        state.remove()
    yield decisions_frame(out)


def decide_or_set_aside(topic: str, sub: str, ev: Event, pending: dict[str, StateEntry],
                        out: list[tuple], tick_ms: int) -> None:
    """:func:`decide`, or, when it fails on the event (or a decision would not fit the
    output's 64-bit columns), its SET_ASIDE row and nothing else: an event that passed
    the checks yet fails would otherwise fail its micro-batch on every restart, and
    with it every topic's redeliveries."""
    n = len(out)
    mid = ev["messageId"]
    before = pending.get(mid)
    try:
        decide(topic, sub, ev, pending, out, tick_ms)
        for row in out[n:]:
            for v in row[4:7]:
                if v is not None and not _LONG_MIN <= v <= _LONG_MAX:
                    raise OverflowError(f"decision {row[3]} for {mid}: {v} does not fit a "
                                        "signed 64-bit integer")
    except Exception as exc:
        del out[n:]
        if before is None:
            pending.pop(mid, None)
        else:
            pending[mid] = before
        source = {k: ev.pop(k, None) for k in SOURCE_COLUMNS}
        text = json.dumps({k: v for k, v in ev.items() if v is not None}, default=str)
        out.append((topic, sub, mid, SET_ASIDE, _opt_int(source["offset"]),
                    _opt_int(source["partition"]), None,
                    f"{type(exc).__name__}: {exc}"[:invalid_core.MAX_REASON_CHARS], text))


def decide(topic: str, sub: str, ev: Event, pending: dict[str, StateEntry], out: list[tuple],
           tick_ms: int) -> None:
    """One event's decisions, appended to ``out``; ``pending`` (messageId -> entry) is
    updated in place."""
    mid = ev["messageId"]
    cur = pending.get(mid)

    def emit(action: str, at: int, bucket: int | None, count: int) -> None:
        out.append((topic, sub, mid, action, at, bucket, count, None, None))

    def cancel() -> None:
        # Whatever is pending is superseded (a newer delivery, a nack, an ack).
        if cur is not None:
            emit(CANCEL, int(cur[0]), int(cur[1]), int(cur[2]))
            del pending[mid]

    def schedule(at: int, count: int, max_r: int | None, dead_now: bool) -> None:
        bucket = bucket_start(at, tick_ms)
        if max_r is not None and count >= max_r:
            if dead_now:
                emit(DLQ, at, None, count)
                return
            emit(DEAD, at, bucket, count)
            pending[mid] = (at, bucket, -count - 1)
            return
        emit(SCHEDULE, at, bucket, count + 1)
        pending[mid] = (at, bucket, count + 1)

    # Plain Kafka consumers may leave out the count of a first delivery.
    count = _opt_int(ev["redeliveryCount"]) or 0
    kind = ev["event"]
    if kind == "delivered":
        ack_timeout = _opt_int(ev[subs.ACK_TIMEOUT_MS]) or 0
        # Without an ack timeout a delivery schedules nothing and leaves what is pending
        # alone (a repeat of a nacked copy must not cancel its nack); with one, the new
        # delivery restarts the clock.
        if ack_timeout > 0:
            cancel()
            at = ack_timeout_redelivery_at(int(ev["ts"]), ack_timeout,
                                           _backoff(ev[subs.ACK_TIMEOUT_BACKOFF]), count)
            schedule(at, count, _opt_int(ev[subs.MAX_REDELIVER_COUNT]), dead_now=False)
    elif kind == "ack":
        cancel()
        emit(ACK, int(ev["ts"]), None, count)
    elif kind == "nack":
        cancel()
        at = nack_redelivery_at(int(ev["ts"]), _backoff(ev[subs.NACK_BACKOFF]), count)
        schedule(at, count, _opt_int(ev[subs.MAX_REDELIVER_COUNT]), dead_now=True)


# An index entry: (sourceKafkaTopic, partition, offset, bucket).
Entry = tuple[str, int, int, int]


@dataclass
class _Changes:
    """One subscription's net changes from a batch of decisions: entries to drop (from
    earlier batches), entries to add (with their due time), and counts to store (None:
    forget). A cancel of an entry added earlier in the same batch drops the add."""

    idx: SubscriptionIndex
    removes: set[Entry] = field(default_factory=set)
    adds: dict[Entry, int] = field(default_factory=dict)
    counts: dict[str, int | None] = field(default_factory=dict)


class Scheduler:
    """Driver side: turn the state function's decisions into index entries and DLQ records.
    A batch's decisions are folded per subscription first (each message's in order), so
    the index is rewritten once per bucket and the counts written in one call, whatever
    the batch's size: with an ack timeout every delivered message is a decision."""

    def __init__(self, spark: SparkSession, settings: SparkSettings,
                 redis: redislib.Redis) -> None:
        self.spark = spark
        self.settings = settings
        self.redis = redis
        self.topics = TopicCache(settings.kafka_bootstrap, settings.topic_partitions)
        self._producer: kafka.Producer | None = None

    def set_aside(self, rows: list[Any]) -> None:
        """Put the SET_ASIDE rows' events on dwell.invalid (kind `failed`) and count them;
        the first one's reason is logged, once per batch."""
        if self._producer is None:
            self._producer = kafka.Producer(
                self.settings.kafka_bootstrap, linger_ms=0,
                compression_type=self.settings.kafka_compression_type)
        futures = []
        for row in rows:
            topic, value, key, headers, _ = invalid_core.invalid_record(
                names.ACKS, _position(row.bucket), _position(row.at),
                f"{row.topic}/{row.subscription}".encode(), (row.event or "").encode(),
                invalid_core.FAILED, row.reason or "")
            futures.append(self._producer.send(topic, value, key, dict(headers)))
        for f in futures:
            f.result(30)
        metrics.INVALID_RECORDS.labels(names.ACKS, invalid_core.FAILED).inc(len(rows))
        log.warning("backoff: %d events the state function failed on set aside on %s "
                    "(first: %s)", len(rows), names.INVALID, rows[0].reason)

    def apply(self, rows: list[Any]) -> None:
        subs_changes: dict[tuple[str, str], _Changes] = {}
        dead: list[Range] = []
        for row in rows:
            key = (row.topic, row.subscription)
            ch = subs_changes.get(key)
            if ch is None:
                ch = subs_changes[key] = _Changes(SubscriptionIndex(self.redis, *key))
            if row.action == ACK:
                ch.counts[row.messageId] = None
                continue
            source, partition, offset = parse_message_id(row.messageId)
            if row.action in (SCHEDULE, DEAD):
                # A dead letter's count is stored as -(count + 1), which tells the drain to
                # send it to the DLQ (drain.redelivery_ranges).
                count = int(row.redeliveryCount)
                ch.counts[row.messageId] = count if row.action == SCHEDULE else -count - 1
                ch.adds[(source, partition, offset, int(row.bucket))] = int(row.at)
            elif row.action == CANCEL:
                entry = (source, partition, offset, int(row.bucket))
                if ch.adds.pop(entry, None) is None:
                    ch.removes.add(entry)
            else:
                target = dlq_topic(TopicName.parse(row.topic), row.subscription)
                dead.append(Range(target, source, partition, offset, offset, row.subscription,
                                  {offset: int(row.redeliveryCount)},
                                  topic=row.topic.encode()))
                ch.counts[row.messageId] = None
        # Cancels before anything else (a cancelled entry the drain claims meanwhile is
        # redelivered, as in Pulsar); dead letters written before their counts go; counts
        # before the entries that the drain reads them for.
        for ch in subs_changes.values():
            by_bucket: dict[int, list[tuple[str, int, int]]] = {}
            for src, part, off, bucket in ch.removes:
                by_bucket.setdefault(bucket, []).append((src, part, off))
            for bucket, positions in by_bucket.items():
                ch.idx.remove_many(bucket, positions)
        if dead:
            write_ranges(self.spark, self.settings, self.topics, dead)
        tick = self.settings.redelivery_tick_ms
        for ch in subs_changes.values():
            ch.idx.forget(*(mid for mid, c in ch.counts.items() if c is None))
            ch.idx.store_counts({mid: c for mid, c in ch.counts.items() if c is not None})
            ch.idx.add([(src, part, off, at) for (src, part, off, _), at in ch.adds.items()],
                       tick)


def events(spark: SparkSession, settings: SparkSettings) -> DataFrame:
    """The good events on dwell.acks (dwell_spark.invalid sets the others aside)."""
    raw = (invalid.checked_acks(spark, settings, SYSTEM_TOPICS)
           .where(F.col("bad.kind").isNull()))
    # A delivery without an ack timeout schedules nothing and changes no state (step):
    # it is dropped before the state function, which would read and write its shard. (The
    # SDK sends none; a plain Kafka consumer that leaves ackTimeoutMs out gets the
    # registered one.)
    no_clock = (F.col("event") == F.lit("delivered")) & (F.col(subs.ACK_TIMEOUT_MS) == 0)
    return (raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"),
                       *SOURCE_COLUMNS)
            .select("e.*", *SOURCE_COLUMNS)
            .where(F.col("topic").isNotNull() & F.col("subscription").isNotNull()
                   & F.col("messageId").isNotNull() & F.col("ts").isNotNull()
                   & ~F.coalesce(no_clock, F.lit(False))))


def shard_of(message_id: Column, shards: int) -> Column:
    """The state shard of a messageId: a stable hash, so each message's events meet in one
    shard (the count is fixed once a checkpoint exists)."""
    return F.pmod(F.xxhash64(message_id), F.lit(shards))


# The app's own event on dwell.acks at start (an ack of nothing): the query says "backoff
# ready" once a micro-batch has carried it through the state function, so the first
# consumer events do not pay for starting the Python workers and the first plans
# (seconds). Its decision is not applied.
WARM_UP_TOPIC = "persistent://dwell/system/backoff-warm-up"
# Topics of events the app sends itself, in the reserved tenant no user topic can have.
SYSTEM_TOPICS: Final = frozenset({WARM_UP_TOPIC})
WARM_UP_RESEND_S = 5.0


def send_warm_up(p: kafka.Producer) -> None:
    """One warm-up event on dwell.acks; it also makes an idle query run a micro-batch."""
    body = {"event": ACK, "topic": WARM_UP_TOPIC, "subscription": "warm-up",
            "messageId": "dwell.delayed:0:0", "ts": int(time.time() * 1000)}
    p.send(names.ACKS, json.dumps(body).encode(),
           key=f"{WARM_UP_TOPIC}/warm-up".encode()).result(10)


def warm_up(bootstrap: str, done: threading.Event, compression_type: str = "none") -> None:
    """Send the warm-up event until a micro-batch has run: one sent before the query has
    fixed its starting offsets ("latest" on a new checkpoint) is never read."""
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


def write_retrying(write: Callable[[], None], timeout_s: float, batch_id: int,
                   first_wait_s: float = 0.2) -> int:
    """``write()``, tried again while it fails with a TRANSIENT error, waiting 0.2 s, 0.4 s,
    ... (at most 5 s) in between, until ``timeout_s`` has passed; then the error goes up
    and fails the query. How many tries it took."""
    deadline = time.monotonic() + timeout_s
    wait = first_wait_s
    tries = 1
    while True:
        try:
            write()
            return tries
        except TRANSIENT as exc:
            if time.monotonic() + wait > deadline:
                log.error("backoff: batch %d not written after %d tries: %s", batch_id,
                          tries, exc)
                raise
            metrics.BACKOFF_WRITE_RETRIES.inc()
            log.warning("backoff: writing batch %d failed (%s); trying again in %.1f s",
                        batch_id, exc, wait)
        time.sleep(wait)
        wait = min(wait * 2, 5.0)
        tries += 1


def fixed_shards(spark: SparkSession, checkpoint: str, wanted: int) -> int:
    """The shard count the backoff's checkpoint was made with, recorded in it (SHARDS_FILE)
    before its first batch; ``wanted`` (backoff_state_shards) on a new checkpoint. With
    another count, a message's later events would meet in another shard than its pending
    entry, and an ack would no longer cancel it: so the checkpoint's count wins, as Spark
    keeps a checkpoint's shuffle partitions."""
    path = f"{checkpoint}/{SHARDS_FILE}"
    try:
        made = [int(row.value) for row in spark.read.text(path).collect()]
    except AnalysisException:  # no record yet: a new checkpoint
        made = []
    if made:
        if made[0] != wanted:
            log.warning("backoff: %d state shards, the checkpoint's (%s); backoff_state_shards "
                        "(%d) applies only to a new checkpoint", made[0], checkpoint, wanted)
        return made[0]
    (spark.createDataFrame([(str(wanted),)], "value string").coalesce(1)
     .write.mode("overwrite").text(path))
    return wanted


def drop_old_checkpoint(spark: SparkSession, root: str) -> None:
    """Delete the checkpoint an earlier version kept one state per message in
    (OLD_CHECKPOINT under ``root``), if there is one. Nothing reads it
    any more (its events are read again from `acks_starting_offsets`), and left alone it
    would keep its state's disk for good. Through Hadoop's FileSystem, as Spark reaches
    the checkpoint: a local directory, HDFS or an object store alike."""
    path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(f"{root}/{OLD_CHECKPOINT}")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if fs.exists(path):
        fs.delete(path, True)
        log.warning("backoff: deleted %s/%s, the checkpoint of an earlier version whose "
                    "state this one cannot read", root, OLD_CHECKPOINT)


def start(spark: SparkSession, settings: SparkSettings, redis: redislib.Redis):
    checkpoint = f"{settings.spark_checkpoint_dir}/{CHECKPOINT}"
    drop_old_checkpoint(spark, settings.spark_checkpoint_dir)
    shards = fixed_shards(spark, checkpoint, settings.backoff_state_shards)
    scheduler = Scheduler(spark, settings, redis)
    warmed = threading.Event()
    metrics.expect_query("backoff")
    lookup = RegistryLookup(settings.redis_url, settings.backoff_registry_ttl_ms)
    tick = settings.redelivery_tick_ms
    grace = settings.backoff_state_grace_ms
    nudger = kafka.Producer(settings.kafka_bootstrap, linger_ms=0,
                            compression_type=settings.kafka_compression_type)
    keeper = recovery.IndexKeeper(spark, settings, redis, lambda: send_warm_up(nudger))

    def _step(key: tuple[str, str, int], batches: Iterator[pd.DataFrame],
              state: GroupState) -> Iterator[pd.DataFrame]:
        return step(key, batches, state, lookup, tick, grace)

    def _apply(df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        rows = df.collect()
        collected = time.monotonic()
        # A micro-batch has been through the state function (the warm-up event, or the
        # first bounded batch of a backlog, which the warm-up event is behind).
        if not warmed.is_set():
            warmed.set()
            metrics.mark_ready("backoff")
        aside = [r for r in rows if r.action == SET_ASIDE]
        rows = [r for r in rows if r.action != SET_ASIDE and r.topic != WARM_UP_TOPIC]

        def write() -> None:
            if aside:
                scheduler.set_aside(aside)
            # Before this batch's decisions: Redis must hold those of the batches before it.
            keeper.before(batch_id)
            if rows:
                scheduler.apply(rows)
            keeper.after(batch_id)

        tries = write_retrying(write, settings.backoff_write_timeout_ms / 1000, batch_id)
        if rows:
            # Lead: how long before its due time the earliest redelivery reached the index
            # (negative: the batch came too late for it, and it goes at once).
            now = int(time.time() * 1000)
            leads = [int(r.at) - now for r in rows if r.action in (SCHEDULE, DEAD)]
            log.info("backoff: %d decisions; earliest scheduled redelivery due in %s ms "
                     "(batch %d: events and state %d ms, written in %d ms, %d tries)",
                     len(rows), min(leads) if leads else "-", batch_id,
                     (collected - started) * 1000, (time.monotonic() - collected) * 1000,
                     tries)

    def _batch(df: DataFrame, batch_id: int) -> None:
        with metrics.batch_running("backoff"):
            _apply(df, batch_id)

    decisions = (events(spark, settings)
                 .withColumn("shard", shard_of(F.col("messageId"), shards))
                 .groupBy("topic", "subscription", "shard")
                 .applyInPandasWithState(_step, OUTPUT_SCHEMA, STATE_SCHEMA, "Update",
                                         GroupStateTimeout.ProcessingTimeTimeout))
    query = (decisions.writeStream.queryName("dwell-backoff")
             .outputMode("update")
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
