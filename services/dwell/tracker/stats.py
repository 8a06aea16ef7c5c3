"""Figures about a topic's index, measured from Redis: message count (distinct
positions), bytes (MEMORY USAGE of every key; the buckets' kept up to date by
dwell.tracker.index_view), buckets, due times, drain lag, the
fixed-delay flag (detected as Pulsar's InMemoryDelayedDeliveryTracker does),
per-subscription pending redeliveries; and the thread that keeps the tracker's metrics
(`dwell.tracker.metrics.INDEX_STATS`) up to date with them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import redis as redislib

from dwell import keys
from dwell.core.buckets import bucket_due_cutoff
from dwell.index import subscriptions
from dwell.index.redelivery import SubscriptionIndex
from dwell.index.topic import CANCEL_KEEP_MS, REPLACED_FIELD, TopicIndex
from dwell.tracker import metrics
from dwell.tracker.index_view import IndexView
from dwell.tracker.ingest import FIXED_FIELD
from dwell.tracker.metrics import subscription_index_bytes

log = logging.getLogger("dwell.tracker.stats")

# Upper bounds (ms from now) of the due-time histogram; "+Inf" is implied last.
HISTOGRAM_BOUNDS_MS: Final = (0, 1000, 10000, 60000, 600000, 3600000, 86400000)


def topics(r: redislib.Redis) -> list[str]:
    return sorted(t.decode() for t in r.smembers(keys.TOPICS))


def topic_stats(view: IndexView, topic: str, now_ms: int, *, strict: bool,
                lookahead: int) -> dict[str, Any]:
    """The figures of ``topic``'s index, its buckets from ``view`` synced now."""
    r = view.redis
    fig = view.figures(topic)
    idx = TopicIndex(r, topic)
    ks = idx.keys
    tick = idx.tick_time_ms() or 1
    cutoff = bucket_due_cutoff(now_ms, tick, strict)
    pipe = r.pipeline(transaction=False)
    pipe.zrange(ks.index, "-inf", cutoff, byscore=True, offset=0, num=1)
    pipe.zrange(ks.claims, 0, -1)
    pipe.hgetall(keys.stats(topic))
    for name in (ks.index, ks.dirty, ks.claims, ks.leases, ks.changes, keys.stats(topic),
                 ks.cancelled, ks.scheduled):
        pipe.memory_usage(name, samples=0)
    first_due, claimed, raw, *sizes = pipe.execute()
    # A claimed bucket may also be back in the index (its lease expired).
    in_index = r.zmscore(ks.index, claimed) if claimed else []
    total = int(fig.counts.sum())
    fixed = raw.get(FIXED_FIELD.encode()) == b"1"
    histogram = []
    for i in range(len(HISTOGRAM_BOUNDS_MS) + 1):
        bound = HISTOGRAM_BOUNDS_MS[i] if i < len(HISTOGRAM_BOUNDS_MS) else None
        histogram.append({"le": "+Inf" if bound is None else str(bound),
                          "count": total if bound is None else fig.due_by(now_ms + bound)})
    # Cancelled messages stay in their buckets until the drain passes them over.
    cancelled = idx.cancellations()
    scheduled = idx.schedule_keys()
    subs = {}
    for name in subscriptions.names(r, topic):
        sidx = SubscriptionIndex(r, topic, name)
        subs[name] = {"pendingRedeliveries": sum(sidx.counts().values()),
                      "redeliveryIndexBytes": sidx.memory_bytes()}
    return {
        "topic": topic,
        "delayedMessages": max(0, total - cancelled),
        "cancelledMessages": cancelled,
        "replacedMessages": int(raw.get(REPLACED_FIELD.encode(), 0)),
        "scheduleKeys": scheduled,
        "bufferMemoryBytes": int(fig.nbytes.sum()) + sum(x or 0 for x in sizes),
        "buckets": len(fig.starts),
        "claimedBuckets": sum(1 for x in in_index if x is None),
        "tickTimeMs": tick,
        "nextDueAt": int(fig.starts[0]) if len(fig.starts) else None,
        "drainLagMs": max(0, now_ms - int(float(first_due[0]))) if first_due else 0,
        "fixedDelayDetected": bool(fixed and lookahead > 0 and total >= lookahead),
        "dueHistogram": histogram,
        "subscriptions": subs,
    }


