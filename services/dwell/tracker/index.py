"""The Roaring index in Redis (PIP-448): a topic's delayed positions, and one
subscription's redeliveries, as `bucketStart -> field -> BitMap64(offsets)`.

This is the API the drain/backoff job calls (sync redis client):

    idx = TopicIndex(redis, "persistent://t/ns/x")
    for b in idx.claim(now_ms, max_buckets=100, lease_ms=30_000, strict=False):
        for partition, offsets in b.positions.items():   # complete data, deltas merged
            ...write the messages at (dwell.delayed, partition, offset) durably...
        idx.complete(b.bucket_start, b.lease_id)          # then delete the bucket

    for topic in due_topics(redis, now_ms, strict=False): ...

How it is stored (keys in dwell.keys): each bucket is a HASH field -> serialized
portable `BitMap64` (run-optimized). Adds do not rewrite blobs: they APPEND packed
12-byte entries (u32 field, u64 offset) to a per-bucket delta string and mark the
bucket dirty; `compact()` later folds deltas into the blobs with a compare-and-set
script (`merge-4.lua`). `claim` moves a bucket's blobs AND pending deltas to claimed
keys in one script and `TopicIndex.claim` merges them client-side, so a claim always
returns every position indexed before it, compacted or not. Everything is a set
union, so replays after a crash and duplicate adds change nothing.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import redis as redislib
from pyroaring import BitMap64
from redis.commands.core import Script

from dwell import keys
from dwell.adapters.redis import Scripts
from dwell.core.buckets import bucket_due_cutoff

LUA_DIR: Final = Path(__file__).parent / "lua"

# Return codes of complete-6.lua
COMPLETED: Final = 1
NOT_CLAIMED: Final = 0
LEASE_MISMATCH: Final = -1
# Return codes of merge-4.lua
MERGED: Final = 1
CHANGED: Final = 0

DELTA_DTYPE: Final = np.dtype([("field", "<u4"), ("offset", "<u8")])
DUE_SUBSCRIPTIONS: Final = keys.DUE_SUBSCRIPTIONS
TICK_FIELD: Final = "tickTimeMs"

def scripts(r: redislib.Redis) -> Scripts:
    """The tracker's Lua scripts registered on client `r` (loaded once per client; kept
    on the client itself so they live and die with it)."""
    s: Scripts | None = getattr(r, "_dwell_tracker_scripts", None)
    if s is None:
        s = Scripts(r, LUA_DIR)
        r._dwell_tracker_scripts = s  # type: ignore[attr-defined]
    return s


@dataclass(frozen=True, slots=True)
class ClaimedBucket:
    """One bucket handed to a drainer until `lease_expires_at` (ms).

    `positions` maps a partition of `dwell.delayed` (TopicIndex) or
    `"<kafkaTopic>:<partition>"` (SubscriptionIndex) to the offsets to deliver.
    """

    bucket_start: int
    lease_id: str
    lease_expires_at: int
    positions: dict[Any, BitMap64]

    def count(self) -> int:
        return sum(len(b) for b in self.positions.values())


def encode(bm: BitMap64) -> bytes:
    bm.run_optimize()
    return bytes(bm.serialize())


def decode(blob: bytes) -> BitMap64:
    return BitMap64.deserialize(blob)


def bucket_digest(fields: dict[bytes, bytes]) -> str:
    """SHA-1 of a bucket HASH as merge-4.lua computes it (the compare-and-set token)."""
    h = hashlib.sha1()
    for f in sorted(fields):
        v = fields[f]
        h.update(f + b":" + str(len(v)).encode() + b":" + v)
    return h.hexdigest()


def pack_deltas(fields: np.ndarray, offsets: np.ndarray) -> bytes:
    buf = np.empty(len(offsets), dtype=DELTA_DTYPE)
    buf["field"] = fields
    buf["offset"] = offsets
    return buf.tobytes()


def unpack_deltas(raw: bytes) -> dict[int, np.ndarray]:
    """field id -> offsets (unsorted, may repeat) of a delta string."""
    arr = np.frombuffer(raw, dtype=DELTA_DTYPE, count=len(raw) // DELTA_DTYPE.itemsize)
    out: dict[int, np.ndarray] = {}
    for f in np.unique(arr["field"]).tolist():
        out[int(f)] = arr["offset"][arr["field"] == f]
    return out


def bucket_starts(deliver_at: np.ndarray, tick_ms: np.ndarray | int) -> np.ndarray:
    """PIP-448 `deliverAt - deliverAt % tickTime`, vectorised (numpy's % floors like Python)."""
    return deliver_at - deliver_at % tick_ms


class _Index:
    """What a topic's index and a subscription's redelivery index share."""

    def __init__(self, r: redislib.Redis, ikeys: keys.IndexKeys, due_key: str, due_member: str,
                 int_fields: bool) -> None:
        self.redis = r
        self.keys = ikeys
        self._due_key = due_key
        self._due_member = due_member
        self._int_fields = int_fields
        self._scripts = scripts(r)

    # -- reading

    def _field(self, raw: bytes) -> Any:
        s = raw.decode()
        return int(s) if self._int_fields else s

    def _merge(self, blobs: Iterable[tuple[bytes, bytes]],
               delta: bytes | None) -> dict[Any, BitMap64]:
        out: dict[Any, BitMap64] = {}
        for f, blob in blobs:
            key = self._field(f)
            bm = decode(blob)
            if key in out:
                out[key] |= bm
            else:
                out[key] = bm
        if delta:
            for key, offs in unpack_deltas(delta).items():
                if key in out:
                    out[key].update(offs)
                else:
                    out[key] = BitMap64(offs)
        return out

    def buckets(self) -> list[int]:
        """Bucket starts that hold messages (live, not claimed), earliest first."""
        return [int(float(b)) for b in self.redis.zrange(self.keys.index, 0, -1)]

    def read_bucket(self, bucket_start: int) -> dict[Any, BitMap64]:
        """The live positions of one bucket (blobs ∪ pending deltas)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.bucket(bucket_start))
        pipe.get(self.keys.delta(bucket_start))
        blobs, delta = pipe.execute()
        return self._merge(blobs.items(), delta)

    def counts(self) -> dict[int, int]:
        """bucketStart -> number of distinct positions, for live and claimed buckets."""
        ks = self.keys
        live = self.buckets()
        claimed = [int(b) for b in self.redis.zrange(ks.claims, 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for b in live:
            pipe.hgetall(ks.bucket(b))
            pipe.get(ks.delta(b))
        for b in claimed:
            pipe.lrange(ks.claimed(b), 0, -1)
            pipe.get(ks.claimed_delta(b))
        res = pipe.execute()
        out: dict[int, int] = {}
        for i, b in enumerate(live):
            merged = self._merge(res[2 * i].items(), res[2 * i + 1])
            out[b] = out.get(b, 0) + sum(len(x) for x in merged.values())
        base = 2 * len(live)
        for i, b in enumerate(claimed):
            flat = res[base + 2 * i]
            merged = self._merge(zip(flat[::2], flat[1::2], strict=True), res[base + 2 * i + 1])
            out[b] = out.get(b, 0) + sum(len(x) for x in merged.values())
        return out

    def key_names(self) -> list[str]:
        """Every Redis key this index uses right now."""
        ks = self.keys
        names = [ks.index, ks.dirty, ks.claims, ks.leases]
        for b in self.buckets():
            names += [ks.bucket(b), ks.delta(b)]
        for b in (int(x) for x in self.redis.zrange(ks.claims, 0, -1)):
            names += [ks.claimed(b), ks.claimed_delta(b)]
        return names

    def memory_bytes(self, extra: Sequence[str] = ()) -> int:
        """Bytes Redis reports (MEMORY USAGE, all samples) for this index's keys."""
        pipe = self.redis.pipeline(transaction=False)
        for k in [*self.key_names(), *extra]:
            pipe.memory_usage(k, samples=0)
        return sum(x or 0 for x in pipe.execute())

    # -- draining

    def _claim(self, cutoff: int, now_ms: int, max_buckets: int,
               lease_ms: int, first: int | None = None) -> list[ClaimedBucket]:
        ks = self.keys
        lease = uuid.uuid4().hex
        expiry = now_ms + lease_ms
        args: list[Any] = [cutoff, max_buckets, lease, expiry, now_ms, self._due_member,
                           ks.bucket_prefix, ks.delta_prefix, ks.claimed_prefix,
                           ks.claimed_delta_prefix]
        if first is not None:
            args.append(first)
        res = self._scripts.claim(
            keys=[ks.index, ks.claims, ks.leases, ks.dirty, self._due_key], args=args)
        out = []
        for b, flat, delta in res:
            positions = self._merge(zip(flat[::2], flat[1::2], strict=True), delta)
            out.append(ClaimedBucket(int(b), lease, expiry, positions))
        return out

    def complete(self, bucket_start: int, lease_id: str) -> bool:
        """Delete a claimed bucket after its messages are durably written. False when the
        lease is not (or no longer) the holder: another drainer has the bucket now."""
        ks = self.keys
        rc = self._scripts.complete(
            keys=[ks.claims, ks.leases, ks.claimed(bucket_start), ks.claimed_delta(bucket_start),
                  ks.index, self._due_key],
            args=[bucket_start, lease_id, self._due_member])
        return int(rc) == COMPLETED

    # -- compaction

    def dirty_buckets(self, limit: int = 1000, min_delta_bytes: int = 0) -> list[int]:
        """Buckets with deltas of at least `min_delta_bytes`, largest deltas first."""
        return [int(float(b)) for b in self.redis.zrange(
            self.keys.dirty, "+inf", max(min_delta_bytes, 1), desc=True, byscore=True,
            offset=0, num=limit)]

    def compact(self, max_buckets: int = 500, min_delta_bytes: int = 0) -> int:
        """Fold pending deltas of up to `max_buckets` dirty buckets into their blobs,
        largest deltas first (the most memory back per script call), skipping buckets
        with fewer than `min_delta_bytes`. Safe against concurrent claims and writers
        (compare-and-set; a bucket that changed meanwhile stays dirty for the next
        round). Returns buckets merged."""
        ks = self.keys
        todo = self.dirty_buckets(max_buckets, min_delta_bytes)
        if not todo:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for b in todo:
            pipe.hgetall(ks.bucket(b))
            pipe.get(ks.delta(b))
        res = pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        for i, b in enumerate(todo):
            blobs: dict[bytes, bytes] = res[2 * i]
            delta: bytes | None = res[2 * i + 1]
            args: list[Any] = [b, hashlib.sha1(delta or b"").hexdigest(), bucket_digest(blobs)]
            if delta:
                for fid, offs in unpack_deltas(delta).items():
                    name = str(fid).encode()
                    bm = decode(blobs[name]) if name in blobs else BitMap64()
                    before = len(bm)
                    bm.update(offs)
                    if len(bm) != before or name not in blobs:
                        args += [name, encode(bm)]
            self._scripts.merge(keys=[ks.bucket(b), ks.delta(b), ks.index, ks.dirty],
                                args=args, client=pipe)
        return sum(1 for rc in pipe.execute() if int(rc) == MERGED)


class TopicIndex(_Index):
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
        append_positions(pipe, self.topic, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3])
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
        self._scripts.advance(keys=[self.keys.restaged], args=[chunk])


