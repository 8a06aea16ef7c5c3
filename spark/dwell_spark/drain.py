"""The drain: each trigger claims the due buckets of every topic's index and every
subscription's redelivery index (the tracker's Lua claim, so two drainers never emit one
bucket), copies the indexed records from their source topic to the ready / retry topic
(on the driver, or spread over Spark tasks; see choose_path), and only then completes
the claims. While a round works its leases are renewed (dwell.index.leases), up to
drain_max_round_ms. A crash between write and complete re-emits the bucket once its lease
expires; the SDK drops the repeats by (dwell-message-id, redelivery count)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence, Set
from dataclasses import dataclass, replace
from itertools import groupby

import numpy as np
import redis as redislib
from pyroaring import BitMap64
from pyspark.sql import DataFrame, SparkSession

from dwell import keys, memory
from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.buckets import bucket_due_cutoff
from dwell.core.positions import field_partition, format_message_id
from dwell.core.topics import TopicName, dlq_topic, retry_topic
from dwell.index.bucket_index import ClaimedBucket
from dwell.index.leases import LeaseKeeper
from dwell.index.marks import mark_record, write_marks
from dwell.index.redelivery import SubscriptionIndex, due_subscriptions
from dwell.index.topic import TopicIndex, due_topics

from . import metrics
from .records import (
    MAX_GAP,
    Copier,
    CopyStats,
    LostClaims,
    Range,
    copy_ranges,
    is_dead_letter,
    spans,
)
from .settings import SparkSettings

log = logging.getLogger("dwell.spark.drain")
# A round this large leaves freed memory behind in the allocator: give it back.
RELEASE_AFTER_RECORDS = 10_000
# A topic whose copy failed is retried alone, after a wait that doubles with each failure
# in a row, from the drain's lease up to this.
FAILING_RETRY_MAX_MS = 300_000


@dataclass
class Claim:
    index: TopicIndex | SubscriptionIndex
    bucket: ClaimedBucket
    # What the bucket's records are copied from and to.
    ranges: list[Range]
    # messageIds of the bucket's dead letters, whose stored counts go once it is written.
    dead_letters: tuple[str, ...] = ()
    # Its place in the round's claims (Range.claim, LeaseKeeper's claim numbers).
    number: int = -1
    # Cancelled messages of the bucket (TopicIndex.cancelled_in), passed over.
    cancelled: int = 0


class TopicCache:
    """Kafka topics known to exist, so each is created (if missing) once per process."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.known: set[str] = set()

    def ensure(self, topics: Sequence[str]) -> None:
        new = set(topics) - self.known
        if not new:
            return
        # One metadata request for all of them. Only the missing ones are created:
        # ensure_topic on an existing topic with fewer partitions than asked would wait
        # for partitions that never come.
        for t in new - kafka.topic_names(self.bootstrap):
            kafka.ensure_topic(self.bootstrap, t, self.partitions)
        self.known |= new


def choose_path(settings: SparkSettings, ranges: Sequence[Range]) -> str:
    """Which copy runs a round (bench/delivery.py compares them):

    - ``driver``: up to ``drain_local_max_records`` records, copied by the lean Python
      loop on the driver: no Spark job to schedule (a job's fixed cost is paid even for
      one record), so small rounds stay on time.
    - ``tasks``: every larger round: the same lean Python copy, with the (source,
      partition) runs spread over Spark tasks.
    """
    n = sum(r.size for r in ranges)
    return "driver" if n <= settings.drain_local_max_records else "tasks"


def write_ranges(spark: SparkSession, settings: SparkSettings, topics: TopicCache,
                 ranges: Sequence[Range]) -> int:
    """Copy every record of ``ranges`` to its target topic; returns the records written.
    Returns only once every copy is acknowledged (acks=all); raises otherwise."""
    return copy(spark, settings, topics, ranges).written


