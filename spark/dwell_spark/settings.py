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
    # A round's leases are renewed while it works (every lease / 3), up to this long: a
    # round still running then fails and its claims come back after the lease, so no
    # round keeps buckets longer than drain_max_round_ms + drain_lease_ms.
    drain_max_round_ms: int = Field(600_000, ge=1000)
    # A micro-batch of any query still running after this long is stuck inside a call
    # (the drain's own rounds end by drain_max_round_ms): /healthz answers 503, so that
    # Kubernetes restarts the app, and the batch's stack is logged.
    batch_stall_timeout_ms: int = Field(900_000, ge=1000)
    # Which copy runs a round (dwell_spark.drain.choose_path; bench/delivery.py compares
    # them): rounds up to drain_local_max_records records are copied on the driver, which
    # schedules no Spark job; larger ones are spread over Spark tasks, whose parallel
    # copies outweigh the job's fixed cost only for large rounds.
    drain_local_max_records: int = Field(50000, ge=0)

    # Prometheus /metrics, /healthz, /readyz of the Spark app (127.0.0.1 unless http_host).
    spark_metrics_port: int = Field(8084, ge=0, le=65535)

    # Backoff: trigger of the dwell.acks query. Each event's redelivery is written into the
    # subscription's redelivery index at its absolute due time, so this bounds lateness
    # only for redeliveries due sooner than an event takes to process (a trigger plus a
    # micro-batch, ~0.4 s idle on local[2]); the drain delivers the rest on time. The
    # query runs a micro-batch only when events came, so a short trigger costs nothing
    # idle. redelivery_tick_ms: those indexes' bucket width.
    backoff_trigger_ms: int = Field(250, ge=10)
    # Trigger of the query that sets malformed dwell.acks events aside (dwell_spark.invalid).
    # Nothing waits on it, and each of its micro-batches checks every event again on the
    # cores the backoff and the drain need, so it runs seldom and takes more per batch.
    invalid_trigger_ms: int = Field(5000, ge=10)
    # Where a fresh checkpoint starts reading dwell.acks ("earliest" loses no event).
    acks_starting_offsets: Literal["earliest", "latest"] = "earliest"
    # At most this many dwell.acks events in one micro-batch of the backoff (and of the
    # query that sets malformed ones aside): a backlog (the app was down, or the events
    # come faster than it decides) is read a bounded batch at a time, and the app is
    # ready after the first, not after all of it.
    acks_max_events_per_batch: int = Field(10000, ge=1)
    # A bigger dwell.acks event is malformed (set aside on dwell.invalid); the SDK's are
    # a few hundred bytes.
    acks_max_event_bytes: int = Field(64 * 1024, ge=1024)
    redelivery_tick_ms: int = Field(100, ge=1)
    # How long the state of a scheduled redelivery outlives its due time: an ack within it
    # still reaches the index entry (a no-op once the drain has claimed it). After it the
    # state goes; the redelivered copy's own events start a new one.
    backoff_state_grace_ms: int = Field(60000, ge=0)
    # How long a Python worker trusts what it read from the subscription registry (also
    # for "not registered"): a re-registration reaches events without settings within
    # this time, and a busy subscription costs one Redis read per worker per TTL.
    backoff_registry_ttl_ms: int = Field(2000, ge=0)
    # How long a backoff micro-batch keeps trying to write its decisions (index entries,
    # counts, dead letters) while Redis or Kafka does not answer. The writes are
    # idempotent, so each try starts over; after this the query fails, the app exits and
    # its restart replays the batch from the checkpoint.
    backoff_write_timeout_ms: int = Field(60000, ge=0)
    # Losing Redis (dwell_spark.recovery): how often an idle app checks that Redis still
    # holds the redelivery indexes (a running backoff micro-batch checks before it applies).
    redis_check_interval_ms: int = Field(1000, ge=50)
    # Shuffle partitions of the backoff state (fixed once a checkpoint exists). Each is
    # one state task per micro-batch, ~200 ms on local[2] even when idle: one is enough
    # until the events outgrow a core. Set it to the executors' cores before the first
    # start to spread the state over them.
    state_partitions: int = Field(1, ge=1)
    # Shards of each subscription's backoff state: a message's events meet in the shard its
    # messageId hashes to. Fixed once a checkpoint exists: an app started on one keeps the
    # count it records (and logs a warning when this differs). Spark calls Python once
    # per shard with events in a micro-batch, and a shard's state is written whole each
    # time, so more shards cost more per batch under load and fewer make each write
    # bigger (bench/backoff.py).
    backoff_state_shards: int = Field(64, ge=1, le=65536)

    # Partitions of retry / DLQ topics the job creates on first use.
    topic_partitions: int = Field(4, ge=1)