# Buckets per append-2.lua call: bounds both Lua's unpack() and how long one call holds Redis.
APPEND_CHUNK: Final = 1000
_APPEND_LUA: Final = (LUA_DIR / "append-2.lua").read_text()


def append_positions(pipe: Any, topic: str, partitions: np.ndarray, offsets: np.ndarray,
                     deliver_at: np.ndarray, tick_ms: np.ndarray) -> None:
    """Queue on `pipe` the commands that index these positions of `topic` (numpy int64
    columns of equal length): one append-2.lua call per chunk of buckets (APPEND each
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
    # One Script per pipeline (redis-py checks/loads a pipeline's scripts on execute).
    # The tick goes first: a drainer that sees the buckets must see the tick they are
    # due by (without it, claim falls back to a 1 ms tick and strict mode is early).
    pipe.hset(keys.stats(topic), TICK_FIELD, int(tick_ms[-1]))
    append = getattr(pipe, "_dwell_append", None)
    if append is None:
        append = pipe._dwell_append = Script(pipe, _APPEND_LUA)
    for c in range(0, len(names), APPEND_CHUNK):
        args: list[Any] = [ks.delta_prefix]
        for i in range(c, min(c + APPEND_CHUNK, len(names))):
            args += (names[i], packed[bounds[i]:bounds[i + 1]])
        append(keys=[ks.index, ks.dirty], args=args, client=pipe)
    pipe.zadd(keys.DUE, {topic: names[0]}, lt=True)
    pipe.sadd(keys.TOPICS, topic)


class SubscriptionIndex(_Index):
    """One subscription's redelivery index: the same bucket/Roaring layout, fields are
    `"<sourceKafkaTopic>:<partition>"` (a redelivery points at a record in the ready
    topic or `dwell.delayed`). Also keeps messageId -> redelivery count."""

    def __init__(self, r: redislib.Redis, topic: str, subscription: str) -> None:
        super().__init__(r, keys.sub_redelivery(topic, subscription), DUE_SUBSCRIPTIONS,
                         f"{topic} {subscription}", int_fields=False)
        self.topic = topic
        self.subscription = subscription

    def add(self, positions: Iterable[tuple[str, int, int, int]], tick_ms: int) -> int:
        """Index redeliveries `(sourceKafkaTopic, partition, offset, redeliverAt)` in
        buckets of `tick_ms`. Written straight into the blobs (compare-and-set, retried),
        as redeliveries are few; idempotent."""
        by_bucket: dict[int, dict[bytes, list[int]]] = {}
        for src, part, off, at in positions:
            b = at - at % tick_ms
            by_bucket.setdefault(b, {}).setdefault(f"{src}:{part}".encode(), []).append(off)
        for b, fields in by_bucket.items():
            def put(merged: dict[bytes, BitMap64],
                    fields: dict[bytes, list[int]] = fields) -> bool:
                for f, offs in fields.items():
                    merged.setdefault(f, BitMap64()).update(offs)
                return True
            self._rewrite(b, put)
        if by_bucket:
            self.redis.zadd(DUE_SUBSCRIPTIONS, {self._due_member: min(by_bucket)}, lt=True)
        return sum(len(o) for f in by_bucket.values() for o in f.values())

    def remove(self, source: str, partition: int, offset: int, bucket_start: int) -> bool:
        """Cancel a scheduled redelivery: drop ``offset`` of ``"<source>:<partition>"`` from
        the live bucket ``bucket_start``. Compare-and-set like `add` (a claim or another
        writer in between makes it re-read). True when it was there; False when it was
        not, e.g. because the drain already claimed the bucket: then the redelivery has
        happened (or is being written), as in Pulsar an ack after the redelivery does not
        undo it. A bucket left empty stays in the index until the drain claims it (an
        empty claim writes nothing)."""
        name = f"{source}:{partition}".encode()

        def drop(merged: dict[bytes, BitMap64]) -> bool:
            bm = merged.get(name)
            if bm is None or offset not in bm:
                return False
            bm.discard(offset)
            return True
        return self._rewrite(bucket_start, drop)

    def _rewrite(self, bucket_start: int,
                 change: Callable[[dict[bytes, BitMap64]], bool]) -> bool:
        """Read a live bucket (blobs ∪ pending deltas), let `change` edit it, and write it
        back with merge-4.lua's compare-and-set, re-reading whenever a claim or another
        writer changed it in between. False, with nothing written, when `change` says
        there is nothing to change."""
        ks = self.keys
        while True:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hgetall(ks.bucket(bucket_start))
            pipe.get(ks.delta(bucket_start))
            blobs, delta = pipe.execute()
            # Pending deltas are folded in too (merge-4.lua drops them once it writes).
            merged = {f: decode(b) for f, b in blobs.items()}
            if delta:
                for fid, offs in unpack_deltas(delta).items():
                    merged.setdefault(str(fid).encode(), BitMap64()).update(offs)
            if not change(merged):
                return False
            args: list[Any] = [bucket_start, hashlib.sha1(delta or b"").hexdigest(),
                               bucket_digest(blobs)]
            for f, bm in merged.items():
                args += [f, encode(bm)]
            rc = self._scripts.merge(keys=[ks.bucket(bucket_start), ks.delta(bucket_start),
                                           ks.index, ks.dirty], args=args)
            if int(rc) == MERGED:
                return True

    def claim(self, now_ms: int, max_buckets: int, lease_ms: int,
              cutoff_ms: int | None = None) -> list[ClaimedBucket]:
        """Claim due redelivery buckets (`bucketStart <= cutoff_ms`, default `now_ms`:
        redeliveries are never early). Same lease rules as `TopicIndex.claim`."""
        return self._claim(now_ms if cutoff_ms is None else cutoff_ms, now_ms, max_buckets,
                           lease_ms)

    def increment_redelivery_count(self, message_id: str) -> int:
        return int(self.redis.hincrby(keys.sub_counts(self.topic, self.subscription),
                                      message_id, 1))

    def redelivery_count(self, message_id: str) -> int:
        raw = self.redis.hget(keys.sub_counts(self.topic, self.subscription), message_id)
        return int(raw) if raw is not None else 0

    def stored_counts(self, message_ids: Sequence[str]) -> list[int]:
        """The stored redelivery counts of messages (0 when none), in one HMGET."""
        if not message_ids:
            return []
        raw = self.redis.hmget(keys.sub_counts(self.topic, self.subscription), message_ids)
        return [int(c or 0) for c in raw]

    def forget(self, *message_ids: str) -> None:
        """Drop messages' redelivery counts (acked, or dead-lettered)."""
        if message_ids:
            self.redis.hdel(keys.sub_counts(self.topic, self.subscription), *message_ids)

    def drop(self) -> None:
        """Delete the whole redelivery index (the subscription was deleted)."""
        names = [*self.key_names(), keys.sub_counts(self.topic, self.subscription)]
        self.redis.delete(*names)
        self.redis.zrem(DUE_SUBSCRIPTIONS, self._due_member)


