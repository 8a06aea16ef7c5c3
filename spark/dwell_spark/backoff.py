"""The backoff job: reads consumers' events on dwell.acks (Spark's Kafka source) and keeps
one state per (topic, subscription, messageId) with a processing-time timer. A delivery
not acked within the subscription's ackTimeoutMs, or a nack, becomes a redelivery in the
subscription's redelivery index at the time dwell.core.backoff gives (PIP-130 / PIP-106);
after maxRedeliverCount redeliveries the message goes to the subscription's DLQ instead.

The subscription settings ride on each event (the SDK copies what it registered at the
tracker), so SDK events need no lookup. An event without them (``ackTimeoutMs`` absent: a
plain Kafka consumer that registered its subscription over the tracker's HTTP API) takes
them from the tracker's subscription registry in Redis, cached per Python worker for
REGISTRY_TTL_MS. Replays after a crash are harmless: index adds are set unions and the
redelivery count is written, not incremented."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import redis as redislib
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dwell import keys
from dwell.core import topics as names
from dwell.core.backoff import (
    ExponentialRedeliveryBackoff,
    ack_timeout_redelivery_at,
    nack_redelivery_at,
)
from dwell.core.positions import parse_message_id
from dwell.core.topics import TopicName, dlq_topic
from dwell.tracker import subscriptions as registry
from dwell.tracker.index import SubscriptionIndex

from .drain import READY_AFTER_BATCHES, TopicCache, write_ranges
from .records import Range
from .settings import SparkSettings

log = logging.getLogger("dwell.spark.backoff")

# Backoff objects stay JSON text (Spark keeps a nested object's raw text for a string field).
EVENT_SCHEMA = StructType([
    StructField("event", StringType()),
    StructField("topic", StringType()),
    StructField("subscription", StringType()),
    StructField("messageId", StringType()),
    StructField("redeliveryCount", LongType()),
    StructField("ts", LongType()),
    StructField("ackTimeoutMs", LongType()),
    StructField("ackTimeoutRedeliveryBackoff", StringType()),
    StructField("negativeAckRedeliveryBackoff", StringType()),
    StructField("maxRedeliverCount", LongType()),
])
STATE_SCHEMA = StructType([
    StructField("deliveredTs", LongType()),
    StructField("redeliveryCount", LongType()),
    StructField("ackTimeoutMs", LongType()),
    StructField("ackBackoff", StringType()),
    StructField("maxRedeliverCount", LongType()),
])
OUTPUT_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("subscription", StringType()),
    StructField("messageId", StringType()),
    StructField("action", StringType()),  # redeliver | dlq | ack
    StructField("at", LongType()),
    StructField("redeliveryCount", LongType()),
])
REDELIVER, DLQ, ACK = "redeliver", "dlq", "ack"
# How long a Python worker trusts what it read from the subscription registry (also for
# "not registered"): a re-registration reaches events without settings within this time,
# and a busy subscription costs one Redis read per worker per TTL.
REGISTRY_TTL_MS = int(os.environ.get("DWELL_BACKOFF_REGISTRY_TTL_MS", "2000"))

Lookup = Callable[[str, str], "dict[str, Any] | None"]


def _backoff(raw: Any) -> ExponentialRedeliveryBackoff | None:
    if raw is None or (isinstance(raw, float) and pd.isna(raw)) or raw == "":
        return None
    return ExponentialRedeliveryBackoff.from_json(json.loads(raw))


def _opt_int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


# Per Python worker (workers are reused across batches): Redis clients and registry reads.
_clients: dict[str, redislib.Redis] = {}
_cache: dict[tuple[str, str, str], tuple[float, dict[str, Any] | None]] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class RegistryLookup:
    """``lookup(topic, sub)``: the subscription's registered settings (the tracker's
    ``dwell:subs:{topic}`` hash), or None. Pickles as its URL, so it ships to executors;
    clients and cache live in the worker's module state."""

    redis_url: str
    ttl_ms: int = REGISTRY_TTL_MS

    def __call__(self, topic: str, sub: str) -> dict[str, Any] | None:
        key = (self.redis_url, topic, sub)
        now = time.monotonic()
        hit = _cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        with _lock:
            r = _clients.get(self.redis_url)
            if r is None:
                r = _clients[self.redis_url] = redislib.Redis.from_url(self.redis_url)
        found = registry.get(r, topic, sub)
        _cache[key] = (now + self.ttl_ms / 1000, found)
        return found


def fill_settings(events: pd.DataFrame, settings: dict[str, Any] | None) -> pd.DataFrame:
    """``events`` with the registered ``settings`` (tracker registry JSON) on every row
    that carries none (``ackTimeoutMs`` missing); rows that carry settings keep theirs."""
    if settings is None:
        return events
    bare = events["ackTimeoutMs"].isna()
    if not bare.any():
        return events
    events = events.astype({"ackTimeoutMs": "object", "maxRedeliverCount": "object",
                            "ackTimeoutRedeliveryBackoff": "object",
                            "negativeAckRedeliveryBackoff": "object"})
    events.loc[bare, "ackTimeoutMs"] = int(settings.get("ackTimeoutMs") or 0)
    for name in ("ackTimeoutRedeliveryBackoff", "negativeAckRedeliveryBackoff"):
        raw = settings.get(name)
        events.loc[bare, name] = json.dumps(raw) if raw is not None else None
    events.loc[bare, "maxRedeliverCount"] = settings.get("maxRedeliverCount")
    return events