def copy(spark: SparkSession, settings: SparkSettings, topics: TopicCache,
         ranges: Sequence[Range], path: str | None = None,
         copier: Copier | None = None, lost: LostClaims | None = None) -> CopyStats:
    """:func:`write_ranges` with what was written (for the metrics); ``path`` forces one
    of :func:`choose_path`'s answers (the bench compares them); ``copier`` (the driver's
    long-lived Kafka clients) runs the ``driver`` path. ``lost`` (records.LostClaims)
    stops the driver path's copy of claims whose lease was lost; Spark tasks copy their
    ranges whole."""
    if not ranges:
        return CopyStats()
    topics.ensure([r.target for r in ranges])
    bootstrap = settings.kafka_bootstrap
    codec = settings.kafka_compression_type
    path = path or choose_path(settings, ranges)
    if path == "driver":
        stats = (copier.copy(ranges, lost) if copier
                 else copy_ranges(bootstrap, ranges, codec, lost))
    else:
        groups = spans(ranges)
        slices = max(1, min(len(groups), spark.sparkContext.defaultParallelism * 2))
        parts = spark.sparkContext.parallelize(groups, slices).mapPartitions(
            lambda it: [copy_ranges(bootstrap, [r for g in it for r in g], codec)]).collect()
        stats = functools.reduce(CopyStats.add, parts, CopyStats())
    metrics.record(stats)
    if stats.foreign:
        # Once per copy, however many: an event can name any record in Kafka.
        first = ", ".join(mid for _, mid in stats.foreign[:3])
        log.warning("%d redeliveries not copied: the record their messageId names is not "
                    "one of their topic's (first: %s); their entries are dropped",
                    len(stats.foreign), first)
    return stats


def _spans(offsets: BitMap64, max_gap: int) -> Iterator[tuple[np.ndarray, int, int]]:
    """The sorted offsets as one array, and (start, end) slices of it whose neighbours are
    at most ``max_gap`` apart; numpy, since a bucket may hold millions of offsets and a
    Python loop over them would delay the round."""
    a = np.frombuffer(offsets.to_array(), dtype=np.uint64).astype(np.int64)
    cuts = (np.flatnonzero(np.diff(a) > max_gap) + 1).tolist()
    for lo, hi in zip([0, *cuts], [*cuts, len(a)], strict=True):
        yield a, lo, hi


def topic_ranges(topic: str, bucket: ClaimedBucket, claim: int = -1,
                 cancelled: Set[bytes] = frozenset()) -> list[Range]:
    """One Range per span of a bucket's offsets (records.MAX_GAP apart at most), from
    `dwell.delayed` or the re-file log (dwell.core.positions.field_partition): a span
    whose offsets are not all consecutive (topics sharing a partition of dwell.delayed
    interleave) carries its offsets, instead of becoming one Range per run. ``claim``:
    the bucket's number in its round (Range.claim). ``cancelled``: the bucket's cancelled
    positions of `dwell.delayed` (``b"<partition>:<offset>"``, TopicIndex.cancelled_in),
    left out of its offsets there and passed over among the re-filed copies."""
    target = TopicName.parse(topic).kafka_topic
    gone: dict[int, BitMap64] = {}
    for member in cancelled:
        p, _, o = member.partition(b":")
        gone.setdefault(int(p), BitMap64()).add(int(o))
    copies = frozenset(cancelled) if cancelled else None
    out = []
    for f, offsets in bucket.positions.items():
        refiled, p = field_partition(int(f))
        if not refiled and p in gone:
            offsets = offsets - gone[p]
        if not offsets:
            continue
        source = names.REFILED if refiled else names.DELAYED
        for a, lo, hi in _spans(offsets, MAX_GAP):
            first, last = int(a[lo]), int(a[hi - 1])
            dense = last - first + 1 == hi - lo
            out.append(Range(target, source, p, first, last,
                             offsets=None if dense else BitMap64(a[lo:hi]), claim=claim,
                             cancelled=copies if refiled else None))
    return out