# Pages of about a thousand schedule keys a topic's sweep looks at per refresh, at most.
KEY_SWEEP_PAGES: Final = 10


class StatsRefresher:
    """Refreshes the index figures the tracker's metrics serve
    (`dwell.tracker.metrics.INDEX_STATS`) in the background, so a scrape never waits on
    Redis."""

    def __init__(self, view: IndexView, cluster: str, *, strict: bool, lookahead: int,
                 interval_s: float, rebuilding: Callable[[], bool] = lambda: False,
                 leading: Callable[[], bool] = lambda: True) -> None:
        self.view = view
        self.redis = view.redis
        self.strict = strict
        self.lookahead = lookahead
        self.interval_s = interval_s
        # Whether an ingest loop rebuilds the index: no sweep meanwhile, since a bucket
        # not indexed again yet looks gone.
        self.rebuilding = rebuilding
        # Whether this replica holds the bookkeeping lease (dwell.tracker.lease): only its
        # figures are exported, so each topic's are exported once.
        self.leading = leading
        metrics.INDEX_STATS.cluster = cluster
        self._stop = threading.Event()
        # Per topic, where the sweep of its schedule keys goes on at the next refresh.
        self._key_cursors: dict[str, int] = {}

    def refresh(self) -> None:
        if not self.leading():
            # Another replica exports the figures. This one keeps its view in step, so
            # that the HTTP stats it answers read what changed, not whole topics.
            metrics.INDEX_STATS.snapshot = []
            self.view.sync_all()
            return
        now = int(time.time() * 1000)
        snapshot = [
            topic_stats(self.view, t, now, strict=self.strict, lookahead=self.lookahead)
            for t in topics(self.redis)]
        metrics.INDEX_STATS.snapshot = snapshot
        if not self.rebuilding():
            # Only topics with cancellations (the stats just counted them) cost a script.
            swept = sum(TopicIndex(self.redis, s["topic"]).sweep_cancelled(
                now - CANCEL_KEEP_MS) for s in snapshot if s["cancelledMessages"])
            metrics.CANCELS_SWEPT.inc(swept)
            for s in snapshot:
                if s["scheduleKeys"]:
                    self._sweep_schedule_keys(TopicIndex(self.redis, s["topic"]),
                                              now - CANCEL_KEEP_MS)

    def _sweep_schedule_keys(self, idx: TopicIndex, before: int) -> None:
        """Drop schedule keys of the topic whose message was delivered: up to
        KEY_SWEEP_PAGES pages of keys a refresh (each page one short script), going on
        where the last refresh stopped."""
        cursor = self._key_cursors.pop(idx.topic, 0)
        for _ in range(KEY_SWEEP_PAGES):
            cursor, dropped = idx.sweep_schedule_keys(before, cursor)
            metrics.SCHEDULE_KEYS_SWEPT.inc(dropped)
            if cursor == 0:
                return
        self._key_cursors[idx.topic] = cursor

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except redislib.RedisError as exc:
                log.warning("stats refresh failed: %s", exc)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


def pulsar_stats(s: dict[str, Any]) -> dict[str, Any]:
    """The delayed-delivery part of Pulsar's TopicStats from `topic_stats`. PIP-448's index
    is shared, so every subscription reports the topic's delayed messages and index bytes
    (its own redeliveries' index added); the topic's figure is their sum, as Pulsar's
    PersistentTopic computes it, and so counts the shared index once per subscription
    (`pulsar_delayed_message_index_size_bytes` is the index's own size)."""
    subs = {sub: {"msgDelayed": s["delayedMessages"],
                  "delayedMessageIndexSizeInBytes": subscription_index_bytes(s, sub)}
            for sub in s["subscriptions"]}
    return {"delayedMessageIndexSizeInBytes":
            sum(sub["delayedMessageIndexSizeInBytes"] for sub in subs.values()),
            "subscriptions": subs}
