"""`python -m dwell.tracker`: the ingest consumer, the stats refresher and the HTTP
API in one process."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY

from dwell.adapters.kafka import ensure_topic
from dwell.adapters.redis import connect
from dwell.http import serve
from dwell.tracker.app import build_app
from dwell.tracker.ingest import IngestLoop
from dwell.tracker.settings import TrackerSettings
from dwell.tracker.stats import StatsCollector


def main() -> None:
    settings = TrackerSettings()
    r = connect(settings.redis_url)
    ensure_topic(settings.kafka_bootstrap, settings.delayed_topic, 4,
                 settings.kafka_replication_factor)
    loop = IngestLoop(connect(settings.redis_url), settings.kafka_bootstrap,
                      settings.delayed_topic, settings.tracker_group_id,
                      batch_max=settings.ingest_batch_max,
                      poll_timeout_ms=settings.ingest_poll_timeout_ms,
                      compaction_interval_ms=settings.compaction_interval_ms,
                      compaction_max_buckets=settings.compaction_max_buckets,
                      compaction_busy_min_delta_bytes=settings.compaction_busy_min_delta_bytes)
    threading.Thread(target=loop.run, name="tracker-ingest", daemon=True).start()
    collector = StatsCollector(connect(settings.redis_url), settings.cluster,
                               strict=settings.delayed_delivery_deliver_at_time_strict,
                               lookahead=settings.delayed_delivery_fixed_delay_detection_lookahead,
                               interval_s=settings.stats_refresh_s)
    REGISTRY.register(collector)
    threading.Thread(target=collector.run, name="tracker-stats", daemon=True).start()
    try:
        serve(build_app(settings, r, loop), settings)
    finally:
        loop.stop()
        collector.stop()


if __name__ == "__main__":
    main()