def redelivery_ranges(index: SubscriptionIndex, bucket: ClaimedBucket,
                      claim: int = -1) -> list[Range]:
    """The claimed bucket's entries as ranges to the subscription's retry topic, with
    their redelivery counts; entries whose count is stored as -(count + 1) go to its DLQ
    with that count (dead letters, see dwell_spark.backoff). One range per run of
    consecutive offsets with one target. ``claim``: as for topic_ranges."""
    topic = TopicName.parse(index.topic)
    retry, dlq = retry_topic(topic, index.subscription), dlq_topic(topic, index.subscription)
    own = index.topic.encode()
    out = []
    for field, offsets in bucket.positions.items():
        source, _, part = str(field).rpartition(":")
        offs = [int(o) for o in offsets]
        stored = index.stored_counts([format_message_id(source, int(part), o) for o in offs])
        entries = enumerate(zip(offs, stored, strict=True))
        # offset - position is constant along a run of consecutive offsets.
        for (_, dead), run in groupby(entries, key=lambda e: (e[1][0] - e[0], e[1][1] < 0)):
            counts = {o: (-c - 1 if dead else max(1, c)) for _, (o, c) in run}
            out.append(Range(dlq if dead else retry, source, int(part), min(counts),
                             max(counts), index.subscription, counts, claim=claim,
                             topic=own))
    return out


def claimed_ids(bucket: ClaimedBucket) -> list[str]:
    """The messageIds of a claimed redelivery bucket's entries."""
    out = []
    for field, offsets in bucket.positions.items():
        source, _, part = str(field).rpartition(":")
        out += [format_message_id(source, int(part), int(o)) for o in offsets]
    return out


def lost_below(r: Range, start: int) -> tuple[int, Range | None]:
    """How many of ``r``'s records lie below ``start``, and what is left of ``r`` from it
    (None when nothing is)."""
    if r.first >= start:
        return 0, r
    if r.offsets is not None:
        gone = int(r.offsets.rank(start - 1))
    else:
        gone = min(r.last, start - 1) - r.first + 1
    if r.last < start:
        return gone, None
    offsets = None if r.offsets is None else BitMap64(o for o in r.offsets if o >= start)
    counts = {o: n for o, n in r.counts.items() if o >= start}
    return gone, replace(r, first=start if offsets is None else offsets.min(),
                         offsets=offsets, counts=counts)


@dataclass
class _Failing:
    """A topic whose last copy failed: how many times in a row, how many of those alone
    while other topics were delivered (its own fault), and when to try again."""

    rounds: int
    own: int
    retry_at_ms: int


