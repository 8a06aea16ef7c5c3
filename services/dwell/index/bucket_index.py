"""What a topic's index and a subscription's redelivery index share: reading buckets,
claiming due ones under a lease (claim-6.lua), renewing the lease (renew-2.lua),
completing them (complete-7.lua) and folding deltas into blobs (merge-4.lua)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import redis as redislib
from pyroaring import BitMap64

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.index.roaring import bucket_digest, decode, encode, unpack_deltas

LUA_DIR: Final = Path(__file__).parent / "lua"
# Buckets `counts` reads a round trip.
COUNT_CHUNK: Final = 10_000

# Return codes of complete-7.lua
COMPLETED: Final = 1
NOT_CLAIMED: Final = 0
LEASE_MISMATCH: Final = -1
# Return codes of renew-2.lua, one per bucket (NOT_CLAIMED and LEASE_MISMATCH as above)
RENEWED: Final = 1
# Return codes of merge-4.lua
MERGED: Final = 1
CHANGED: Final = 0


def scripts(r: redislib.Redis) -> redis_adapter.Scripts:
    """The index's Lua scripts on client ``r``."""
    return redis_adapter.Scripts(r, LUA_DIR)


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


class BucketIndex:
    """What a topic's index and a subscription's redelivery index share."""

    def __init__(self, r: redislib.Redis, ikeys: keys.IndexKeys, due_key: str, due_member: str,
                 int_fields: bool, changes_kept: int = 0) -> None:
        self.redis = r
        # Entries of the index's changes stream kept (0: the index writes none).
        self._changes_kept = changes_kept
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
        """bucketStart -> number of distinct positions, for live and claimed buckets; read
        COUNT_CHUNK buckets a round trip, so a large index is not one reply in memory."""
        every = [(b, False) for b in self.buckets()] + [
            (int(b), True) for b in self.redis.zrange(self.keys.claims, 0, -1)]
        return self._count(every)

    def count_between(self, first: int, last: int) -> int:
        """How many positions the live buckets starting in ``[first, last]`` hold."""
        starts = self.redis.zrangebyscore(self.keys.index, first, last)
        return sum(self._count([(int(float(b)), False) for b in starts]).values())

    def _count(self, every: list[tuple[int, bool]]) -> dict[int, int]:
        """bucketStart -> positions of each (bucket, claimed) of ``every``: a live bucket
        is a HASH, a claimed one a LIST of field, blob pairs; each has its delta string."""
        ks = self.keys
        out: dict[int, int] = {}
        for i in range(0, len(every), COUNT_CHUNK):
            chunk = every[i:i + COUNT_CHUNK]
            pipe = self.redis.pipeline(transaction=False)
            for b, claimed in chunk:
                if claimed:
                    pipe.lrange(ks.claimed(b), 0, -1)
                    pipe.get(ks.claimed_delta(b))
                else:
                    pipe.hgetall(ks.bucket(b))
                    pipe.get(ks.delta(b))
            res = pipe.execute()
            for j, (b, claimed) in enumerate(chunk):
                blobs = res[2 * j]
                pairs = zip(blobs[::2], blobs[1::2], strict=True) if claimed else blobs.items()
                merged = self._merge(pairs, res[2 * j + 1])
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
                           ks.claimed_delta_prefix, self._changes_kept]
        if first is not None:
            args.append(first)
        res = self._scripts.run("claim", [ks.index, ks.claims, ks.leases, ks.dirty,
                                          self._due_key, ks.changes], args)
        out = []
        for b, flat, delta in res:
            positions = self._merge(zip(flat[::2], flat[1::2], strict=True), delta)
            out.append(ClaimedBucket(int(b), lease, expiry, positions))
        return out

    def complete(self, bucket_start: int, lease_id: str) -> bool:
        """Delete a claimed bucket after its messages are durably written. False when the
        lease is not (or no longer) the holder: another drainer has the bucket now."""
        ks = self.keys
        rc = self._scripts.run(
            "complete", [ks.claims, ks.leases, ks.claimed(bucket_start),
                         ks.claimed_delta(bucket_start), ks.index, self._due_key,
                         ks.changes],
            [bucket_start, lease_id, self._due_member, self._changes_kept])
        return int(rc) == COMPLETED

    def renew(self, bucket_starts: Sequence[int], lease_id: str, expiry_ms: int,
              client: Any = None) -> Any:
        """Extend lease ``lease_id`` on the claimed buckets ``bucket_starts`` to
        ``expiry_ms`` (never shortened); one code per bucket, in order: RENEWED, or
        NOT_CLAIMED / LEASE_MISMATCH for a bucket the lease no longer holds.
        ``client``: a pipeline of this index's client to queue the call on (then the
        codes come from its ``execute``)."""
        ks = self.keys
        return self._scripts.run("renew", [ks.claims, ks.leases],
                                 [lease_id, expiry_ms, *bucket_starts], client=client)

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
            self._scripts.run("merge", [ks.bucket(b), ks.delta(b), ks.index, ks.dirty], args,
                              client=pipe)
        return sum(1 for rc in pipe.execute() if int(rc) == MERGED)
