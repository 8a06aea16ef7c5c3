"""The tracker's Prometheus metrics, all declared here: the ingest, rebuild, restage and
recovery counters, and the index figures (Pulsar's metric names where Pulsar has one),
served from the snapshot `dwell.tracker.stats` refreshes in the background."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dwell.core.topics import TopicName
from dwell.index import marks

INGESTED = Counter("dwell_tracker_ingested_total", "Positions indexed from dwell.delayed")
BOOKKEEPING = Gauge("dwell_tracker_bookkeeping",
                    "1 on the tracker replica that holds the bookkeeping lease (it exports the "
                    "index figures, commits the low watermarks and trims), 0 on the others")
INVALID = Counter("dwell_tracker_invalid_records_total",
                  "dwell.delayed records without a usable key, deliver-at or tick-time header")
FLUSH_SECONDS = Histogram("dwell_tracker_flush_seconds", "Redis write of one ingest batch",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
CANCELS_RESTORED = Counter("dwell_tracker_cancels_restored_total",
                           "Cancellations a rebuild of the index put back from the cancel "
                           "marks of dwell.delivered")
CANCELS_SWEPT = Counter("dwell_tracker_cancels_swept_total",
                        "Cancellations dropped because their bucket was long gone")
REPLACED = Counter("dwell_tracker_replaced_messages_total", "Pending delayed messages "
                   "cancelled because a newer one with their schedule key was published",
                   ["topic"])
SCHEDULE_KEYS_SWEPT = Counter("dwell_tracker_schedule_keys_swept_total",
                              "Schedule keys dropped because their message was delivered")
CANCELS = Counter("dwell_tracker_cancel_requests_total", "Requests to cancel a delayed "
                  "message, by answer (cancelled, delivered, not_found, too_late, busy)",
                  ["answer"])
COMPACTED = Counter("dwell_tracker_compacted_buckets_total", "Buckets whose deltas were folded")
VIEW_READS = Counter("dwell_tracker_index_view_buckets_read_total",
                     "Buckets the tracker's index view read for the stats and the low "
                     "watermarks, by why: changed (named in the topic's changes stream) or "
                     "whole (a topic read whole: its first sync, or its place in the stream "
                     "was lost)", ["why"])
LOOP_ROUND_AGE = Gauge("dwell_tracker_loop_round_age_seconds",
                       "Seconds since a loop of the tracker last went round; past "
                       "DWELL_STALL_TIMEOUT_MS its /healthz answers 503", ["loop"])
REBUILDS = Counter("dwell_tracker_index_rebuilds_total",
                   "Delay-log partitions re-read because Redis lost index writes, by reason",
                   ["reason"])
REBUILT = Counter("dwell_tracker_rebuild_positions_total",
                  "Positions a rebuild re-read: indexed again, or skipped as delivered",
                  ["outcome"])
REBUILT_DUE = Counter("dwell_tracker_rebuild_due_total",
                      "Positions a rebuild indexed again that were already due: the drain "
                      "delivers them at once (late); those whose claim was in flight when "
                      "Redis lost them reach the ready topic twice")
RESTAGED = Counter("dwell_tracker_restaged_total",
                   "Delayed messages re-filed into dense runs of dwell.delayed")
RESTAGE_LEFT = Counter("dwell_tracker_restage_left_total",
                       "Delayed messages of a chunk left where they lie in the delay log: "
                       "at the measured copy rate they would have been re-filed after "
                       "they were due, or the chunk's lead passed before a round took it")
RESTAGE_SECONDS = Histogram("dwell_tracker_restage_seconds",
                            "One restage round (claim, read, write, complete)",
                            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40))
RESTAGE_LEASE_RENEWALS = Counter("dwell_tracker_restage_lease_renewals_total",
                                 "Leases of claimed buckets renewed while a restage round "
                                 "re-filed them")
RESTAGE_LEASES_LOST = Counter("dwell_tracker_restage_leases_lost_total",
                              "Claimed buckets whose lease another round took before the "
                              "restage completed them (their remaining records are not "
                              "re-filed by this round)")
REGISTRY_REBUILDS = Counter("dwell_tracker_subscription_registry_rebuilds_total",
                            "Rebuilds of the subscription registry from dwell.subscriptions "
                            "because Redis lost it or rolled back, by reason", ["reason"])
REGISTRY_REBUILD_SECONDS = Histogram("dwell_tracker_subscription_registry_rebuild_seconds",
                                     "One rebuild of the subscription registry",
                                     buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
TRIMMED = Counter("dwell_tracker_trimmed_records_total",
                  "Records deleted below what is pending (DeleteRecords): delay-log records "
                  "below the low watermarks, dwell.delivered marks no rebuild needs",
                  ["topic"])
TRIM_ROUNDS = Counter("dwell_tracker_trim_rounds_total", "Rounds of the trim, by outcome",
                      ["outcome"])
# Declared with the marks (the Spark app writes them too); served here.
MARKS_WRITTEN = marks.MARKS_WRITTEN

_TOPIC = ["cluster", "namespace", "topic"]
_SUBSCRIPTION = [*_TOPIC, "subscription"]
# family name -> (help, labels, the snapshot field it shows)
_TOPIC_FAMILIES = {
    "pulsar_delayed_message_index_size_bytes":
        ("Bytes the topic's delayed-message index uses in Redis", "bufferMemoryBytes"),
    "pulsar_delayed_message_index_bucket_total":
        ("Buckets in the topic's delayed-message index", "buckets"),
    "dwell_tracker_delayed_messages":
        ("Delayed messages indexed (distinct positions), the cancelled ones left out",
         "delayedMessages"),
    "dwell_tracker_cancelled_messages":
        ("Cancelled messages the drain has not passed over yet", "cancelledMessages"),
    "dwell_tracker_schedule_keys":
        ("Schedule keys whose newest message may be pending", "scheduleKeys"),
    "dwell_tracker_next_due_at_ms": ("Earliest bucket start (ms since epoch)", "nextDueAt"),
    "dwell_tracker_drain_lag_ms": ("now - oldest due unclaimed bucket", "drainLagMs"),
    "dwell_tracker_fixed_delay_detected":
        ("1 while fixed-delay detection (as InMemoryDelayedDeliveryTracker) holds",
         "fixedDelayDetected"),
}
_SUBSCRIPTION_FAMILIES = {
    "pulsar_subscription_delayed": "Delayed messages a subscription will receive",
    "dwell_tracker_subscription_pending_redeliveries":
        "Redeliveries waiting in the subscription's index",
    "pulsar_subscription_delayed_message_index_size_bytes":
        "Bytes of the delayed-message index a subscription reads: the topic's shared index "
        "plus its own redeliveries' index",
}


def subscription_index_bytes(s: dict[str, Any], sub: str) -> int:
    """One subscription's delayedMessageIndexSizeInBytes in a `topic_stats` snapshot: the
    shared index plus its own redeliveries' index."""
    return int(s["bufferMemoryBytes"]) + int(s["subscriptions"][sub]["redeliveryIndexBytes"])


