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
from collections.abc import Iterable
from typing import Final

import redis as redislib

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core.positions import field_partition
from dwell.index.roaring import DELTA_DTYPE, unpack_deltas
from dwell.tracker import LUA_DIR

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


# Buckets one call of minima-1.lua reads: bounds how long it holds Redis (about 7 ms,
# 14 µs a bucket of one or two blobs).
MINIMA_CHUNK: Final = 500


class CorruptIndex(ValueError):
    """Redis holds index data that dwell's scripts cannot have written: no low watermark
    is computed from it (a wrong one could let the trim delete pending records)."""


def pending_minimums(r: redislib.Redis) -> dict[int, int]:
    """Per index field, the lowest offset any topic's index still holds (live and claimed
    buckets, blobs and deltas).

    A bucket's positions move only among its own four keys (live blobs and deltas,
    claimed blobs and deltas: a claim, a compaction, an expired lease's return) until
    `complete` deletes them as delivered, and every bucket holding any is in the index
    ZSET or the claims ZSET. So both ZSETs are read in one transaction and each listed
    bucket's four keys by one script call (minima-1.lua, which sends back the blobs'
    minima and the deltas): nothing pending can move out of sight between two reads. (A bucket whose
    lease expired is back in the index with its data still in the claimed keys until it
    is claimed again.)"""
    scripts = redis_adapter.Scripts(r, LUA_DIR)
    low: dict[int, int] = {}
    for raw in r.smembers(keys.TOPICS):
        ks = keys.topic_index(raw.decode())
        pipe = r.pipeline(transaction=True)
        pipe.zrange(ks.index, 0, -1)
        pipe.zrange(ks.claims, 0, -1)
        live, claimed = pipe.execute()
        buckets = sorted({int(float(b)) for b in (*live, *claimed)})
        prefixes = [ks.bucket_prefix, ks.delta_prefix, ks.claimed_prefix,
                    ks.claimed_delta_prefix]
        for i in range(0, len(buckets), MINIMA_CHUNK):
            flat, deltas = scripts.run("minima", [ks.index],
                                       [*prefixes, *buckets[i:i + MINIMA_CHUNK]])
            torn = [len(d) for d in deltas if len(d) % DELTA_DTYPE.itemsize]
            if torn:
                # Joined, a torn string would shift every entry after it.
                raise CorruptIndex(f"{len(torn)} delta strings of {raw.decode()} are not "
                                   f"whole {DELTA_DTYPE.itemsize}-byte entries (the first "
                                   f"{torn[0]} bytes)")
            minima = list(zip(flat[::2], flat[1::2], strict=True))
            minima += [(f, int(offs.min()))
                       for f, offs in unpack_deltas(b"".join(deltas)).items()]
            for f, offset in minima:
                if offset < low.get(f, offset + 1):
                    low[f] = offset
    return low


def low_watermarks(r: redislib.Redis) -> dict[int, int]:
    """Per index field the ingest has written: the offset below which nothing is pending
    (min of what is indexed up to, and the lowest offset still in the index)."""
    ingested = {int(f): int(o) for f, o in r.hgetall(keys.INGESTED).items()}
    pending = pending_minimums(r)
    # Read again: a field whose ingested position fell meanwhile (a rebuild started, Redis
    # lost writes) is left out this time rather than given a mark it may not have.
    again = {int(f): int(o) for f, o in r.hgetall(keys.INGESTED).items()}
    return {f: min(o, pending.get(f, o)) for f, o in ingested.items()
            if again.get(f, -1) >= o}


class LowmarkKeeper:
    """Commits the low watermarks every ``interval_s`` as the offsets of the group
    `<tracker group>.lowmark`, never lowering one."""

    def __init__(self, r: redislib.Redis, bootstrap: str, tracker_group: str, *,
                 delayed_topic: str, refiled_topic: str, interval_s: float) -> None:
        self.redis = r
        self.bootstrap = bootstrap
        self.group = lowmark_group(tracker_group)
        self.delayed_topic = delayed_topic
        self.refiled_topic = refiled_topic
        self.interval_s = interval_s
        self.committed: dict[tuple[str, int], int] = {}
        self.error: str | None = None
        self._stop = threading.Event()

    def position(self, field: int) -> tuple[str, int]:
        refiled, partition = field_partition(field)
        return (self.refiled_topic if refiled else self.delayed_topic), partition

    def run_once(self) -> dict[tuple[str, int], int]:
        marks = {self.position(f): o for f, o in low_watermarks(self.redis).items()}
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