def due_topics(r: redislib.Redis, now_ms: int, strict: bool) -> list[str]:
    """Topics that may have claimable buckets at `now_ms` (a hint kept in `dwell:due`:
    earliest bucketStart holding messages or an outstanding claim, per topic). A topic
    listed here may return no bucket from `claim` (its claims are still leased)."""
    # The tick varies per topic; take candidates with the widest non-strict cutoff
    # first, then apply each topic's own cutoff.
    cands = r.zrange(keys.DUE, 0, -1, withscores=True)
    if not cands:
        return []
    pipe = r.pipeline(transaction=False)
    for t, _ in cands:
        pipe.hget(keys.stats(t.decode()), TICK_FIELD)
    ticks = pipe.execute()
    out = []
    for (t, score), tick in zip(cands, ticks, strict=True):
        if score <= bucket_due_cutoff(now_ms, int(tick or 1), strict):
            out.append(t.decode())
    return out


def due_subscriptions(r: redislib.Redis, now_ms: int) -> list[tuple[str, str]]:
    """(topic, subscription) pairs whose redelivery index has a bucket due at `now_ms`."""
    out = []
    for m in r.zrangebyscore(DUE_SUBSCRIPTIONS, "-inf", now_ms):
        topic, _, sub = m.decode().partition(" ")
        out.append((topic, sub))
    return out
