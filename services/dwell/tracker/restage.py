"""Re-filing long-delay records ("restaging") so that a due bucket is dense in
`dwell.delayed`.

With delays that vary (uniform over 10 minutes, say) the records of one bucket lie
scattered over everything published in those 10 minutes, and the drain would read the
whole window to deliver one bucket. So `lead_ms` before a chunk of buckets
``[k * chunk_ms, (k + 1) * chunk_ms)`` comes due, the tracker claims the chunk's buckets
of every topic whose delays vary (the index's own Lua claim), reads their records (a
piece of PIECE_RECORDS at a time) and appends them to the re-file log
`dwell.delayed.refiled`, bucket after bucket, with their original `dwell-message-id` and
`dwell-origin`; then completes the claims. Its
ingest indexes the copies in the same buckets (fields of their own,
dwell.core.positions.index_field), now one dense run each. The copies go to a log of
their own so that the next chunk's scan of `dwell.delayed` does not read them too. The drain reads
those runs plus the records published after the chunk was re-filed (delays shorter than
about `lead_ms + chunk_ms`), which lie within the last `lead_ms + chunk_ms` of the log.

A topic whose delays are fixed (detected as Pulsar's InMemoryDelayedDeliveryTracker
does, `fixedDelay` in its stats) is left alone: its buckets are dense already; so is a
topic indexed from another Kafka topic than ours (`delayedTopic` in its stats). A crash
between the writes and the completions leaves the claims to expire: the original
positions return to the index beside the copies, and the bucket is delivered twice (the
SDK drops the repeat by `dwell-message-id`), as for a drain crash.

A chunk's records lie scattered over the whole window its delays span, and so do the
next chunk's: three rounds of a burst whose delays span three chunks read the burst three
times. So when a topic's due chunk holds at least `ahead_records`, the round may claim the
chunks after it as well (up to `ahead_chunks`, while the round stays within
`max_records`) and read the window once for all of them. The due chunk's claims are
completed only when the whole round is, so a chunk is taken ahead only while the round,
at the copy rate of the last round, would end within half the time left before the due
chunk's first bucket (AHEAD_MARGIN); with no rate measured yet, never. Records published
after a chunk was re-filed with delays into it stay where they are, as they do for the
due chunk: they lie within the last ``lead_ms + (ahead_chunks + 1) * chunk_ms`` of the
log.

While a round works, its leases are renewed (dwell.index.leases) up to `max_round_ms`; a
bucket whose lease was lost all the same is not written further, nor completed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import redis as redislib
from pyroaring import BitMap64

from dwell import keys, memory
from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.positions import REFILED_FIELD_BASE, field_partition, format_message_id
from dwell.headers import AUTHORIZATION, MESSAGE_ID, ORIGIN
from dwell.index.bucket_index import ClaimedBucket
from dwell.index.leases import LeaseKeeper
from dwell.index.marks import mark_record, write_marks
from dwell.index.topic import TopicIndex
from dwell.tracker.ingest import FIXED_FIELD, SOURCE_FIELD
from dwell.tracker.metrics import (
    RESTAGE_LEASE_RENEWALS,
    RESTAGE_LEASES_LOST,
    RESTAGE_LEFT,
    RESTAGE_SECONDS,
    RESTAGED,
)

log = logging.getLogger("dwell.tracker.restage")

# Offsets closer than this are read through rather than sought (a seek costs a fetch
# round trip, ~as much as reading a couple of thousand records; see dwell_spark.records).
MAX_GAP: Final = 2000
# A round's records are read and written this many at a time: what a round holds at most.
PIECE_RECORDS: Final = 100_000
# A round measures the copy rate when it copies at least this many records: a smaller one
# is mostly the cost of reading a window its few records lie scattered over.
RATE_RECORDS: Final = 100_000
# Headers of an original that its copy does not take from it.
NOT_COPIED: Final = frozenset({AUTHORIZATION, MESSAGE_ID, ORIGIN})
# A chunk is taken ahead only while the round's expected time, this many times over, ends
# before the due chunk's first bucket: the copy rate varies with the load beside it.
AHEAD_MARGIN: Final = 2.0
# (index field << FIELD_SHIFT) + offset: one sortable int64 per position (fields stay
# below 2**21, offsets below 2**40).
FIELD_SHIFT: Final = 40



def pieces(parts: list[tuple[int, int, BitMap64]],
           size: int) -> Iterator[list[tuple[int, int, np.ndarray]]]:
    """A round's positions, (bucket, index field, offsets), cut into pieces of about
    ``size`` offsets by offset: piece i holds the i-th slice of every field's offsets in
    offset order (at most ``size`` plus one per field). The pieces' reads are disjoint,
    so a round reads each log once however its buckets interleave in it, where pieces cut
    in bucket order would each read the whole window. Within a piece: (bucket, field)
    order, offsets ascending; a bucket is one run of the re-file log per piece it spans."""
    fields: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    total = 0
    for bucket, f, bm in parts:
        offs = np.asarray(bm.to_array(), dtype=np.int64)
        bs, os_ = fields.setdefault(f, ([], []))
        bs.append(np.full(len(offs), bucket, dtype=np.int64))
        os_.append(offs)
        total += len(offs)
    if not total:
        return
    n = -(-total // size)
    cut: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in range(n)]
    for f, (bs, os_) in fields.items():
        offsets, buckets = np.concatenate(os_), np.concatenate(bs)
        order = np.argsort(offsets, kind="stable")
        offsets, buckets = offsets[order], buckets[order]
        for i, (b_slice, o_slice) in enumerate(zip(np.array_split(buckets, n),
                                                   np.array_split(offsets, n), strict=True)):
            by_bucket = np.argsort(b_slice, kind="stable")
            b_slice, o_slice = b_slice[by_bucket], o_slice[by_bucket]
            starts = np.flatnonzero(np.diff(b_slice)) + 1
            for b_run, o_run in zip(np.split(b_slice, starts), np.split(o_slice, starts),
                                    strict=True):
                if len(o_run):
                    cut[i].append((int(b_run[0]), f, o_run))
    for piece in cut:
        if piece:
            yield sorted(piece, key=lambda x: x[:2])


def _without(piece: list[tuple[int, int, np.ndarray]],
             lost: list[ClaimedBucket]) -> list[tuple[int, int, np.ndarray]]:
    """``piece`` less the positions of the ``lost`` claims (a position belongs to one
    topic, so removing it removes that claim's record only)."""
    gone: dict[tuple[int, int], BitMap64] = {}
    for b in lost:
        for f, bm in b.positions.items():
            gone.setdefault((b.bucket_start, int(f)), BitMap64()).update(bm)
    out = []
    for bucket, f, offs in piece:
        drop = gone.get((bucket, f))
        if drop is not None:
            offs = offs[~np.isin(offs, np.asarray(drop.to_array(), dtype=np.int64))]
        if len(offs):
            out.append((bucket, f, offs))
    return out


@dataclass
class Round:
    """What one restage round did."""

    chunk: int | None = None
    topics: int = 0
    buckets: int = 0
    records: int = 0
    # Chunks after `chunk` claimed in the same round (a large one reads its window once).
    ahead: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)


