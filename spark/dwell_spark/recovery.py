"""Losing Redis under the backoff: the subscriptions' redelivery indexes (`dwell:sub:…`)
are rebuilt from the backoff query's own state, which Spark checkpoints outside Redis
(docs/internals.md, "Losing Redis").

Redis's marker `dwell:backoff:applied` is the last micro-batch of the backoff query whose
decisions Redis holds. Only a rebuild creates it (a batch moves it only if it exists), so
after a FLUSHALL or a restart without data it is gone even if a batch wrote in between; a
marker below the batch before the running one means Redis rolled back (a restart that lost
its last second, a replica that missed writes). Each micro-batch checks it before it
applies its decisions; when Redis is behind, it first reads the state as of the previous
batch with Spark's State Data Source (one row per message with a pending redelivery or
dead letter: ``dueAt``, ``bucket``, the stored count) and puts every entry back into its
subscription's index, at its own due time. An idle app runs no micro-batch, so a thread
checks the marker on an interval and, when Redis is behind, sends the warm-up event to
`dwell.acks` to make the query run one.

An entry whose bucket the drain could already have claimed may have been redelivered
before the loss. It is put back only if its subscription's retry (or dead-letter) topic has
no copy of it with its count, read from the time its bucket started: so a redelivery is
repeated only if its copy was being written while the rebuild looked (a claim in flight).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import redis as redislib
from pyspark.sql import SparkSession

from dwell import headers, keys
from dwell.adapters import kafka
from dwell.core.buckets import bucket_due_cutoff
from dwell.core.positions import parse_message_id
from dwell.core.topics import TopicName, dlq_topic, retry_topic
from dwell.index.redelivery import SubscriptionIndex

from . import metrics
from .settings import SparkSettings
from .state import CHECKPOINT, decode_pending

log = logging.getLogger("dwell.spark.recovery")
# How often the nudge that makes an idle query run a micro-batch is sent again while Redis
# stays behind.
NUDGE_EVERY_S = 5.0
# HSET of stored counts, this many messages at a time.
COUNTS_CHUNK = 10_000


@dataclass(frozen=True, slots=True)
class Pending:
    """One message's pending redelivery as the backoff state holds it; ``stored`` is the
    count as the index stores it (-(count + 1): a dead letter)."""

    topic: str
    subscription: str
    message_id: str
    due_at: int
    bucket: int
    stored: int

    def copy_id(self) -> tuple[str, str, int]:
        """(target topic, messageId, redelivery count) of the copy the drain writes for it."""
        t = TopicName.parse(self.topic)
        if self.stored < 0:
            return dlq_topic(t, self.subscription), self.message_id, -self.stored - 1
        return retry_topic(t, self.subscription), self.message_id, max(1, self.stored)


def read_state(spark: SparkSession, checkpoint: str, batch_id: int) -> list[Pending]:
    """Every pending entry of the backoff state after micro-batch ``batch_id``."""
    # One row per shard, its messages in one JSON text (dwell_spark.backoff.STATE_SCHEMA).
    df = (spark.read.format("statestore").option("batchId", batch_id).load(checkpoint)
          .selectExpr("key.topic AS topic", "key.subscription AS subscription",
                      "value.groupState.pending AS pending")
          .where("pending IS NOT NULL"))
    return [Pending(r.topic, r.subscription, mid, int(due), int(bucket), int(stored))
            for r in df.toLocalIterator()
            for mid, (due, bucket, stored) in decode_pending(r.pending).items()]


def delivered_copies(bootstrap: str, due: list[Pending]) -> set[tuple[str, str, int]]:
    """(target, messageId, count) of the copies on the retry and DLQ topics of ``due``'s
    subscriptions, read from the earliest bucket start among them: the drain never writes
    a copy before its bucket starts."""
    since: dict[str, int] = {}
    for p in due:
        target = p.copy_id()[0]
        since[target] = min(since.get(target, p.bucket), p.bucket)
    existing = kafka.topic_names(bootstrap)
    out: set[tuple[str, str, int]] = set()
    for target, ts in since.items():
        if target not in existing:
            continue
        starts = kafka.offsets_at(bootstrap, target, ts)
        for rec in kafka.iter_from(bootstrap, target, starts):
            mid, count = rec.header(headers.MESSAGE_ID), rec.header(headers.REDELIVERY_COUNT)
            if mid is not None and count is not None and count.isdigit():
                out.add((target, mid, int(count)))
    return out


def restore(r: redislib.Redis, bootstrap: str, entries: list[Pending], tick_ms: int,
            now_ms: int) -> tuple[int, int, int]:
    """Put ``entries`` back into their subscriptions' redelivery indexes, except those
    already due whose copy is on their retry or DLQ topic; (put back pending, put back
    already due, skipped)."""
    # Up to the strict cutoff a drainer may have claimed the bucket before the loss.
    cutoff = bucket_due_cutoff(now_ms, tick_ms, strict=True)
    due = [p for p in entries if p.bucket <= cutoff]
    copies = delivered_copies(bootstrap, due) if due else set()
    by_sub: dict[tuple[str, str], list[Pending]] = defaultdict(list)
    skipped = 0
    for p in entries:
        if p.bucket <= cutoff and p.copy_id() in copies:
            skipped += 1
        else:
            by_sub[(p.topic, p.subscription)].append(p)
    for (topic, sub), ps in by_sub.items():
        # Counts first: the drain reads an entry's count when it emits it.
        counts = keys.sub_counts(topic, sub)
        for i in range(0, len(ps), COUNTS_CHUNK):
            r.hset(counts, mapping={p.message_id: p.stored for p in ps[i:i + COUNTS_CHUNK]})
        SubscriptionIndex(r, topic, sub).add(
            [(*parse_message_id(p.message_id), p.due_at) for p in ps], tick_ms)
    return len(entries) - len(due), len(due) - skipped, skipped


class IndexKeeper:
    """Keeps the redelivery indexes in Redis level with the backoff state: ``before`` and
    ``after`` wrap each micro-batch's writes, ``run`` watches an idle app."""

    def __init__(self, spark: SparkSession, settings: SparkSettings, redis: redislib.Redis,
                 nudge: Callable[[], None]) -> None:
        self.spark = spark
        self.settings = settings
        self.redis = redis
        self.checkpoint = f"{settings.spark_checkpoint_dir}/{CHECKPOINT}"
        # The last batch whose decisions this process wrote: a marker below it is a rollback.
        self.applied = -1
        # Makes the backoff query run a micro-batch (it sends the warm-up event).
        self._nudge = nudge
        self.error: str | None = None

    def behind(self, expected: int) -> str | None:
        """Why Redis does not hold the decisions up to batch ``expected``, or None."""
        raw = self.redis.get(keys.BACKOFF_APPLIED)
        if raw is None:
            return "lost"
        if int(raw) < expected:
            return "stale"
        return None

    def before(self, batch_id: int) -> None:
        """Before batch ``batch_id`` applies its decisions: rebuild if Redis lost those of
        the batches before it."""
        reason = self.behind(max(batch_id - 1, self.applied))
        if reason is not None:
            self.rebuild(batch_id - 1, reason)

    def after(self, batch_id: int) -> None:
        # XX: a batch never creates the marker, so a Redis that lost it still shows the loss.
        self.redis.set(keys.BACKOFF_APPLIED, batch_id, xx=True)
        self.applied = max(self.applied, batch_id)

    def rebuild(self, batch_id: int, reason: str) -> None:
        """Put every entry of the state after ``batch_id`` back (none before batch 0)."""
        started = time.monotonic()
        entries = read_state(self.spark, self.checkpoint, batch_id) if batch_id >= 0 else []
        pending, due, skipped = restore(self.redis, self.settings.kafka_bootstrap, entries,
                                        self.settings.redelivery_tick_ms,
                                        int(time.time() * 1000))
        self.redis.set(keys.BACKOFF_APPLIED, batch_id)
        metrics.BACKOFF_REBUILDS.labels(reason).inc()
        metrics.BACKOFF_REBUILT.labels("pending").inc(pending)
        metrics.BACKOFF_REBUILT.labels("due").inc(due)
        metrics.BACKOFF_REBUILT.labels("skipped_delivered").inc(skipped)
        log.warning("redelivery indexes %s: rebuilt from the backoff state after batch %d in "
                    "%.2fs: %d pending put back, %d already due put back, %d skipped (on "
                    "the retry or dead-letter topic)", reason, batch_id,
                    time.monotonic() - started, pending, due, skipped)

    def run(self, stop: threading.Event) -> None:
        """While no micro-batch runs, check the marker on an interval; when Redis is behind,
        make the query run one (which rebuilds before anything else)."""
        nudged = 0.0
        while not stop.wait(self.settings.redis_check_interval_ms / 1000):
            try:
                if self.behind(self.applied) is None:
                    nudged = 0.0
                elif time.monotonic() - nudged >= NUDGE_EVERY_S:
                    self._nudge()
                    nudged = time.monotonic()
                self.error = None
            except Exception as exc:  # Redis or Kafka down: the next round tries again
                self.error = str(exc)
                log.warning("redelivery index check failed: %s", exc)
