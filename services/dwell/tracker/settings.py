"""The tracker's settings (`DWELL_*` environment variables)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from dwell import endpoints
from dwell.core import topics
from dwell.settings import (
    GROUP_SCHEMA,
    CommonSettings,
    ReadyTopicSettings,
    RedisLossSettings,
    ServiceSettings,
    dwell_group,
)


class TrackerSettings(ServiceSettings, ReadyTopicSettings, RedisLossSettings, CommonSettings):
    http_port: int = Field(endpoints.TRACKER_PORT, ge=1, le=65535,
                           description="The service's HTTP port.")
    delayed_topic: str = Field(topics.DELAYED, description=(
        "Where admission writes delayed messages, which the tracker indexes."))
    refiled_topic: str = Field("", description=(
        "Where the restage appends its copies. Empty: `dwell.delayed.refiled`, or "
        "`<delayed_topic>.refiled` for another delayed topic."))
    tracker_group_id: str = Field("dwell-tracker", json_schema_extra=GROUP_SCHEMA, description=(
        "The consumer group that indexes the delayed topic; must start with `dwell-`."))
    # One batch is one Redis pipeline: larger batches mean fewer APPENDs per message, which
    # matters most when delays are random (each bucket gets a few positions per batch).
    ingest_batch_max: int = Field(50000, ge=1, description=(
        "Most delayed records indexed in one batch (one Redis pipeline)."))
    ingest_poll_timeout_ms: int = Field(100, ge=1, description=(
        "How long the ingest waits for records in one poll."))
    compaction_interval_ms: int = Field(1000, ge=0, description=(
        "Fold a bucket's deltas (~14 B per message) into its Roaring blob at most this "
        "often."))
    compaction_max_buckets: int = Field(2000, ge=1, description=(
        "Most buckets compacted in one round."))
    compaction_busy_min_delta_bytes: int = Field(4096, ge=0, description=(
        "While records flow, compact only buckets with at least this many bytes of deltas "
        "(12 per position); when `dwell.delayed` is idle, every dirty bucket."))
    stats_refresh_s: float = Field(10.0, gt=0, description=(
        "How often the Prometheus gauges are recomputed from Redis."))

    restage_enabled: bool = Field(True, description=(
        "Re-file topics whose delays vary into dense runs of `dwell.delayed.refiled` before "
        "they come due, so the drain reads a due bucket rather than the whole delay window "
        "(`docs/internals.md`, \"Re-filing\")."))
    restage_lead_ms: int = Field(40_000, ge=1000, description=(
        "A chunk is re-filed when its first bucket is this near."))
    restage_chunk_ms: int = Field(20_000, ge=100, description=(
        "The span of buckets re-filed per round (at most the lead); one round's records, "
        "payloads included, are held in memory."))
    restage_lease_ms: int = Field(30_000, ge=1000, description=(
        "After a crash mid-round the claims come back this late; less than the lead, so "
        "they are back before the chunk is due."))
    restage_max_round_ms: int = Field(600_000, ge=1000, description=(
        "A round's leases are renewed while it works, up to this long; then it fails and "
        "its claims come back after the lease. A round past its lead holds its buckets back "
        "from the drain (late rather than twice), so this also bounds that lateness."))
    restage_max_records: int = Field(1_000_000, ge=1, description=(
        "A round takes no more topics past this many records."))
    restage_ahead_records: int = Field(100_000, ge=1, description=(
        "A topic's due chunk holding at least this many records may take the chunks after "
        "it into the same round, which reads the delay window once for all of them: when, "
        "at the last round's copy rate, the round would end within half the time left "
        "before the due chunk (`docs/internals.md`, \"Re-filing\")."))
    restage_ahead_chunks: int = Field(2, ge=0, description=(
        "How many chunks after the due one a large round takes (while the round stays "
        "within `restage_max_records`); 0: one chunk a round."))
    restage_interval_ms: int = Field(1000, ge=10, description=(
        "How often the restage looks for a chunk to re-file."))

    cancel_wait_ms: int = Field(5000, ge=0, description=(
        "How long a cancel request waits for the ingest to reach the message, or for a "
        "re-filing round that holds the message's bucket, before it answers 503 (retry)."))
    cancel_clock_margin_ms: int = Field(2000, ge=0, description=(
        "A message due within this long is answered `too late` rather than cancelled (by a "
        "cancel request, or a replacement by schedule key): the "
        "margin covers the difference between this process's clock and the drain's."))

    lowmark_interval_ms: int = Field(10_000, ge=100, description=(
        "How often the low watermarks are committed to Kafka."))
    bookkeeping_lease_ms: int = Field(30_000, ge=300, description=(
        "Of the tracker's replicas, the one holding a lease in Redis exports the index "
        "figures, commits the low watermarks and trims; the lease's length. When its holder "
        "dies, another replica takes over within it."))
    bookkeeping_lease_holder: str = Field("", max_length=253, pattern=r"^[\x21-\x7e]*$",
                                          description=(
        "This replica's id in the bookkeeping lease; empty: one made for each process. No "
        "two live trackers may share it. The chart sets it to the pod's name, so that a "
        "tracker restarted in its pod after a crash takes its own lease back at once "
        "instead of waiting out `DWELL_BOOKKEEPING_LEASE_MS`."))
    trim_interval_ms: int = Field(60_000, ge=0, description=(
        "How often the records below the committed low watermarks are deleted from the "
        "delay logs and `dwell.delivered`; 0 turns the trim off. Those topics have "
        "`segment.ms=3600000`, so their disk comes back within about an hour."))
    trim_keep_delivered_ms: int = Field(86_400_000, ge=0, description=(
        "How long the trim keeps a delay log's records after they were delivered: a "
        "message received and not yet acknowledged is redelivered (nack, ack timeout) "
        "from its record in the delay log, so the trim deletes only below the low "
        "watermarks committed at least this long ago. A redelivery due later than this "
        "after the first delivery finds its record gone and is counted lost "
        "(`dwell_messages_lost_total`). 0 deletes below the current low watermarks."))
    # Every call the ingest makes has a shorter deadline of its own; a rebuild's long read
    # of dwell.delivered goes round as records come.
    stall_timeout_ms: int = Field(120_000, ge=1000, description=(
        "An ingest loop that has not gone round for this long is stuck: `/healthz` answers "
        "503 (Kubernetes restarts the process) and its stack is logged."))

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
