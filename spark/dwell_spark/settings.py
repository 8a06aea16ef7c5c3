"""Settings of the Spark application (`DWELL_*` environment variables)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dwell.settings import CommonSettings


class SparkSettings(CommonSettings):
    # Comma-separated jar paths for spark.jars (the Kafka connector, see spark/pom.xml).
    spark_jars: str = ""
    spark_checkpoint_dir: str = ".dwell/spark-checkpoints"
    spark_master: str = "local[2]"

    # Drain: how often it claims due buckets, how many per topic and claim, and how long
    # a claim is ours before another drainer may take it over (a crash mid-write).
    drain_trigger_ms: int = Field(250, ge=10)
    drain_max_buckets: int = Field(100, ge=1)
    drain_lease_ms: int = Field(30000, ge=1000)
    # Rounds up to this many records are copied on the driver; larger ones run as a Spark
    # job with the ranges spread over executors and Spark's Kafka sink. Measured on
    # local[2] (bench/delivery.py): driver 15-17k msg/s, Spark job 6k (20k msgs) to 14.5k
    # (100k msgs) msg/s, so the job pays off only with executors beyond the driver's box.
    drain_local_max_records: int = Field(20000, ge=0)

    # Backoff: trigger of the dwell.acks query (timers fire at most this late) and the
    # bucket width of the redelivery indexes.
    backoff_trigger_ms: int = Field(1000, ge=10)
    # Where a fresh checkpoint starts reading dwell.acks ("earliest" loses no event).
    acks_starting_offsets: Literal["earliest", "latest"] = "earliest"
    redelivery_tick_ms: int = Field(100, ge=1)
    # Shuffle partitions of the backoff state (fixed once a checkpoint exists).
    state_partitions: int = Field(2, ge=1)

    # Partitions of retry / DLQ topics the job creates on first use.
    topic_partitions: int = Field(4, ge=1)
