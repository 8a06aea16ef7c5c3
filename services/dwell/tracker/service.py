"""The tracker process (`python -m dwell.tracker`): the ingest consumer, the restage
(re-filing of long, varied delays), the subscription registry's Redis check, the stats
refresher and the HTTP API in one process."""

from __future__ import annotations

import logging
import threading

from prometheus_client import REGISTRY

from dwell import memory
from dwell.adapters.kafka import (
    DWELL_TOPIC_DEFAULTS,
    KEPT_TOPIC_CONFIG,
    RetentionRefused,
    ensure_retention,
    ensure_topic,
)
from dwell.adapters.redis import connect
from dwell.core import topics
from dwell.core.positions import REFILED_FIELD_BASE
from dwell.http import serve
from dwell.tracker import metrics
from dwell.tracker.app import build_app
from dwell.tracker.index_view import IndexView
from dwell.tracker.ingest_loop import IngestLoop
from dwell.tracker.lease import Lease
from dwell.tracker.recovery import LowmarkKeeper
from dwell.tracker.registry import SubscriptionRegistry
from dwell.tracker.restage import Restager
from dwell.tracker.settings import TrackerSettings
from dwell.tracker.stats import StatsRefresher
from dwell.tracker.trim import Trimmer

log = logging.getLogger("dwell.tracker")


def log_partitions(settings: TrackerSettings, topic: str) -> int:
    """The partitions a delay log or `dwell.delivered` is created with."""
    if topic == settings.refile_log:
        return settings.refiled_topic_partitions
    if topic == topics.DELIVERED:
        return settings.delivered_topic_partitions
    return settings.delayed_topic_partitions


def keep_logs(settings: TrackerSettings) -> None:
    """Create the delay logs and dwell.delivered, or make the existing ones keep their
    records until the trim removes them; SystemExit naming the topic and the setting when
    Kafka refuses (the tracker would index messages that retention then drops)."""
    for topic in (settings.delayed_topic, settings.refile_log, topics.DELIVERED):
        ensure_topic(settings.kafka_bootstrap, topic, log_partitions(settings, topic),
                     settings.kafka_replication_factor, KEPT_TOPIC_CONFIG)
        try:
            ensure_retention(settings.kafka_bootstrap, topic)
        except RetentionRefused as exc:
            log.error("refusing to start: %s", exc)
            raise SystemExit(f"dwell tracker refuses to start: {exc}") from exc


def start_ingest(settings: TrackerSettings, topic: str, thread: str,
                 field_base: int = 0) -> IngestLoop:
    """An ingest loop of the delay log ``topic`` (created if missing) on a thread of its own;
    its positions are indexed as ``settings.delayed_topic``'s, fields from ``field_base``."""
    ensure_topic(settings.kafka_bootstrap, topic, log_partitions(settings, topic),
                 settings.kafka_replication_factor, KEPT_TOPIC_CONFIG)
    loop = IngestLoop(connect(settings.redis_url), settings.kafka_bootstrap, topic,
                      settings.tracker_group_id, source=settings.delayed_topic,
                      field_base=field_base, batch_max=settings.ingest_batch_max,
                      poll_timeout_ms=settings.ingest_poll_timeout_ms,
                      compaction_interval_ms=settings.compaction_interval_ms,
                      compaction_max_buckets=settings.compaction_max_buckets,
                      compaction_busy_min_delta_bytes=settings.compaction_busy_min_delta_bytes,
                      redis_check_interval_ms=settings.redis_check_interval_ms,
                      clock_margin_ms=settings.cancel_clock_margin_ms)
    threading.Thread(target=loop.run, name=thread, daemon=True).start()
    return loop


