"""Settings of the Spark application (`DWELL_*` environment variables)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dwell import endpoints
from dwell.settings import CommonSettings, RedisLossSettings


class SparkSettings(RedisLossSettings, CommonSettings):
    spark_jars: str = Field("", description=(
        "Comma-separated jar paths for `spark.jars` (the Kafka connector, see "
        "`spark/pom.xml`)."))
    spark_checkpoint_dir: str = Field(".dwell/spark-checkpoints", description=(
        "Where the app's streaming queries keep their checkpoints."))
    spark_master: str = Field("local[2]", description="Spark's master URL.")

    drain_trigger_ms: int = Field(250, ge=10, description=(
        "How often the drain claims due buckets."))
    drain_max_buckets: int = Field(100, ge=1, description=(
        "Most buckets claimed per topic and claim."))
    drain_lease_ms: int = Field(30000, ge=1000, description=(
        "How long a claim is the drain's before another drainer may take it over (a crash "
        "mid-write)."))
    drain_max_round_ms: int = Field(600_000, ge=1000, description=(
        "A round's leases are renewed while it works, up to this long; then it fails and "
        "its claims come back after the lease, so no round keeps buckets longer than this "
        "plus `DWELL_DRAIN_LEASE_MS`."))
    batch_stall_timeout_ms: int = Field(900_000, ge=1000, description=(
        "A micro-batch of any query still running after this long is stuck: `/healthz` "
        "answers 503, so that Kubernetes restarts the app, and the batch's stack is "
        "logged."))
    # dwell_spark.drain.choose_path picks the copy; bench/delivery.py compares them.
    drain_local_max_records: int = Field(50000, ge=0, description=(
        "Rounds up to this many records are copied on the driver, which schedules no Spark "
        "job; larger ones are spread over Spark tasks, whose parallel copies outweigh the "
        "job's fixed cost only for large rounds."))

    spark_metrics_port: int = Field(endpoints.SPARK_METRICS_PORT, ge=0, le=65535, description=(
        "Port of the app's `/metrics`, `/healthz` and `/readyz` (on `DWELL_HTTP_HOST`)."))

    backoff_trigger_ms: int = Field(250, ge=10, description=(
        "Trigger of the `dwell.acks` query. A redelivery is indexed at its due time, so "
        "this bounds lateness only for redeliveries due sooner than an event takes to "
        "process; an idle query runs no micro-batch, so a short trigger costs nothing."))
    acks_starting_offsets: Literal["earliest", "latest"] = Field("earliest", description=(
        "Where a new checkpoint starts reading `dwell.acks` when Redis holds no backoff "
        "decisions yet: `earliest` replays `DWELL_BACKOFF_REPLAY_WINDOW_MS` of it, as after "
        "losing Redis (loses no event); `latest` takes up from its end."))
    acks_max_events_per_batch: int = Field(100_000, ge=1, description=(
        "Most `dwell.acks` events in one micro-batch of the backoff: a backlog is read a "
        "bounded batch at a time. The backoff is ready once its first batch starts; "
        "`dwell_backoff_lag_events` shows what of a backlog is left."))
    backoff_replay_window_ms: int = Field(3_600_000, ge=1000, description=(
        "Losing Redis: the most of `dwell.acks` the backoff replays to rebuild the pending "
        "redeliveries. A rebuild replays as far back as any registered subscription can put "
        "off a redelivery (ack timeout plus backoff, or negative-ack backoff) plus "
        "`DWELL_BACKOFF_STATE_GRACE_MS`, up to this; `dwell.acks`'s retention must cover "
        "it."))
    acks_max_event_bytes: int = Field(64 * 1024, ge=1024, description=(
        "A bigger `dwell.acks` event is malformed and set aside on `dwell.invalid`; the "
        "SDK's are a few hundred bytes."))
    redelivery_tick_ms: int = Field(100, ge=1, description=(
        "Bucket width of the subscriptions' redelivery indexes."))
    backoff_state_grace_ms: int = Field(60000, ge=0, description=(
        "How long a scheduled redelivery's pending entry outlives its due time when the "
        "drain has not deleted it (its claim did not complete): after it, the message's "
        "events start anew."))
    backoff_registry_ttl_ms: int = Field(2000, ge=0, description=(
        "How long a worker trusts what it read from the subscription registry (also \"not "
        "registered\"): a re-registration takes effect within it, and a busy subscription "
        "costs one Redis read per worker per TTL."))
    backoff_write_timeout_ms: int = Field(60000, ge=0, description=(
        "How long a backoff micro-batch retries its (idempotent) writes while Redis or "
        "Kafka does not answer; then the app exits and its restart replays the batch from "
        "the checkpoint."))
    topic_partitions: int = Field(4, ge=1, description=(
        "Partitions of the retry and DLQ topics the app creates on first use."))