class Restager:
    """Re-files chunk after chunk of future buckets (see the module docstring)."""

    def __init__(self, r: redislib.Redis, bootstrap: str, *, delayed_topic: str = names.DELAYED,
                 refiled_topic: str = names.REFILED, lead_ms: int = 40_000,
                 chunk_ms: int = 20_000, lease_ms: int = 30_000,
                 max_round_ms: int = 600_000, max_records: int = 1_000_000,
                 ahead_records: int = 100_000, ahead_chunks: int = 2,
                 compression_type: str = "none",
                 piece_records: int = PIECE_RECORDS) -> None:
        if not 0 < chunk_ms <= lead_ms:
            raise ValueError("restage needs 0 < chunk_ms <= lead_ms")
        self.redis = r
        self.bootstrap = bootstrap
        self.compression_type = compression_type
        self.topic = delayed_topic
        self.refiled_topic = refiled_topic
        self.lead_ms = lead_ms
        self.chunk_ms = chunk_ms
        self.lease_ms = lease_ms
        self.max_round_ms = max_round_ms
        self.max_records = max_records
        self.ahead_records = ahead_records
        self.ahead_chunks = ahead_chunks
        # Records/s of the last round's copy of RATE_RECORDS or more; None until then.
        self.copy_rate: float | None = None
        self.piece_records = piece_records
        self.stopping = threading.Event()
        self.error: str | None = None
        self._consumer: kafka.Consumer | None = None
        self._producer: kafka.BulkProducer | None = None

    def chunk_due(self, now_ms: int) -> int:
        """The chunk whose first bucket is `lead_ms` away or nearer."""
        return (now_ms + self.lead_ms) // self.chunk_ms

    def _varied_topics(self) -> list[str]:
        """Topics whose delays vary and whose positions point into our delayed topic."""
        topics = sorted(t.decode() for t in self.redis.smembers(keys.TOPICS))
        pipe = self.redis.pipeline(transaction=False)
        for t in topics:
            pipe.hmget(keys.stats(t), FIXED_FIELD, SOURCE_FIELD)
        mine = self.topic.encode()
        return [t for t, (fixed, source) in zip(topics, pipe.execute(), strict=True)
                if fixed == b"0" and source == mine]

    def run_once(self, now_ms: int | None = None) -> Round:
        """Re-file the due chunk for the topics not done yet (up to `max_records`; the
        rest go in the next round). A topic seen for the first time starts with the
        chunk after: part of the due one may be too near to move."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        started = time.monotonic()
        k = self.chunk_due(now)
        first, last = k * self.chunk_ms, (k + 1) * self.chunk_ms - 1
        claims: list[tuple[TopicIndex, ClaimedBucket]] = []
        ahead_of: dict[str, int] = {}  # topic: chunks claimed after k
        todo = 0
        rnd = Round(chunk=k)
        due: list[tuple[TopicIndex, int]] = []  # each topic claimed, with its due records
        for topic in self._varied_topics():
            idx = TopicIndex(self.redis, topic)
            done = idx.restaged_chunk()
            if done is None:
                idx.mark_restaged(k)
                continue
            if done >= k:
                continue
            if todo >= self.max_records:
                break
            if done < k - 1:
                self._passed(idx, done + 1, k - 1)
            rnd.topics += 1
            late = self._too_late(idx, first, last, now)
            if late is not None:
                RESTAGE_LEFT.inc(late)
                log.warning("restage: %d records of %s for [%d, %d] left where they lie: at "
                            "%.0f records/s they would be re-filed after they are due",
                            late, topic, first, last, self.copy_rate or 0)
                idx.mark_restaged(k)
                continue
            mine = idx.claim_between(first, last, now, 1_000_000, self.lease_ms)
            claims += [(idx, b) for b in mine]
            n = sum(b.count() for b in mine)
            todo += n
            due.append((idx, n))
            if not mine and not self._claimed_elsewhere(idx, first, last):
                idx.mark_restaged(k)
        # Then the chunks ahead, knowing what the due chunk alone costs.
        for idx, n in due:
            ahead, ahead_of[idx.topic] = self._claim_ahead(idx, k, n, todo, now)
            claims += [(idx, b) for b in ahead]
            todo += sum(b.count() for b in ahead)
        rnd.ahead = max(ahead_of.values(), default=0)
        rnd.buckets = len(claims)
        if not claims:
            return rnd
        claimed = time.monotonic()
        with LeaseKeeper(claims, self.lease_ms, self.max_round_ms,
                         renewed=RESTAGE_LEASE_RENEWALS, lost=RESTAGE_LEASES_LOST) as keeper:
            rnd.records = self._refile(claims, keeper)
            # A claim lost meanwhile is another round's now: it marks and completes.
            lost = keeper.lost
            held = [c for i, c in enumerate(claims) if i not in lost]
            # The originals leave the index: a rebuild must not index them again (their
            # copies in the re-file log are what is pending now).
            assert self._producer is not None
            write_marks(self._producer, [mark_record(self.topic, idx.topic, b.bucket_start,
                                                     b.positions) for idx, b in held])
            written = time.monotonic()
            # The mark goes first: once a bucket is completed, its copies (indexed in it
            # meanwhile) are live and unclaimed, and another replica's round that still
            # saw the chunk as not done would re-file them.
            for idx in {id(i): i for i, _ in claims}.values():
                idx.mark_restaged(k + ahead_of.get(idx.topic, 0))
            for idx, b in held:
                if not idx.complete(b.bucket_start, b.lease_id):
                    RESTAGE_LEASES_LOST.inc()
                    log.warning("restage claim on %s bucket %s lost before completion",
                                idx.topic, b.bucket_start)
        done_at = time.monotonic()
        if rnd.records >= RATE_RECORDS:
            self.copy_rate = rnd.records / max(written - claimed, 1e-3)
        rnd.timings_ms = {"claim": (claimed - started) * 1000,
                          "copy": (written - claimed) * 1000,
                          "complete": (done_at - written) * 1000}
        RESTAGED.inc(rnd.records)
        memory.release()  # a round held its chunk's records
        RESTAGE_SECONDS.observe(done_at - started)
        log.info("restaged %d records of %d buckets (%d topics) for [%d, %d] and %d chunks "
                 "ahead in %.0f ms (claim %.0f, copy %.0f, complete %.0f ms)", rnd.records,
                 rnd.buckets, rnd.topics, first, last, rnd.ahead, (done_at - started) * 1000,
                 *rnd.timings_ms.values())
        return rnd

    def _claim_ahead(self, idx: TopicIndex, k: int, count: int, todo: int,
                     now: int) -> tuple[list[ClaimedBucket], int]:
        """Claim the chunks after ``k`` for ``idx`` while the last one claimed held at
        least `ahead_records` (its window is worth reading once for several chunks), the
        round would stay within `max_records` were the next one as large and, at
        `copy_rate`, end well before chunk ``k`` is due (AHEAD_MARGIN), and no other claim
        holds buckets of it; an empty chunk ends the run. Returns the claims and how many
        chunks they cover."""
        out: list[ClaimedBucket] = []
        j = 0
        while (j < self.ahead_chunks and count >= self.ahead_records
               and todo + count <= self.max_records
               and self._fits(todo + count, k * self.chunk_ms - now)):
            first = (k + j + 1) * self.chunk_ms
            last = first + self.chunk_ms - 1
            if self._claimed_elsewhere(idx, first, last):
                break
            mine = idx.claim_between(first, last, now, 1_000_000, self.lease_ms)
            if not mine:
                break  # left to its own round, for what comes in meanwhile
            out += mine
            count = sum(b.count() for b in mine)
            todo += count
            j += 1
        return out, j

    def _passed(self, idx: TopicIndex, first_chunk: int, last_chunk: int) -> None:
        """Count and log the records of ``idx``'s chunks ``first_chunk``..``last_chunk``,
        whose lead passed before a round took them (a round ran long, or the tracker was
        down): the drain reads them where they lie. They are marked done, so they are
        counted once."""
        first, last = first_chunk * self.chunk_ms, (last_chunk + 1) * self.chunk_ms - 1
        n = idx.count_between(first, last)
        RESTAGE_LEFT.inc(n)
        if n:
            log.warning("restage: %d records of %s for [%d, %d] (%d chunks) left where they "
                        "lie: their lead passed before a round took them", n, idx.topic,
                        first, last, last_chunk - first_chunk + 1)
        idx.mark_restaged(last_chunk)

    def _too_late(self, idx: TopicIndex, first: int, last: int, now: int) -> int | None:
        """The records of ``idx``'s chunk [first, last] when, at the last round's copy
        rate, a round of them alone would end after the chunk's first bucket is due (it
        would hold that bucket from the drain); else None. The drain then reads them where
        they lie, many buckets a round once it is behind."""
        if not self.copy_rate:
            return None
        n = idx.count_between(first, last)
        return None if self._fits(n, first - now, margin=1.0) else n

    def _fits(self, records: int, due_in_ms: int, margin: float = AHEAD_MARGIN) -> bool:
        """Whether a round of ``records`` at the last round's copy rate, ``margin`` times
        over, ends within ``due_in_ms``; False with no rate measured."""
        if not self.copy_rate:
            return False
        return records / self.copy_rate * 1000 * margin <= due_in_ms

    def _claimed_elsewhere(self, idx: TopicIndex, first: int, last: int) -> bool:
        """Whether buckets of the chunk are held by another claim: a round of a tracker
        that died (its lease brings them back) or of another replica (it marks the chunk
        when done). Until then the chunk is not done."""
        return any(first <= int(b) <= last for b in self.redis.zrange(idx.keys.claims, 0, -1))

    def _refile(self, claims: list[tuple[TopicIndex, ClaimedBucket]],
                keeper: LeaseKeeper) -> int:
        """Append the claimed records to the re-file log, a piece of about
        ``piece_records`` records at a time (`pieces`: read once, ordered by bucket,
        handed to the producer, dropped: a round of any size holds one piece); returns
        once every copy is acknowledged (acks=all), else raises. A claimed position may
        already be in the re-file log (a chunk claimed again). Before each piece
        ``keeper`` says which claims were lost (their positions are left out) or ends the
        round (RoundExpired)."""
        if self._consumer is None or self._producer is None:
            self._consumer = kafka.Consumer(self.bootstrap,
                                            f"dwell-restage-{uuid.uuid4().hex}",
                                            **kafka.SCAN_CONFIG)
            self._producer = kafka.BulkProducer(self.bootstrap, linger_ms=5,
                                                compression_type=self.compression_type,
                                                **{"batch.size": 1 << 20})
        parts = [(b.bucket_start, int(f), bm) for _, b in claims
                 for f, bm in b.positions.items()]
        wanted = sum(len(bm) for _, _, bm in parts)
        copied = left_out = 0
        try:
            # A piece's records, their headers and their copies all live until the piece
            # is handed over: nothing for the cyclic collector to find (memory).
            with memory.cycles_paused():
                for piece in pieces(parts, self.piece_records):
                    lost = keeper.check()
                    if lost:
                        n = sum(len(offs) for _, _, offs in piece)
                        piece = _without(piece, [claims[i][1] for i in lost])
                        left_out += n - sum(len(offs) for _, _, offs in piece)
                    if piece:
                        copied += self._refile_piece(piece)
            self._producer.flush()
        except BaseException:
            self.close()
            raise
        if left_out:
            log.warning("restage: %d positions of lost claims left to their new holder",
                        left_out)
        if wanted - left_out > copied:
            log.warning("restage: %d claimed positions had no record (expired or aborted)",
                        wanted - left_out - copied)
        return copied

    def _refile_piece(self, piece: list[tuple[int, int, np.ndarray]]) -> int:
        """Read one piece's records (one pass per log) and hand them to the producer in
        (bucket, field, offset) order."""
        assert self._consumer is not None and self._producer is not None
        key = np.concatenate([(f << FIELD_SHIFT) + offs for _, f, offs in piece])
        bucket = np.concatenate([np.full(len(offs), b, dtype=np.int64)
                                 for b, _, offs in piece])
        order = np.argsort(key, kind="stable")
        key, bucket = key[order], bucket[order]
        msgs: list[kafka.Message] = []
        fields: list[int] = []
        for refiled, log_topic in ((False, self.topic), (True, self.refiled_topic)):
            offsets: dict[int, list[int]] = {}
            for _, f, offs in piece:
                is_refiled, partition = field_partition(f)
                if is_refiled is refiled:
                    offsets.setdefault(partition, []).extend(offs.tolist())
            if not offsets:
                continue
            wanted = {p: sorted(set(o)) for p, o in offsets.items()}
            base = REFILED_FIELD_BASE if refiled else 0
            for msg in kafka.read_offsets(self._consumer, log_topic, wanted, MAX_GAP):
                msgs.append(msg)
                fields.append(msg.partition() + base)
        if not msgs:
            return 0
        f_arr = np.array(fields, dtype=np.int64)
        off_arr = np.fromiter((m.offset() for m in msgs), dtype=np.int64, count=len(msgs))
        rows_bucket = bucket[np.searchsorted(key, (f_arr << FIELD_SHIFT) + off_arr)]
        out: list[kafka.OutRecord] = []
        for i in np.lexsort((off_arr, f_arr, rows_bucket)).tolist():
            msg, f = msgs[i], fields[i]
            raw = msg.headers() or []
            # A client's credentials never ride on a copy (dwell_spark.records).
            if f >= REFILED_FIELD_BASE:
                # A copy re-filed again: it carries its original's id and origin.
                hs = [(k, b"" if v is None else v) for k, v in raw if k != AUTHORIZATION]
            else:
                # An original: its id and origin are where it lies, whatever a header says.
                off = int(off_arr[i])
                hs = [(k, b"" if v is None else v) for k, v in raw if k not in NOT_COPIED]
                hs.append((MESSAGE_ID, format_message_id(self.topic, f, off).encode()))
                hs.append((ORIGIN, b"%d:%d" % (f, off)))
            out.append((self.refiled_topic, msg.value(), msg.key(), hs, None))
        self._producer.send_unreported(out)
        return len(out)

    def run(self, interval_ms: int = 1000) -> None:
        """Rounds until `stop`; a failed round's claims come back after `lease_ms`."""
        while not self.stopping.is_set():
            try:
                rnd = self.run_once()
                self.error = None
            except (redislib.RedisError, OSError, kafka.KafkaUnavailable) as exc:
                self.error = str(exc)
                log.warning("restage round failed, its claims come back after the lease: %s",
                            exc)
                rnd = Round()
            if not rnd.buckets and not rnd.topics:
                self.stopping.wait(interval_ms / 1000)

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = None
        if consumer is not None:
            consumer.close()
        if producer is not None:
            producer.close(1.0)