def decide(at: int, count: int, max_redeliver: int | None) -> tuple[str, int, int]:
    """(action, at, count): redeliver as redelivery ``count + 1`` at ``at``, or dead-letter
    once ``max_redeliver`` redeliveries have happened (Pulsar's DeadLetterPolicy)."""
    if max_redeliver is not None and count >= max_redeliver:
        return DLQ, at, count
    return REDELIVER, at, count + 1


def step(key: tuple[str, str, str], batches: Iterator[pd.DataFrame],
         state: GroupState, lookup: Lookup | None = None) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState function for one (topic, subscription, messageId);
    ``lookup(topic, sub)`` supplies the settings of events that carry none."""
    topic, sub, mid = key
    out: list[tuple] = []
    if state.hasTimedOut:
        delivered, count, ack_timeout, ack_backoff, max_r = state.get
        state.remove()
        at = ack_timeout_redelivery_at(int(delivered), int(ack_timeout), _backoff(ack_backoff),
                                       int(count))
        out.append((topic, sub, mid, *decide(at, int(count), _opt_int(max_r))))
    else:
        cur = state.get if state.exists else None
        events = pd.concat(list(batches)).sort_values("ts", kind="stable")
        if lookup is not None and events["ackTimeoutMs"].isna().any():
            events = fill_settings(events, lookup(topic, sub))
        for ev in events.itertuples(index=False):
            # Plain Kafka consumers may leave out the count of a first delivery.
            count = _opt_int(ev.redeliveryCount) or 0
            if ev.event == "delivered":
                ack_timeout = _opt_int(ev.ackTimeoutMs) or 0
                cur = ((int(ev.ts), count, ack_timeout, ev.ackTimeoutRedeliveryBackoff,
                        _opt_int(ev.maxRedeliverCount)) if ack_timeout > 0 else None)
            elif ev.event == "ack":
                cur = None
                out.append((topic, sub, mid, ACK, int(ev.ts), count))
            elif ev.event == "nack":
                cur = None
                at = nack_redelivery_at(int(ev.ts), _backoff(ev.negativeAckRedeliveryBackoff),
                                        count)
                out.append((topic, sub, mid, *decide(at, count, _opt_int(ev.maxRedeliverCount))))
        if cur is not None:
            state.update(cur)
            due = cur[0] + cur[2]
            state.setTimeoutDuration(max(1, due - int(time.time() * 1000)))
        elif state.exists:
            state.remove()
    yield pd.DataFrame(out, columns=[f.name for f in OUTPUT_SCHEMA.fields])


class Scheduler:
    """Driver side: turn the state function's decisions into index entries and DLQ records."""

    def __init__(self, spark: SparkSession, settings: SparkSettings,
                 redis: redislib.Redis) -> None:
        self.spark = spark
        self.settings = settings
        self.redis = redis
        self.topics = TopicCache(settings.kafka_bootstrap, settings.topic_partitions)

    def apply(self, rows: list[Any]) -> None:
        dead: list[tuple[SubscriptionIndex, str, Range]] = []
        for row in rows:
            idx = SubscriptionIndex(self.redis, row.topic, row.subscription)
            if row.action == ACK:
                idx.forget(row.messageId)
                continue
            source, partition, offset = parse_message_id(row.messageId)
            if row.action == REDELIVER:
                # Count first: the drain reads it when it emits the redelivery.
                self.redis.hset(keys.sub_counts(row.topic, row.subscription), row.messageId,
                                int(row.redeliveryCount))
                idx.add([(source, partition, offset, int(row.at))],
                        self.settings.redelivery_tick_ms)
            else:
                target = dlq_topic(TopicName.parse(row.topic), row.subscription)
                dead.append((idx, row.messageId,
                             Range(target, source, partition, offset, offset, row.subscription,
                                   {offset: int(row.redeliveryCount)})))
        if dead:
            write_ranges(self.spark, self.settings, self.topics, [r for _, _, r in dead])
            for idx, message_id, _ in dead:
                idx.forget(message_id)


def events(spark: SparkSession, settings: SparkSettings) -> DataFrame:
    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .option("subscribe", names.ACKS)
           .option("startingOffsets", settings.acks_starting_offsets)
           .option("failOnDataLoss", "false")
           .load())
    return (raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
            .select("e.*")
            .where(F.col("topic").isNotNull() & F.col("subscription").isNotNull()
                   & F.col("messageId").isNotNull() & F.col("ts").isNotNull()))


def start(spark: SparkSession, settings: SparkSettings, redis: redislib.Redis):  # noqa: ANN201
    scheduler = Scheduler(spark, settings, redis)
    lookup = RegistryLookup(settings.redis_url)

    def _step(key: tuple[str, str, str], batches: Iterator[pd.DataFrame],
              state: GroupState) -> Iterator[pd.DataFrame]:
        return step(key, batches, state, lookup)

    def _batch(df: DataFrame, batch_id: int) -> None:
        rows = df.collect()
        if batch_id == READY_AFTER_BATCHES:
            log.info("backoff ready")
        if rows:
            scheduler.apply(rows)
            log.info("backoff: %d decisions", len(rows))

    decisions = (events(spark, settings)
                 .groupBy("topic", "subscription", "messageId")
                 .applyInPandasWithState(_step, OUTPUT_SCHEMA, STATE_SCHEMA, "Update",
                                         GroupStateTimeout.ProcessingTimeTimeout))
    return (decisions.writeStream.queryName("dwell-backoff")
            .outputMode("update")
            .foreachBatch(_batch)
            .trigger(processingTime=f"{settings.backoff_trigger_ms} milliseconds")
            .option("checkpointLocation", f"{settings.spark_checkpoint_dir}/backoff")
            .start())
