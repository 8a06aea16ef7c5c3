"""Losing Redis: what the index needs from Kafka to be rebuilt (docs/internals.md, "Losing
Redis"). Kafka holds every delayed message (`dwell.delayed`, `dwell.delayed.refiled`);
two more facts make a rebuild exact:

- **Delivered marks** (`dwell.delivered`, dwell.index.marks): before the drain completes a
  claimed bucket (and before the restage completes the originals it re-filed) it writes
  the bucket's positions there. A rebuild skips every position a mark names, so what was
  delivered is not delivered again.
- **Low watermarks**: per delay-log partition, an offset below which nothing is pending
  any more, committed as the offsets of the consumer group `<tracker group>.lowmark`
  (Kafka keeps them). The `LowmarkKeeper` computes them from Redis: the lowest offset
  still in the index (live and claimed buckets, uncompacted deltas), never above what the
  ingest has indexed (`dwell:trk:ingested`, written with the positions), so a Redis that
  lost writes can only hold the mark back. A rebuild re-reads the log from there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import redis as redislib

from dwell import keys
from dwell.adapters import kafka
from dwell.core.positions import field_partition
from dwell.tracker.index_view import CorruptIndex, IndexView

log = logging.getLogger("dwell.tracker.recovery")


def lowmark_group(tracker_group: str) -> str:
    return f"{tracker_group}.lowmark"


def start_group_at_end(bootstrap: str, tracker_group: str, logs: Iterable[str]) -> None:
    """Start a new tracker group where the delay logs end now: its offsets and its low
    watermarks. A group with committed offsets and no index entries in Redis is rebuilt
    from its low watermarks; with both at the end, there is nothing to re-read. (Tests and
    benches that share the delay logs start their trackers this way.)"""
    logs = list(logs)
    for group in (tracker_group, lowmark_group(tracker_group)):
        kafka.start_group_at_end(bootstrap, group, logs)


# -- low watermarks


def pending_minimums(view: IndexView) -> dict[int, int]:
    """Per index field, the lowest offset any topic's index still holds (live and claimed
    buckets, blobs and deltas), from ``view`` synced now (dwell.tracker.index_view: what
    changed since its last sync is read, and it is exact)."""
    low: dict[int, int] = {}
    for fig in view.sync_all().values():
        for f, offset in fig.minima().items():
            if offset < low.get(f, offset + 1):
                low[f] = offset
    return low


def low_watermarks(view: IndexView) -> dict[int, int]:
    """Per index field the ingest has written: the offset below which nothing is pending
    (min of what is indexed up to, and the lowest offset still in the index). The
    ingested positions are read first: a position indexed after that is at or above
    them."""
    r = view.redis
    ingested = {int(f): int(o) for f, o in r.hgetall(keys.INGESTED).items()}
    pending = pending_minimums(view)
    # Read again: a field whose ingested position fell meanwhile (a rebuild started, Redis
    # lost writes) is left out this time rather than given a mark it may not have.
    again = {int(f): int(o) for f, o in r.hgetall(keys.INGESTED).items()}
    return {f: min(o, pending.get(f, o)) for f, o in ingested.items()
            if again.get(f, -1) >= o}


class LowmarkKeeper:
    """Commits the low watermarks every ``interval_s`` as the offsets of the group
    `<tracker group>.lowmark`, never lowering one."""

    def __init__(self, view: IndexView, bootstrap: str, tracker_group: str, *,
                 delayed_topic: str, refiled_topic: str, interval_s: float,
                 leading: Callable[[], bool] = lambda: True) -> None:
        self.view = view
        self.bootstrap = bootstrap
        self.group = lowmark_group(tracker_group)
        self.delayed_topic = delayed_topic
        self.refiled_topic = refiled_topic
        self.interval_s = interval_s
        # Whether this replica holds the bookkeeping lease (dwell.tracker.lease).
        self.leading = leading
        self.committed: dict[tuple[str, int], int] = {}
        self.error: str | None = None
        self._stop = threading.Event()

    def position(self, field: int) -> tuple[str, int]:
        refiled, partition = field_partition(field)
        return (self.refiled_topic if refiled else self.delayed_topic), partition

    def run_once(self) -> dict[tuple[str, int], int]:
        marks = {self.position(f): o for f, o in low_watermarks(self.view).items()}
        fresh = {tp: o for tp, o in marks.items() if o > self.committed.get(tp, -1)}
        if fresh:
            c = kafka.Consumer(self.bootstrap, self.group)
            try:
                if not self.committed:
                    self.committed = {tp: o for tp, o in c.committed(marks).items() if o >= 0}
                    fresh = {tp: o for tp, o in fresh.items()
                             if o > self.committed.get(tp, -1)}
                if fresh:
                    c.commit(fresh)
                    self.committed |= fresh
            finally:
                c.close()
        return fresh

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.leading():
                # Another replica commits meanwhile: read its marks again when this one
                # leads again, so that none is lowered.
                self.committed = {}
                self.error = None
                continue
            try:
                self.run_once()
                self.error = None
            except (redislib.RedisError, OSError, kafka.KafkaUnavailable,
                    CorruptIndex) as exc:
                self.error = str(exc)
                log.warning("low watermarks not committed, retrying: %s", exc)

    def stop(self) -> None:
        self._stop.set()


def committed_lowmarks(bootstrap: str, tracker_group: str,
                       partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The low watermarks committed for these (log, partition)s; absent when none is."""
    c = kafka.Consumer(bootstrap, lowmark_group(tracker_group))
    try:
        return {tp: o for tp, o in c.committed(list(partitions)).items() if o >= 0}
    finally:
        c.close()

