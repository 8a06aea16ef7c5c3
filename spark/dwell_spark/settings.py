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
    # Which copy runs a round (dwell_spark.drain.choose_path, figures in bench/delivery.py):
    # rounds up to drain_local_max_records records are copied on the driver; larger ones
    # run as a Spark job: Python copies in Spark tasks, or, with drain_jvm_copy, through
    # Spark's Kafka source and sink when dense (offsets read <= drain_dense_factor x
    # records wanted). Measured on local[2] (2 cores shared with Kafka), 20k / 100k records:
    # driver 68-72k / 79-87k msg/s, tasks 16k / 48-60k, kafka-source 8-10k / 26-34k (an
    # earlier session). Six runs of a later session: 20k driver 60-73k, tasks 24-41k; 100k
    # driver 48-74k, tasks 55-67k (never below 50k); 200k driver 65-73k, tasks 56-71k,
    # kafka-source 38-44k. So the driver takes rounds up to 50k records, tasks the rest;
    # the JVM copy never wins on one box (it may with executors on other machines).
    drain_local_max_records: int = Field(50000, ge=0)
    drain_jvm_copy: bool = False
    drain_dense_factor: float = Field(2.0, ge=1.0)

    # Prometheus /metrics, /healthz, /readyz of the Spark app (127.0.0.1 unless http_host).
    spark_metrics_port: int = Field(8084, ge=0, le=65535)

    # Backoff: trigger of the dwell.acks query. Each event's redelivery is written into the
    # subscription's redelivery index at its absolute due time, so this bounds lateness
    # only for redeliveries due sooner than an event takes to process (a trigger plus a
    # micro-batch, ~0.4 s idle on local[2]); the drain delivers the rest on time. The
    # query runs a micro-batch only when events came, so a short trigger costs nothing
    # idle. redelivery_tick_ms: those indexes' bucket width.
    backoff_trigger_ms: int = Field(250, ge=10)
    # Where a fresh checkpoint starts reading dwell.acks ("earliest" loses no event).
    acks_starting_offsets: Literal["earliest", "latest"] = "earliest"
    redelivery_tick_ms: int = Field(100, ge=1)
    # How long the state of a scheduled redelivery outlives its due time: an ack within it
    # still reaches the index entry (a no-op once the drain has claimed it). After it the
    # state goes; the redelivered copy's own events start a new one.
    backoff_state_grace_ms: int = Field(60000, ge=0)
    # How long a Python worker trusts what it read from the subscription registry (also
    # for "not registered"): a re-registration reaches events without settings within
    # this time, and a busy subscription costs one Redis read per worker per TTL.
    backoff_registry_ttl_ms: int = Field(2000, ge=0)
    # Shuffle partitions of the backoff state (fixed once a checkpoint exists). Each is
    # one state task per micro-batch, ~200 ms on local[2] even when idle: one is enough
    # until the events outgrow a core.
    state_partitions: int = Field(1, ge=1)

    # Partitions of retry / DLQ topics the job creates on first use.
    topic_partitions: int = Field(4, ge=1)
