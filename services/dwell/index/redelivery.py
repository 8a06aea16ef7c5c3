"""One subscription's redelivery index: the bucket/Roaring layout of a topic's index,
written by the backoff job and claimed by the drain (dwell:due:subs says which are due)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import redis as redislib
from pyroaring import BitMap64

from dwell import keys
from dwell.core.buckets import bucket_start as bucket_of
from dwell.index.bucket_index import MERGED, BucketIndex, ClaimedBucket
from dwell.index.roaring import bucket_digest, decode, encode, unpack_deltas

DUE_SUBSCRIPTIONS: Final = keys.DUE_SUBSCRIPTIONS
# A message's pending redelivery (keys.sub_pending): due at dueAt in the index bucket
# ``bucket``, with the count stored as keys.sub_counts stores it (-(count + 1): a dead
# letter).
PendingEntry = tuple[int, int, int]


def format_pending(entry: PendingEntry) -> str:
    return f"{entry[0]},{entry[1]},{entry[2]}"


def parse_pending(raw: bytes | str) -> PendingEntry:
    due, bucket, stored = (raw.decode() if isinstance(raw, bytes) else raw).split(",")
    return int(due), int(bucket), int(stored)


class SubscriptionIndex(BucketIndex):
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
        buckets of `tick_ms`. Written straight into the blobs, one compare-and-set
        (retried) per bucket, so a caller hands a whole batch over at once; idempotent."""
        by_bucket: dict[int, dict[bytes, list[int]]] = {}
        for src, part, off, at in positions:
            b = bucket_of(at, tick_ms)
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

    def remove_many(self, bucket_start: int,
                    positions: Iterable[tuple[str, int, int]]) -> int:
        """Cancel scheduled redeliveries `(sourceKafkaTopic, partition, offset)` of one live
        bucket in one compare-and-set (a claim or another writer in between makes it
        re-read); how many were there. A bucket left empty stays in the index until the
        drain claims it (an empty claim writes nothing). A position that is not there,
        e.g. because the drain already claimed the bucket, is not counted: that redelivery
        has happened (or is being written), as in Pulsar an ack after the redelivery does
        not undo it."""
        wanted: dict[bytes, list[int]] = {}
        for src, part, off in positions:
            wanted.setdefault(f"{src}:{part}".encode(), []).append(off)
        removed = 0

        def drop(merged: dict[bytes, BitMap64]) -> bool:
            nonlocal removed
            removed = 0
            for name, offs in wanted.items():
                bm = merged.get(name)
                if bm is None:
                    continue
                for off in offs:
                    if off in bm:
                        bm.discard(off)
                        removed += 1
            return removed > 0
        self._rewrite(bucket_start, drop)
        return removed

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
            rc = self._scripts.run("merge", [ks.bucket(bucket_start), ks.delta(bucket_start),
                                             ks.index, ks.dirty], args)
            if int(rc) == MERGED:
                return True

    def claim(self, now_ms: int, max_buckets: int, lease_ms: int,
              cutoff_ms: int | None = None) -> list[ClaimedBucket]:
        """Claim due redelivery buckets (`bucketStart <= cutoff_ms`, default `now_ms`:
        redeliveries are never early). Same lease rules as `TopicIndex.claim`."""
        return self._claim(now_ms if cutoff_ms is None else cutoff_ms, now_ms, max_buckets,
                           lease_ms)

    def store_count(self, message_id: str, count: int) -> None:
        """Record the count the drain gives a message's pending entry (keys.sub_counts:
        -(count + 1) marks a dead letter)."""
        self.redis.hset(keys.sub_counts(self.topic, self.subscription), message_id, count)

    def store_counts(self, counts: Mapping[str, int]) -> None:
        """`store_count` for many messages, in one HSET."""
        if counts:
            self.redis.hset(keys.sub_counts(self.topic, self.subscription), mapping=counts)

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

    def pending(self, message_ids: Sequence[str]) -> list[PendingEntry | None]:
        """The pending entries (dueAt, bucket, stored count) of messages, None where a
        message has none, in one HMGET."""
        if not message_ids:
            return []
        raw = self.redis.hmget(keys.sub_pending(self.topic, self.subscription), message_ids)
        return [None if v is None else parse_pending(v) for v in raw]

    def write_pending(self, entries: Mapping[str, PendingEntry | None], client: Any = None
                      ) -> None:
        """Set messages' pending entries (None: delete it), on ``client`` (a pipeline) or
        at once."""
        key = keys.sub_pending(self.topic, self.subscription)
        put = {mid: format_pending(e) for mid, e in entries.items() if e is not None}
        gone = [mid for mid, e in entries.items() if e is None]
        c = self.redis if client is None else client
        if put:
            c.hset(key, mapping=put)
        if gone:
            c.hdel(key, *gone)

    def forget_claimed(self, bucket_start: int, message_ids: Sequence[str]) -> int:
        """Delete the pending entries of messages the drain claimed in ``bucket_start``
        (those a later event has moved to another bucket stay); how many went."""
        if not message_ids:
            return 0
        return int(self._scripts.run("forget_claimed",
                                     [keys.sub_pending(self.topic, self.subscription)],
                                     [bucket_start, *message_ids]))

    def drop(self) -> None:
        """Delete the whole redelivery index (the subscription was deleted)."""
        names = [*self.key_names(), keys.sub_counts(self.topic, self.subscription),
                 keys.sub_pending(self.topic, self.subscription)]
        self.redis.delete(*names)
        self.redis.zrem(DUE_SUBSCRIPTIONS, self._due_member)


def due_subscriptions(r: redislib.Redis, now_ms: int) -> list[tuple[str, str]]:
    """(topic, subscription) pairs whose redelivery index has a bucket due at `now_ms`."""
    out = []
    for m in r.zrangebyscore(DUE_SUBSCRIPTIONS, "-inf", now_ms):
        topic, _, sub = m.decode().partition(" ")
        out.append((topic, sub))
    return out
