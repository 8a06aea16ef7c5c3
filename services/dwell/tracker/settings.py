"""The tracker's settings (`DWELL_*` environment variables)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from dwell.core import topics
from dwell.settings import GROUP_SCHEMA, CommonSettings, dwell_group


class TrackerSettings(CommonSettings):
    http_port: int = Field(8083, ge=1, le=65535)
    # A request body above this is answered 413 before it is read whole.
    max_request_bytes: int = Field(64 * 1024, ge=1024)
    # Where admission writes delayed messages, and the consumer group that indexes them.
    delayed_topic: str = topics.DELAYED
    # Where the restage appends its copies; empty: dwell.delayed.refiled, or
    # "<delayed_topic>.refiled" for another delayed topic.
    refiled_topic: str = ""
    tracker_group_id: str = Field("dwell-tracker", json_schema_extra=GROUP_SCHEMA)
    # A subscription's registration makes its ready topic (as admission's first publish
    # would) and its retry topic, which users' principals may not create.
    allow_auto_topic_creation: bool = True
    ready_topic_partitions: int = Field(4, ge=1)
    # One batch is one Redis pipeline: larger batches mean fewer APPENDs per message, which
    # matters most when delays are random (each bucket gets a few positions per batch).
    ingest_batch_max: int = Field(50000, ge=1)
    ingest_poll_timeout_ms: int = Field(100, ge=1)
    # Fold deltas into Roaring blobs at most this often (they cost ~14 B/msg until then).
    compaction_interval_ms: int = Field(1000, ge=0)
    compaction_max_buckets: int = Field(2000, ge=1)
    # While records flow, compact only buckets with at least this many bytes of deltas
    # (12 per position); when dwell.delayed is idle, every dirty bucket.
    compaction_busy_min_delta_bytes: int = Field(4096, ge=0)
    # How often the Prometheus gauges are recomputed from Redis.
    stats_refresh_s: float = Field(10.0, gt=0)
    # Restage (dwell.tracker.restage): re-file a chunk of future buckets of topics whose
    # delays vary into dense runs of dwell.delayed, lead_ms before the chunk comes due.
    # Memory: one chunk's records (payloads included) of the topics in a round.
    restage_enabled: bool = True
    restage_lead_ms: int = Field(40_000, ge=1000)
    restage_chunk_ms: int = Field(20_000, ge=100)
    # A crash mid-round leaves the chunk claimed this long: less than the lead, so that
    # the claims are back before the chunk's first bucket is due.
    restage_lease_ms: int = Field(30_000, ge=1000)
    # A round's leases are renewed while it works (every lease / 3), up to this long; a
    # round still running then fails, and its claims come back after the lease. A round
    # that outlives its lead holds its chunk's buckets back from the drain until it
    # completes (late rather than twice), so this also bounds that lateness.
    restage_max_round_ms: int = Field(600_000, ge=1000)
    restage_max_records: int = Field(1_000_000, ge=1)
    restage_interval_ms: int = Field(1000, ge=10)

    # Losing Redis (dwell.tracker.recovery): how often the ingest checks that Redis still
    # holds what it indexed, and how often the low watermarks are committed to Kafka.
    redis_check_interval_ms: int = Field(1000, ge=50)
    lowmark_interval_ms: int = Field(10_000, ge=100)
    # How often the records below the committed low watermarks are deleted from the
    # delay logs and dwell.delivered (dwell.tracker.trim); 0 turns the trim off.
    trim_interval_ms: int = Field(60_000, ge=0)
    # A loop of the ingest that has not gone round for this long is stuck inside one call:
    # /healthz answers 503 (Kubernetes restarts the process) and its stack is logged. Every
    # call it makes has a shorter deadline of its own; a rebuild's long read of
    # dwell.delivered goes round as records come.
    stall_timeout_ms: int = Field(120_000, ge=1000)

    @field_validator("tracker_group_id")
    @classmethod
    def _dwell_group(cls, group: str) -> str:
        return dwell_group("DWELL_TRACKER_GROUP_ID", group)

    @model_validator(mode="after")
    def _restage_chunk_within_lead(self) -> TrackerSettings:
        if self.restage_chunk_ms > self.restage_lead_ms:
            raise ValueError("DWELL_RESTAGE_CHUNK_MS must not exceed DWELL_RESTAGE_LEAD_MS: "
                             "a chunk is re-filed before its first bucket is due")
        if self.restage_lease_ms >= self.restage_lead_ms:
            raise ValueError("DWELL_RESTAGE_LEASE_MS must be less than DWELL_RESTAGE_LEAD_MS: "
                             "after a crash the claims must be back before the chunk is due")
        return self

    @property
    def refile_log(self) -> str:
        if self.refiled_topic:
            return self.refiled_topic
        return topics.REFILED if self.delayed_topic == topics.DELAYED else (
            f"{self.delayed_topic}.refiled")
