"""The shared index of one Pulsar topic's delayed messages: what the tracker's ingest
appends, what the drain claims, and the due hint (`dwell:due`) that says which topics to
look at."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import numpy as np
import redis as redislib

from dwell import keys
from dwell.adapters.redis import Scripts
from dwell.core.buckets import bucket_due_cutoff, bucket_starts, is_bucket_due
from dwell.index.bucket_index import BucketIndex, ClaimedBucket
from dwell.index.roaring import DELTA_DTYPE, pack_deltas

TICK_FIELD: Final = "tickTimeMs"


class TopicIndex(BucketIndex):
    """The shared index of one Pulsar topic's delayed messages; fields are partitions of
    `dwell.delayed` (ints) and offsets are that partition's offsets."""

    def __init__(self, r: redislib.Redis, topic: str) -> None:
        super().__init__(r, keys.topic_index(topic), keys.DUE, topic, int_fields=True)
        self.topic = topic

    def add(self, positions: Iterable[tuple[int, int, int, int]]) -> int:
        """Index `(partition, offset, deliverAt, tickTimeMs)` tuples; returns how many.
        Idempotent: adding a position again changes nothing once compacted."""
        rows = list(positions)
        if not rows:
            return 0
        arr = np.array(rows, dtype=np.int64)
        pipe = self.redis.pipeline(transaction=False)
        append_positions(pipe, self._scripts, self.topic, arr[:, 0], arr[:, 1], arr[:, 2],
                         arr[:, 3])
        pipe.execute()
        return len(rows)

    def tick_time_ms(self) -> int | None:
        raw = self.redis.hget(keys.stats(self.topic), TICK_FIELD)
        return int(raw) if raw is not None else None

    def claim(self, now_ms: int, max_buckets: int, lease_ms: int,
              strict: bool) -> list[ClaimedBucket]:
        """Claim up to `max_buckets` due buckets (earliest first) for `lease_ms`.

        Due (dwell.core.buckets.bucket_due_cutoff): when every message the bucket can
        hold is within PIP-448's cutoff `now + tickTime` (`bucketStart <= now + 1`), or
        in strict mode when the bucket's last millisecond has passed
        (`bucketStart + tickTime - 1 <= now`), so nothing is early. tickTime is the
        topic's latest effective tick seen at ingest.
        A claim not completed before its lease expires is handed out again (with any
        positions indexed for that bucket since) by a later `claim`.
        """
        tick = self.tick_time_ms() or 1
        return self._claim(bucket_due_cutoff(now_ms, tick, strict), now_ms, max_buckets,
                           lease_ms)

    def claim_between(self, first: int, last: int, now_ms: int, max_buckets: int,
                      lease_ms: int) -> list[ClaimedBucket]:
        """Claim the buckets starting in ``[first, last]`` whether due or not (the
        restage re-files future buckets); the same lease rules as `claim`."""
        return self._claim(last, now_ms, max_buckets, lease_ms, first)

    def restaged_chunk(self) -> int | None:
        """The last chunk of buckets re-filed for this topic (dwell.tracker.restage)."""
        raw = self.redis.get(self.keys.restaged)
        return int(raw) if raw is not None else None

    def mark_restaged(self, chunk: int) -> None:
        """Record ``chunk`` as re-filed; never lowers the mark."""
        self._scripts.run("advance", [self.keys.restaged], [chunk])


# Buckets per append-2.lua call: bounds both Lua's unpack() and how long one call holds Redis.
APPEND_CHUNK: Final = 1000


def append_positions(pipe: Any, scripts: Scripts, topic: str, partitions: np.ndarray,
                     offsets: np.ndarray, deliver_at: np.ndarray, tick_ms: np.ndarray) -> None:
    """Queue on `pipe` (a pipeline of the client `scripts` were loaded on,
    dwell.index.bucket_index.scripts) the commands that index these positions of `topic`
    (numpy int64 columns of equal length): one append-2.lua call per chunk of buckets (APPEND each
    bucket's deltas, ZADD the index and the dirty set), the due hint, the topic set and
    the tick. The caller executes the pipeline."""
    ks = keys.topic_index(topic)
    starts = bucket_starts(deliver_at, tick_ms)
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    packed = pack_deltas(partitions[order], offsets[order])
    uniq, first = np.unique(starts, return_index=True)
    bounds = [*(first * DELTA_DTYPE.itemsize).tolist(), len(packed)]
    names = uniq.tolist()
    # The tick goes first: a drainer that sees the buckets must see the tick they are
    # due by (without it, claim falls back to a 1 ms tick and strict mode is early).
    pipe.hset(keys.stats(topic), TICK_FIELD, int(tick_ms[-1]))
    for c in range(0, len(names), APPEND_CHUNK):
        args: list[Any] = [ks.delta_prefix]
        for i in range(c, min(c + APPEND_CHUNK, len(names))):
            args += (names[i], packed[bounds[i]:bounds[i + 1]])
        scripts.run("append", [ks.index, ks.dirty], args, client=pipe)
    pipe.zadd(keys.DUE, {topic: names[0]}, lt=True)
    pipe.sadd(keys.TOPICS, topic)


def due_topics(r: redislib.Redis, now_ms: int, strict: bool) -> list[str]:
    """Topics that may have claimable buckets at `now_ms` (a hint kept in `dwell:due`:
    earliest bucketStart holding messages or an outstanding claim, per topic). A topic
    listed here may return no bucket from `claim` (its claims are still leased)."""
    # The tick varies per topic; take candidates with the widest non-strict cutoff
    # first, then apply each topic's own cutoff.
    widest = bucket_due_cutoff(now_ms, 1, strict=False)  # non-strict: now + 1, any tick
    cands = r.zrangebyscore(keys.DUE, "-inf", widest, withscores=True)
    if not cands:
        return []
    pipe = r.pipeline(transaction=False)
    for t, _ in cands:
        pipe.hget(keys.stats(t.decode()), TICK_FIELD)
    ticks = pipe.execute()
    out = []
    for (t, score), tick in zip(cands, ticks, strict=True):
        if is_bucket_due(int(score), int(tick or 1), now_ms, strict):
            out.append(t.decode())
    return out
