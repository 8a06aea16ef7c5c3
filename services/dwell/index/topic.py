"""The shared index of one Pulsar topic's delayed messages: what the tracker's ingest
appends, what the drain claims, and the due hint (`dwell:due`) that says which topics to
look at."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, NamedTuple

import numpy as np
import redis as redislib

from dwell import keys
from dwell.adapters.redis import Scripts
from dwell.core.buckets import bucket_due_cutoff, bucket_starts, is_bucket_due
from dwell.index.bucket_index import BucketIndex, ClaimedBucket
from dwell.index.roaring import DELTA_DTYPE, pack_deltas

TICK_FIELD: Final = "tickTimeMs"

# A cancellation is kept (in Redis, and its mark on dwell.delivered) until its bucket
# started this long ago and holds nothing, live or claimed: a rebuild puts back every
# cancellation its marks name, delivered ones too, and the drain drops a bucket's only
# when it completes it (dwell.tracker.stats sweeps, dwell.tracker.trim keeps the marks).
CANCEL_KEEP_MS: Final = 3_600_000

# Answers of cancel-5.lua to a request (mode "answer"), and to a replacement ("replace")
CANCELLED: Final = 1
DELIVERED: Final = 0
TOO_LATE: Final = -1
BUSY: Final = -2
ALREADY_CANCELLED: Final = 2  # replace only
NOTHING_TO_REPLACE: Final = 3  # replace only
REPLACED_FIELD: Final = "replacedMessages"  # of the topic's stats HASH (cancel-5.lua)
# Entries a topic index's changes stream keeps, about: one per append-3.lua call, one per
# claim-6.lua call that claimed buckets and one per completed bucket. A reader that falls
# further behind reads the index whole again (dwell.tracker.index_view). An append entry
# of a full call names 1,000 buckets in about 15 KB, so a topic's stream stays under about
# 15 MB. 10,000 msg/s of 30-day delays make about 100 calls in a 10 s round.
CHANGES_KEPT: Final = 1_000


class Replaced(NamedTuple):
    """What one record with a schedule key cancelled (cancel-5.lua, mode "replace"):
    ``code`` is one of the answers above, ``bucket`` and ``member`` name the message it
    cancelled (empty with NOTHING_TO_REPLACE)."""

    code: int
    bucket: bytes
    member: bytes


class TopicIndex(BucketIndex):
    """The shared index of one Pulsar topic's delayed messages; fields are partitions of
    `dwell.delayed` (ints) and offsets are that partition's offsets."""

    def __init__(self, r: redislib.Redis, topic: str) -> None:
        super().__init__(r, keys.topic_index(topic), keys.DUE, topic, int_fields=True,
                         changes_kept=CHANGES_KEPT)
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

    # -- cancellations and schedule keys (cancel-5.lua)

    def cancel(self, partition: int, offset: int, bucket_start: int, cutoff: int,
               client: Any = None) -> Any:
        """Cancel the message at ``partition``:``offset`` of `dwell.delayed`, due in bucket
        ``bucket_start``, unless a bucket up to ``cutoff`` may be drained already:
        CANCELLED, DELIVERED, TOO_LATE or BUSY (cancel-5.lua); queued on ``client`` (a
        pipeline) when given."""
        return self._scripts.run("cancel", self._cancel_keys(),
                                 ["answer", bucket_start, f"{partition}:{offset}", cutoff],
                                 client=client)

    def replace(self, rows: list[tuple[bytes, int | None, int, int]], cutoff: int, *,
                dry_run: bool = False) -> list[Replaced]:
        """Apply records with a schedule key, ``(scheduleKey, bucketStart or None for a
        release, partition, offset)`` in log order: each cancels the key's pending
        message, unless a bucket up to ``cutoff`` may be drained already (cancel-5.lua).
        One Replaced per record applied; the last is BUSY when the rest must be asked
        again. ``dry_run``: what it would cancel, changing nothing."""
        args: list[Any] = ["victims" if dry_run else "replace", cutoff]
        for key, bucket, partition, offset in rows:
            args += [key, "" if bucket is None else bucket, f"{partition}:{offset}"]
        out = self._scripts.run("cancel", self._cancel_keys(), args)
        return [Replaced(int(code), bucket, member) for code, bucket, member in out]

    def sweep_schedule_keys(self, before: int, cursor: int = 0,
                            count: int = 1000) -> tuple[int, int]:
        """Drop schedule keys whose message was delivered, of buckets starting up to
        ``before``, looking at about ``count`` keys from ``cursor`` (cancel-5.lua): the
        next cursor (0 at the end) and how many were dropped."""
        nxt, dropped = self._scripts.run("cancel", self._cancel_keys(),
                                         ["sweep-keys", before, cursor, count])
        return int(nxt), int(dropped)

    def schedule_keys(self) -> int:
        """Schedule keys whose newest message may be pending."""
        return int(self.redis.hlen(self.keys.scheduled))

    def replaced(self) -> int:
        """Messages cancelled by a replacement since the index was made."""
        raw = self.redis.hget(keys.stats(self.topic), REPLACED_FIELD)
        return int(raw) if raw is not None else 0

    def sweep_cancelled(self, before: int, limit: int = 1000) -> int:
        """Drop up to ``limit`` cancellations of buckets starting up to ``before`` that
        hold nothing any more (cancel-5.lua); how many."""
        return int(self._scripts.run("cancel", self._cancel_keys(),
                                     ["sweep", before, limit]))

    def _cancel_keys(self) -> list[str]:
        return [self.keys.index, self.keys.leases, self.keys.cancelled, self.keys.scheduled,
                keys.stats(self.topic)]

    def cancelled_in(self, bucket_starts: Iterable[int]) -> dict[int, set[bytes]]:
        """bucketStart -> the cancelled positions (``b"<partition>:<offset>"``, as a
        re-filed copy's `dwell-origin` names them) kept for each of ``bucket_starts``."""
        starts = sorted(set(bucket_starts))
        if not starts:
            return {}
        rows = self.redis.zrangebyscore(self.keys.cancelled, starts[0], starts[-1],
                                        withscores=True)
        wanted = set(starts)
        out: dict[int, set[bytes]] = {}
        for member, score in rows:
            if int(score) in wanted:
                out.setdefault(int(score), set()).add(member)
        return out

    def forget_cancelled(self, bucket_starts: Iterable[int], client: Any = None) -> None:
        """Drop the cancellations of buckets the drain completed: nothing of them is
        pending any more."""
        r = client if client is not None else self.redis
        for b in set(bucket_starts):
            r.zremrangebyscore(self.keys.cancelled, b, b)

    def cancellations(self) -> int:
        """Cancelled messages not yet passed over by the drain."""
        return int(self.redis.zcard(self.keys.cancelled))

    def restaged_chunk(self) -> int | None:
        """The last chunk of buckets re-filed for this topic (dwell.tracker.restage)."""
        raw = self.redis.get(self.keys.restaged)
        return int(raw) if raw is not None else None

    def mark_restaged(self, chunk: int) -> None:
        """Record ``chunk`` as re-filed; never lowers the mark."""
        self._scripts.run("advance", [self.keys.restaged], [chunk])


# Buckets per append-3.lua call: bounds both Lua's unpack() and how long one call holds Redis.
APPEND_CHUNK: Final = 1000


def append_positions(pipe: Any, scripts: Scripts, topic: str, partitions: np.ndarray,
                     offsets: np.ndarray, deliver_at: np.ndarray, tick_ms: np.ndarray) -> None:
    """Queue on `pipe` (a pipeline of the client `scripts` were loaded on,
    dwell.index.bucket_index.scripts) the commands that index these positions of `topic`
    (numpy int64 columns of equal length): one append-3.lua call per chunk of buckets (APPEND each
    bucket's deltas, ZADD the index and the dirty set, an entry in the changes stream),
    the due hint, the topic set and
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
        args: list[Any] = [ks.delta_prefix, CHANGES_KEPT]
        for i in range(c, min(c + APPEND_CHUNK, len(names))):
            args += (names[i], packed[bounds[i]:bounds[i + 1]])
        scripts.run("append", [ks.index, ks.dirty, ks.changes], args, client=pipe)
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