class IndexStats(Collector):
    """The index figures per topic and subscription. A scrape serves the last snapshot
    (`dwell.tracker.stats.StatsRefresher` replaces it), so it never waits on Redis."""

    def __init__(self) -> None:
        self.cluster = ""
        self.snapshot: list[dict[str, Any]] = []

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for name, (text, _) in _TOPIC_FAMILIES.items():
            yield GaugeMetricFamily(name, text, labels=_TOPIC)
        for name, text in _SUBSCRIPTION_FAMILIES.items():
            yield GaugeMetricFamily(name, text, labels=_SUBSCRIPTION)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        topic_fams = [(GaugeMetricFamily(name, text, labels=_TOPIC), field)
                      for name, (text, field) in _TOPIC_FAMILIES.items()]
        sub_delayed, pending, sub_bytes = (GaugeMetricFamily(name, text, labels=_SUBSCRIPTION)
                                           for name, text in _SUBSCRIPTION_FAMILIES.items())
        for s in self.snapshot:
            try:
                ns = TopicName.parse(s["topic"]).namespace_name
            except ValueError:
                ns = ""
            lv = [self.cluster, ns, s["topic"]]
            for fam, field in topic_fams:
                fam.add_metric(lv, int(s[field] or 0))
            for sub, ss in s["subscriptions"].items():
                sub_delayed.add_metric([*lv, sub], s["delayedMessages"])
                pending.add_metric([*lv, sub], ss["pendingRedeliveries"])
                sub_bytes.add_metric([*lv, sub], subscription_index_bytes(s, sub))
        for fam, _ in topic_fams:
            yield fam
        yield sub_delayed
        yield pending
        yield sub_bytes


INDEX_STATS = IndexStats()