def main() -> None:
    memory.configure()  # before the ingest's first fetch
    settings = TrackerSettings()
    r = connect(settings.redis_url)
    keep_logs(settings)
    loop = start_ingest(settings, settings.delayed_topic, "tracker-ingest")
    # The restage's copies, indexed under the delay log's name with fields of their own.
    refiled = start_ingest(settings, settings.refile_log, "tracker-ingest-refiled",
                           field_base=REFILED_FIELD_BASE)
    # One view of the index for the low watermarks, the stats and the HTTP stats.
    view = IndexView(connect(settings.redis_url))
    # One replica at a time keeps the low watermarks, trims and exports the index figures.
    lease = Lease(connect(settings.redis_url), settings.bookkeeping_lease_ms,
                  holder=settings.bookkeeping_lease_holder or None)
    lease.renew()  # a single tracker exports its figures from the first round
    threading.Thread(target=lease.run, name="tracker-lease", daemon=True).start()
    keeper = LowmarkKeeper(view, settings.kafka_bootstrap,
                           settings.tracker_group_id, delayed_topic=settings.delayed_topic,
                           refiled_topic=settings.refile_log,
                           interval_s=settings.lowmark_interval_ms / 1000,
                           leading=lease.held)
    threading.Thread(target=keeper.run, name="tracker-lowmark", daemon=True).start()
    trimmer = Trimmer(settings.kafka_bootstrap, settings.tracker_group_id,
                      delayed_topic=settings.delayed_topic, refiled_topic=settings.refile_log,
                      interval_s=settings.trim_interval_ms / 1000,
                      keep_delivered_s=settings.trim_keep_delivered_ms / 1000,
                      redis=connect(settings.redis_url), leading=lease.held)
    if settings.trim_interval_ms:
        threading.Thread(target=trimmer.run, name="tracker-trim", daemon=True).start()
    parts, config = DWELL_TOPIC_DEFAULTS[topics.SUBSCRIPTIONS]
    ensure_topic(settings.kafka_bootstrap, topics.SUBSCRIPTIONS, parts,
                 settings.kafka_replication_factor, config)
    registry = SubscriptionRegistry(r, settings.kafka_bootstrap,
                                    compression_type=settings.kafka_compression_type)
    registry_stop = threading.Event()
    threading.Thread(target=registry.run,
                     args=(settings.redis_check_interval_ms / 1000, registry_stop),
                     name="tracker-registry", daemon=True).start()
    restager = None
    if settings.restage_enabled:
        restager = Restager(connect(settings.redis_url), settings.kafka_bootstrap,
                            delayed_topic=settings.delayed_topic,
                            refiled_topic=settings.refile_log,
                            lead_ms=settings.restage_lead_ms,
                            chunk_ms=settings.restage_chunk_ms,
                            lease_ms=settings.restage_lease_ms,
                            max_round_ms=settings.restage_max_round_ms,
                            max_records=settings.restage_max_records,
                            ahead_records=settings.restage_ahead_records,
                            ahead_chunks=settings.restage_ahead_chunks,
                            compression_type=settings.kafka_compression_type)
        threading.Thread(target=restager.run, args=(settings.restage_interval_ms,),
                         name="tracker-restage", daemon=True).start()
    collector = StatsRefresher(view, settings.cluster,
                               strict=settings.delayed_delivery_deliver_at_time_strict,
                               lookahead=settings.delayed_delivery_fixed_delay_detection_lookahead,
                               interval_s=settings.stats_refresh_s,
                               rebuilding=lambda: bool(loop.rebuilding or refiled.rebuilding),
                               leading=lease.held)
    REGISTRY.register(metrics.INDEX_STATS)
    threading.Thread(target=collector.run, name="tracker-stats", daemon=True).start()
    try:
        serve(build_app(settings, r, loop, refiled, restager, keeper, registry,
                        view=view), settings)
    finally:
        registry_stop.set()
        registry.close()
        keeper.stop()
        lease.stop()
        trimmer.stop()
        loop.stop()
        refiled.stop()
        collector.stop()
        if restager is not None:
            restager.stop()