class Drainer:
    """What one drain trigger does, driver side.

    A topic whose copy fails cannot hold the others back: the round's topics are copied
    together, and when that copy fails each of them is tried alone in later rounds (a
    topic that succeeds alone joins the others again). A topic that keeps failing is
    retried with a doubling wait, is counted in `dwell_drain_topic_failures_total`
    and `dwell_drain_failing_topics`, and its buckets stay in the index meanwhile."""

    def __init__(self, spark: SparkSession, settings: SparkSettings,
                 redis: redislib.Redis, acks_read_to: Callable[[], int] | None = None) -> None:
        self.spark = spark
        # The time before which the backoff has applied every dwell.acks event
        # (dwell_spark.recovery.IndexKeeper.read_to): a redelivery due after it waits, as
        # an ack for it may not be read yet. None: redeliveries go when due (no backoff).
        self.acks_read_to = acks_read_to
        # Whether the last round could not tell how far the backoff has read.
        self._blind = False
        self.settings = settings
        self.redis = redis
        self.topics = TopicCache(settings.kafka_bootstrap, settings.topic_partitions)
        self.strict = settings.delayed_delivery_deliver_at_time_strict
        self.copier = Copier(settings.kafka_bootstrap, settings.kafka_compression_type)
        # dwell.delivered: what a rebuild of a lost index must not deliver again.
        self.marks = kafka.BulkProducer(settings.kafka_bootstrap, linger_ms=0,
                                        compression_type=settings.kafka_compression_type)
        self.failing: dict[str, _Failing] = {}
        self.starts = kafka.LogStarts(settings.kafka_bootstrap)

    def _waiting(self, topic: str, now_ms: int) -> bool:
        f = self.failing.get(topic)
        return f is not None and now_ms < f.retry_at_ms

    def claim(self, now_ms: int) -> list[Claim]:
        """Claim what is due; the ranges of claim ``i`` carry ``Range.claim == i``."""
        s = self.settings
        claims: list[Claim] = []
        due = due_topics(self.redis, now_ms, self.strict)
        subs = due_subscriptions(self.redis, now_ms)
        # A failing topic with nothing due any more (emptied, deleted) is failing no more.
        for t in set(self.failing) - set(due) - {t for t, _ in subs}:
            del self.failing[t]
        for topic in due:
            if self._waiting(topic, now_ms):
                continue
            idx = TopicIndex(self.redis, topic)
            mine = idx.claim(now_ms, s.drain_max_buckets, s.drain_lease_ms, self.strict)
            # Read after the claim: a cancel the index answered before it is here, and
            # one after it found the lease and answered too late (cancel-5.lua).
            cancelled = idx.cancelled_in(b.bucket_start for b in mine) if mine else {}
            for b in mine:
                n = len(claims)
                gone = cancelled.get(b.bucket_start, frozenset())
                claims.append(Claim(idx, b, topic_ranges(topic, b, n, gone), number=n,
                                    cancelled=len(gone)))
        # Redeliveries are never early: only buckets whose last millisecond passed, and
        # the backoff has read every event before it.
        read_to = self._acks_read_to(now_ms) if subs else now_ms
        cutoff = bucket_due_cutoff(min(now_ms, read_to), s.redelivery_tick_ms, strict=True)
        for topic, sub in subs:
            if self._waiting(topic, now_ms):
                continue
            sidx = SubscriptionIndex(self.redis, topic, sub)
            for b in sidx.claim(now_ms, s.drain_max_buckets, s.drain_lease_ms, cutoff):
                n = len(claims)
                mine = redelivery_ranges(sidx, b, n)
                dead = tuple(format_message_id(r.source, r.partition, o)
                             for r in mine if is_dead_letter(r) for o in r.counts)
                claims.append(Claim(sidx, b, mine, dead, n))
        return claims

    def _acks_read_to(self, now_ms: int) -> int:
        """`acks_read_to` less a millisecond (another event may share its timestamp), or
        0 when it cannot tell (Kafka or Redis not answering): no redelivery this round."""
        if self.acks_read_to is None:
            return now_ms
        try:
            read_to = self.acks_read_to() - 1
        except Exception as exc:
            if not self._blind:  # once an outage, not every round of it
                log.warning("redeliveries wait: how far the backoff has read is not known "
                            "(%s)", exc)
            self._blind = True
            return 0
        if self._blind:
            log.info("redeliveries go again: how far the backoff has read is known")
            self._blind = False
        return read_to

    def lag_ms(self, now_ms: int) -> int:
        """now − the earliest bucket start left in any index (topic or redelivery), 0 when
        none is past: how far the drain is behind (before this round claims)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrange(keys.DUE, 0, 0, withscores=True)
        pipe.zrange(keys.DUE_SUBSCRIPTIONS, 0, 0, withscores=True)
        firsts = [int(score) for rows in pipe.execute() for _, score in rows]
        return max(0, now_ms - min(firsts)) if firsts else 0

    def run_once(self, now_ms: int | None = None, path: str | None = None) -> int:
        """Claim, write, complete; returns the records written. ``path`` forces a copy
        path (see :func:`choose_path`). Raises when no topic's copy succeeded and one
        failed."""
        started = time.monotonic()
        now = int(time.time() * 1000) if now_ms is None else now_ms
        metrics.DRAIN_LAG_MS.set(self.lag_ms(now))
        claims = self.claim(now)
        if not claims:
            return 0
        by_topic: dict[str, list[Claim]] = {}
        for c in claims:
            by_topic.setdefault(c.index.topic, []).append(c)
        # The topics not failing lately together, each failing one alone.
        groups = [[t for t in by_topic if t not in self.failing]]
        groups = [g for g in groups if g] + [[t] for t in by_topic if t in self.failing]
        written = 0
        failed: list[tuple[list[str], Exception]] = []
        # Every claim of the round stays ours while any group is written, the later
        # groups' too.
        with LeaseKeeper([(c.index, c.bucket) for c in claims], self.settings.drain_lease_ms,
                         self.settings.drain_max_round_ms, renewed=metrics.LEASE_RENEWALS,
                         lost=metrics.LEASES_LOST) as keeper:
            for group in groups:
                gclaims = [c for t in group for c in by_topic[t]]
                try:
                    written += self._deliver(gclaims, path, keeper)
                except Exception as exc:
                    # Its claims come back one lease after their last renewal.
                    keeper.drop(c.number for c in gclaims)
                    failed.append((group, exc))
                    continue
                for t in group:
                    if self.failing.pop(t, None) is not None:
                        log.info("topic %s delivers again", t)
        for group, exc in failed:
            # Only a topic that failed alone while others were delivered is the topic's own
            # fault; when nothing was (Kafka or Redis away), the leases pace the retries.
            self._failed(group, now, exc, own_fault=len(failed) < len(groups))
        metrics.FAILING_TOPICS.set(len(self.failing))
        if written >= RELEASE_AFTER_RECORDS:
            memory.release()
        if failed and len(failed) == len(groups):
            raise failed[0][1]
        if self.failing:
            log.info("drain round: %d records in %.0f ms; %d topics, %d of them failing",
                     written, (time.monotonic() - started) * 1000, len(by_topic),
                     len(self.failing))
        return written

    def _deliver(self, claims: Sequence[Claim], path: str | None,
                 keeper: LeaseKeeper) -> int:
        """Copy the records of ``claims``, mark them delivered, complete the claims.
        ``keeper`` renews the round's leases: the copy stops writing a claim it lost, and
        fails (RoundExpired) past the round's maximum time."""
        started = time.monotonic()
        keeper.check()  # a group that starts after the round's maximum time fails at once
        self._drop_lost(claims)
        ranges = [r for c in claims for r in c.ranges]
        path = path or choose_path(self.settings, ranges)
        stats = copy(self.spark, self.settings, self.topics, ranges, path, self.copier,
                     keeper.check)
        written = stats.written
        foreign: dict[int, list[str]] = {}
        for claim, mid in stats.foreign:
            foreign.setdefault(claim, []).append(mid)
        # A claim lost meanwhile is another drainer's now: it writes the marks and
        # completes.
        lost = keeper.lost
        held = [c for c in claims if c.number not in lost]
        write_marks(self.marks, [mark_record(names.DELAYED, c.index.topic,
                                             c.bucket.bucket_start, c.bucket.positions)
                                 for c in held if isinstance(c.index, TopicIndex)])
        copied = time.monotonic()
        for c in held:
            if not c.index.complete(c.bucket.bucket_start, c.bucket.lease_id):
                # Our lease expired and another drainer holds the bucket: it re-emits,
                # the SDK drops the repeats.
                metrics.LEASES_LOST.inc()
                log.warning("claim on bucket %s lost before completion", c.bucket.bucket_start)
            else:
                if c.cancelled:
                    # Passed over for good: the bucket is gone.
                    c.index.forget_cancelled([c.bucket.bucket_start])
                    metrics.CANCELLED.labels(c.index.topic).inc(c.cancelled)
                # No event follows a dead letter (a redelivery's count stays until its ack);
                # nor a record of another topic, which is never copied.
                gone = (*c.dead_letters, *foreign.get(c.number, ()))
                if gone:
                    c.index.forget(*gone)
                if isinstance(c.index, SubscriptionIndex):
                    # Redelivered: no later event can cancel these entries any more.
                    c.index.forget_claimed(c.bucket.bucket_start, claimed_ids(c.bucket))
        log.info("drained %d records from %d buckets in %.0f ms (%s; copy %.0f, complete "
                 "%.0f ms)", written, len(claims), (time.monotonic() - started) * 1000, path,
                 (copied - started) * 1000, (time.monotonic() - copied) * 1000)
        return written

    def _drop_lost(self, claims: Sequence[Claim]) -> None:
        """Take out of ``claims`` the positions whose records are gone from their log (below
        its first offset): they can never be copied, and waiting for them would hold the
        topic back for good. Reported once, as the claims then complete without them."""
        starts = self.starts.get({(r.source, r.partition) for c in claims for r in c.ranges})
        lost: dict[str, int] = {}
        for c in claims:
            kept = []
            for r in c.ranges:
                start = starts[(r.source, r.partition)]
                if r.first >= start:
                    kept.append(r)
                    continue
                gone, rest = lost_below(r, start)
                lost[c.index.topic] = lost.get(c.index.topic, 0) + gone
                if rest is not None:
                    kept.append(rest)
            c.ranges = kept
        for topic, n in lost.items():
            metrics.MESSAGES_LOST.labels(topic).inc(n)
            log.error("topic %s: %d pending messages lost, their records are gone from the "
                      "log (deleted or truncated); delivering the rest", topic, n)

    def _failed(self, group: Sequence[str], now_ms: int, exc: Exception,
                own_fault: bool) -> None:
        """Each topic of a failed copy is tried alone from now on, once its claims come
        back after the lease. A topic at fault (it failed alone while others were
        delivered, now or before) waits longer, doubling from the lease up to
        FAILING_RETRY_MAX_MS with each failure in a row."""
        for t in group:
            f = self.failing.get(t) or _Failing(0, 0, 0)
            own = f.own + 1 if len(group) == 1 and (own_fault or f.own) else f.own
            wait = 0
            if own:
                wait = min(FAILING_RETRY_MAX_MS, self.settings.drain_lease_ms << min(own - 1, 16))
            self.failing[t] = _Failing(f.rounds + 1, own, now_ms + wait)
            metrics.TOPIC_FAILURES.labels(t).inc()
        if len(group) == 1:
            f = self.failing[group[0]]
            log.warning("delivery of topic %s failed (%d in a row), retried in %.0f s: %s",
                        group[0], f.rounds,
                        max(f.retry_at_ms - now_ms, self.settings.drain_lease_ms) / 1000, exc)
        else:
            log.warning("a drain copy of %d topics failed, each is retried alone: %s",
                        len(group), exc)


def start(spark: SparkSession, settings: SparkSettings, redis: redislib.Redis,
          acks_read_to: Callable[[], int] | None = None):
    """The drain as a streaming query: a one-row source ticks every trigger, foreachBatch
    runs one claim-write-complete round on the driver. ``acks_read_to``: Drainer's."""
    drainer = Drainer(spark, settings, redis, acks_read_to)
    metrics.expect_query("drain")

    def _batch(_df: DataFrame, batch_id: int) -> None:
        with metrics.batch_running("drain"):
            try:
                drainer.run_once()
                metrics.batch_done("drain")
            except Exception:
                # Claims stay leased and come back after drain_lease_ms; keep the query
                # alive.
                log.exception("drain round failed; its claims come back after the lease")

    # rate-micro-batch offers a row per trigger; plain `rate` advances in whole seconds,
    # so triggers between them find no input and the drain would run once a second.
    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
            .writeStream.queryName("dwell-drain")
            .foreachBatch(_batch)
            .trigger(processingTime=f"{settings.drain_trigger_ms} milliseconds")
            .option("checkpointLocation", f"{settings.spark_checkpoint_dir}/drain")
            .start())
