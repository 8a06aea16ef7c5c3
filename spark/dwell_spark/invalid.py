"""dwell.acks as the backoff job reads it: every event checked (dwell.core.invalid) before
the job uses it. Good events go on to the backoff query; malformed ones go to
`dwell.invalid` with their reason, through a query of their own, so that no event can
stop or crash-loop the backoff query (a bad messageId or backoff would fail its
micro-batch, and the batch would fail again on every restart).

The side query is at-least-once: a crash between writing a batch's records and its
checkpoint writes them again."""

from __future__ import annotations

import logging
from typing import Any, Final

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.core import invalid
from dwell.core import topics as names

from . import metrics
from .settings import SparkSettings

log = logging.getLogger("dwell.spark.invalid")

CHECK_SCHEMA: Final = StructType([StructField("kind", StringType()),
                                  StructField("reason", StringType())])
# kafka.fetch.max.wait.ms of the side query, as the backoff query's.
FETCH_MAX_WAIT_MS: Final = 10


def check_events(values: pd.Series, auths: pd.Series, max_bytes: int,
                 system_topics: frozenset[str]) -> pd.DataFrame:
    """(kind, reason) of each event, both None for a good one: ``values`` are the raw
    record values, ``auths`` each record's `dwell-authorization` header values."""
    kinds: list[str | None] = []
    reasons: list[str | None] = []
    for value, auth in zip(values, auths, strict=True):
        try:
            invalid.check_size(value, max_bytes, "acks_max_event_bytes")
            invalid.authorization([] if auth is None else list(auth))
            invalid.check_ack_event(value, max_bytes, system_topics)
        except invalid.Malformed as exc:
            kinds.append(exc.kind)
            reasons.append(exc.reason[:invalid.MAX_REASON_CHARS])
            continue
        kinds.append(None)
        reasons.append(None)
    return pd.DataFrame({"kind": kinds, "reason": reasons})


def _checker(max_bytes: int, system_topics: frozenset[str]) -> Any:
    @F.pandas_udf(CHECK_SCHEMA)  # type: ignore[call-overload]
    def check(values: pd.Series, auths: pd.Series) -> pd.DataFrame:
        return check_events(values, auths, max_bytes, system_topics)
    return check


def _auth_values() -> Column:
    """The record's `dwell-authorization` header values (an empty array without one)."""
    headers = F.coalesce(F.col("headers"), F.array().cast("array<struct<key:string,"
                                                          "value:binary>>"))
    return F.transform(F.filter(headers, lambda h: h["key"] == F.lit(hdr.AUTHORIZATION)),
                       lambda h: h["value"])


def checked_acks(spark: SparkSession, settings: SparkSettings,
                 system_topics: frozenset[str]) -> DataFrame:
    """dwell.acks as a stream, each record with `bad` (kind, reason: null when good)."""
    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .option("subscribe", names.ACKS)
           .option("startingOffsets", settings.acks_starting_offsets)
           .option("failOnDataLoss", "false")
           .option("includeHeaders", "true")
           .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
           .load())
    check = _checker(settings.acks_max_event_bytes, system_topics)
    return raw.withColumn("bad", check(F.col("value"), _auth_values()))


def write_invalid(rows: list[Any], producer: kafka.Producer) -> None:
    """Put a batch's malformed events on dwell.invalid and count them."""
    futures = []
    for row in rows:
        topic, value, key, headers, _ = invalid.invalid_record(
            names.ACKS, int(row.partition), int(row.offset), row.key, row.value,
            row.kind, row.reason)
        futures.append(producer.send(topic, value, key, dict(headers)))
        metrics.INVALID_RECORDS.labels(names.ACKS, row.kind).inc()
    for f in futures:
        f.result(30)


def start(spark: SparkSession, settings: SparkSettings, system_topics: frozenset[str]) -> Any:
    """The side query: malformed dwell.acks events to dwell.invalid."""
    producer = kafka.Producer(settings.kafka_bootstrap, linger_ms=0,
                              compression_type=settings.kafka_compression_type)

    def _batch(df: DataFrame, batch_id: int) -> None:
        rows = df.collect()
        if rows:
            write_invalid(rows, producer)
            log.warning("dwell.acks: %d malformed events set aside on %s (first: %s)",
                        len(rows), names.INVALID, rows[0].reason)

    bad = (checked_acks(spark, settings, system_topics)
           .where(F.col("bad.kind").isNotNull())
           .select("partition", "offset", "key", "value", "bad.kind", "bad.reason"))
    return (bad.writeStream.queryName("dwell-acks-invalid")
            .foreachBatch(_batch)
            .trigger(processingTime=f"{settings.backoff_trigger_ms} milliseconds")
            .option("checkpointLocation", f"{settings.spark_checkpoint_dir}/acks-invalid")
            .start())
