"""The tracker's settings (`DWELL_*` environment variables)."""

from __future__ import annotations

from pydantic import Field

from dwell.core import topics
from dwell.settings import CommonSettings


class TrackerSettings(CommonSettings):
    http_port: int = Field(8083, ge=1, le=65535)
    # Where admission writes delayed messages, and the consumer group that indexes them.
    delayed_topic: str = topics.DELAYED
    tracker_group_id: str = "dwell-tracker"
    # Larger batches mean fewer APPENDs per message (measured: the lever for random delays).
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
