"""The drain: each trigger claims the due buckets of every topic's index and every
subscription's redelivery index (the tracker's Lua claim, so two drainers never emit one
bucket), copies the indexed records from their source topic to the ready / retry topic
through Spark (ranges spread over executors, written with Spark's Kafka sink), and only
then completes the claims. A crash between write and complete re-emits the bucket once
its lease expires; the SDK drops the repeats by (dwell-message-id, redelivery count)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis as redislib
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    StringType,
    StructField,
    StructType,
)

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.positions import coalesce, format_message_id
from dwell.core.topics import TopicName, retry_topic
from dwell.tracker.index import (
    ClaimedBucket,
    SubscriptionIndex,
    TopicIndex,
    due_subscriptions,
    due_topics,
)

from .records import Range, read_ranges
from .settings import SparkSettings

log = logging.getLogger("dwell.spark.drain")
# The first micro-batches of a fresh query take seconds (planning, worker start); after
# this many the trigger keeps its pace, and the app says so in its log.
READY_AFTER_BATCHES = 2

OUTPUT_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType(), False),
        StructField("value", BinaryType(), True),
    ])), True),
])


@dataclass
class Claim:
    index: TopicIndex | SubscriptionIndex
    bucket: ClaimedBucket


class TopicCache:
    """Kafka topics known to exist, so each is created (if missing) once per process."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.known: set[str] = set()

    def ensure(self, topics: Sequence[str]) -> None:
        for t in set(topics) - self.known:
            try:
                kafka.partitions(self.bootstrap, t)
            except kafka.KafkaUnavailable:
                # Missing: create it. (ensure_topic on an existing topic with fewer
                # partitions than asked would wait for partitions that never come.)
                kafka.ensure_topic(self.bootstrap, t, self.partitions)
            self.known.add(t)


def write_ranges(spark: SparkSession, settings: SparkSettings, topics: TopicCache,
                 ranges: Sequence[Range]) -> int:
    """Copy every record of ``ranges`` to its target topic; returns the records written.
    Returns only once Spark's Kafka sink has every record acknowledged (acks=all)."""
    if not ranges:
        return 0
    topics.ensure([r.target for r in ranges])
    bootstrap = settings.kafka_bootstrap
    # Ranges hold only indexed offsets, so their sizes add up to the records written.
    n = sum(r.last - r.first + 1 for r in ranges)
    if n <= settings.drain_local_max_records:
        # A Spark job costs 0.3-1 s of scheduling even for one record; a small round is
        # read and written on the driver (same code, same acks=all) to keep lateness low.
        write_locally(bootstrap, ranges)
        return n
    slices = max(1, min(len(ranges), spark.sparkContext.defaultParallelism * 2))
    # Spread (source, partition) runs over tasks; one Kafka consumer per task.
    ordered = sorted(ranges, key=lambda r: (r.source, r.partition, r.first))
    rdd = spark.sparkContext.parallelize(ordered, slices).mapPartitions(
        lambda part: read_ranges(bootstrap, part))
    (spark.createDataFrame(rdd, OUTPUT_SCHEMA).write.format("kafka")
     .option("kafka.bootstrap.servers", bootstrap)
     .option("kafka.acks", "all")
     .option("kafka.enable.idempotence", "true")
     .save())
    return n


def write_locally(bootstrap: str, ranges: Sequence[Range]) -> None:
    """The driver-side path of :func:`write_ranges`: returns once every record is acked."""
    producer = kafka.Producer(bootstrap, linger_ms=0)
    try:
        futures = [producer.send(topic, value, key=key, headers=dict(headers))
                   for topic, key, value, headers in read_ranges(bootstrap, ranges)]
        producer.flush()
        for f in futures:
            f.result()
    finally:
        producer.close()


def topic_ranges(topic: str, bucket: ClaimedBucket) -> list[Range]:
    target = TopicName.parse(topic).kafka_topic
    return [Range(target, names.DELAYED, int(p), a, b)
            for p, offsets in bucket.positions.items() for a, b in coalesce(offsets)]


def redelivery_ranges(index: SubscriptionIndex, bucket: ClaimedBucket) -> list[Range]:
    target = retry_topic(TopicName.parse(index.topic), index.subscription)
    out = []
    for field, offsets in bucket.positions.items():
        source, _, part = str(field).rpartition(":")
        for a, b in coalesce(offsets):
            counts = {o: max(1, index.redelivery_count(format_message_id(source, int(part), o)))
                      for o in range(a, b + 1)}
            out.append(Range(target, source, int(part), a, b, index.subscription, counts))
    return out


class Drainer:
    """What one drain trigger does, driver side."""

    def __init__(self, spark: SparkSession, settings: SparkSettings,
                 redis: redislib.Redis) -> None:
        self.spark = spark
        self.settings = settings
        self.redis = redis
        self.topics = TopicCache(settings.kafka_bootstrap, settings.topic_partitions)
        self.strict = settings.delayed_delivery_deliver_at_time_strict

    def claim(self, now_ms: int) -> tuple[list[Claim], list[Range]]:
        s = self.settings
        claims: list[Claim] = []
        ranges: list[Range] = []
        for topic in due_topics(self.redis, now_ms, self.strict):
            idx = TopicIndex(self.redis, topic)
            for b in idx.claim(now_ms, s.drain_max_buckets, s.drain_lease_ms, self.strict):
                claims.append(Claim(idx, b))
                ranges += topic_ranges(topic, b)
        for topic, sub in due_subscriptions(self.redis, now_ms):
            sidx = SubscriptionIndex(self.redis, topic, sub)
            # Redeliveries are never early: only buckets whose last millisecond passed.
            cutoff = now_ms - s.redelivery_tick_ms + 1
            for b in sidx.claim(now_ms, s.drain_max_buckets, s.drain_lease_ms, cutoff):
                claims.append(Claim(sidx, b))
                ranges += redelivery_ranges(sidx, b)
        return claims, ranges

    def run_once(self, now_ms: int | None = None) -> int:
        """Claim, write, complete; returns the records written."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        claims, ranges = self.claim(now)
        if not claims:
            return 0
        written = write_ranges(self.spark, self.settings, self.topics, ranges)
        for c in claims:
            if not c.index.complete(c.bucket.bucket_start, c.bucket.lease_id):
                # Our lease expired and another drainer holds the bucket: it re-emits,
                # the SDK drops the repeats.
                log.warning("claim on bucket %s lost before completion", c.bucket.bucket_start)
        log.info("drained %d records from %d buckets", written, len(claims))
        return written


def start(spark: SparkSession, settings: SparkSettings, redis: redislib.Redis):  # noqa: ANN201
    """The drain as a streaming query: a one-row source ticks every trigger, foreachBatch
    runs one claim-write-complete round on the driver."""
    drainer = Drainer(spark, settings, redis)

    def _batch(_df: DataFrame, batch_id: int) -> None:
        try:
            drainer.run_once()
            if batch_id == READY_AFTER_BATCHES:
                log.info("drain ready")
        except Exception:  # noqa: BLE001 - Kafka, Redis or a Spark job; all retriable
            # Claims stay leased and come back after drain_lease_ms; keep the query alive.
            log.exception("drain round failed; its claims come back after the lease")

    # rate-micro-batch offers a row per trigger; plain `rate` advances in whole seconds,
    # so triggers between them find no input and the drain would run once a second.
    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
            .writeStream.queryName("dwell-drain")
            .foreachBatch(_batch)
            .trigger(processingTime=f"{settings.drain_trigger_ms} milliseconds")
            .option("checkpointLocation", f"{settings.spark_checkpoint_dir}/drain")
            .start())
