"""Copying indexed records from their source topic to the ready / retry / DLQ topic in
Python (on the driver for small rounds, inside Spark tasks for large scattered ones), with
dwell's headers (docs/internals.md). The lean loop works on confluent-kafka's messages
directly: building a `Record` with a header dict and a Future per record would cost far
more than the copy itself."""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass, field

import numpy as np
from pyroaring import BitMap64

from dwell import headers as hdr
from dwell import memory
from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.positions import format_message_id
from dwell.core.topics import TopicName

# Headers a copy sets itself, replacing any the source record carries.
_ORIGIN = hdr.ORIGIN
_MESSAGE_ID = hdr.MESSAGE_ID
_COUNT = hdr.REDELIVERY_COUNT
_SUBSCRIPTION = hdr.SUBSCRIPTION
_DELIVER_AT = hdr.DELIVER_AT
_PARTITION = hdr.PARTITION
# Headers not copied: those that only make sense on dwell.delayed (the copy carries the
# key itself, and is written to the partition dwell-partition names), those the copy
# sets, and a client's credentials (dwell-authorization), which no record dwell writes
# may carry to another reader, whatever wrote the record copied. A ready-topic record's
# dwell-origin (where it came from out of dwell.delayed) stays; a redelivery's count and
# subscription are re-set.
_DROP_READY = frozenset((hdr.KEY, hdr.TICK_TIME, _PARTITION, _MESSAGE_ID, hdr.AUTHORIZATION))
_DROP_DELAYED = _DROP_READY | {_ORIGIN}
_REDELIVERY = frozenset((_COUNT, _SUBSCRIPTION))
READ_TIMEOUT_S = 30.0
SEND_CHUNK = 2000
MAX_GAP = 2000
# Large fetches: a range is read in a few round trips instead of 1 MiB at a time.
READER_CONFIG = kafka.SCAN_CONFIG
# Lateness histogram bounds (ms) shared by every copy path and the Prometheus metric.
LATENESS_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 750, 1000, 1250, 1500, 2000, 3000,
                      5000, 10000, 30000, 60000)


@dataclass(frozen=True, slots=True)
class Range:
    """Offsets ``first..last`` (inclusive) of ``source`` to copy to ``target``; only those
    in ``offsets`` when it is set (a scattered span: one Range instead of one per run,
    checked with one C-level lookup per record read).

    ``counts`` (offset → redelivery count) and ``subscription`` are set for redeliveries.
    ``claim`` numbers the claimed bucket the range copies within its drain round (-1:
    none), so that a copy can stop writing a bucket whose lease was lost.

    ``topic`` (UTF-8 bytes of a Pulsar topic) is set for redeliveries and dead letters:
    the event's topic, which each record read must carry as its `dwell-topic` (or a
    partition of it, or its partitioned topic); a record of another topic is not copied
    (CopyStats.foreign), since a messageId can name any record in Kafka.

    ``cancelled`` (a range of the re-file log): the `dwell-origin` values of cancelled
    messages (``b"<partition>:<offset>"``), whose copies are passed over
    (CopyStats.cancelled). A range of `dwell.delayed` leaves them out of its offsets.
    """

    target: str
    source: str
    partition: int
    first: int
    last: int
    subscription: str | None = None
    counts: dict[int, int] = field(default_factory=dict)
    offsets: BitMap64 | None = None
    claim: int = -1
    topic: bytes | None = None
    cancelled: frozenset[bytes] | None = None

    @property
    def size(self) -> int:
        """Records to copy."""
        return self.last - self.first + 1 if self.offsets is None else len(self.offsets)

    def wanted(self) -> list[int]:
        return (list(range(self.first, self.last + 1)) if self.offsets is None
                else self.offsets.to_array().tolist())


@dataclass(slots=True)
class CopyStats:
    """What a copy wrote: records, lateness histogram counts (per LATENESS_BOUNDS_MS bucket
    plus +Inf), lateness sum, and redeliveries by count. Summed across tasks."""

    written: int = 0
    lateness_counts: list[int] = field(
        default_factory=lambda: [0] * (len(LATENESS_BOUNDS_MS) + 1))
    lateness_sum_ms: float = 0.0
    redeliveries: Counter = field(default_factory=Counter)
    dead_letters: int = 0
    # (claim, messageId) of the records a redelivery range named that were not copied:
    # another topic's (Range.topic).
    foreign: list[tuple[int, str]] = field(default_factory=list)
    # Re-filed copies of cancelled messages passed over (Range.cancelled).
    cancelled: int = 0

    def add(self, other: CopyStats) -> CopyStats:
        self.written += other.written
        self.cancelled += other.cancelled
        self.foreign += other.foreign
        self.lateness_counts = [a + b for a, b in
                                zip(self.lateness_counts, other.lateness_counts, strict=True)]
        self.lateness_sum_ms += other.lateness_sum_ms
        self.redeliveries.update(other.redeliveries)
        self.dead_letters += other.dead_letters
        return self

    def observe_lateness(self, emitted_ms: int, deliver_at: Sequence[int | bytes]) -> None:
        """Lateness of records due at ``deliver_at`` (ms, as ints or decimal bytes; values
        that are not a number are left out) and emitted at ``emitted_ms``."""
        if not deliver_at:
            return
        try:
            due = np.array(deliver_at).astype(np.int64)
        except (ValueError, OverflowError):
            due = np.array([int(v) for v in deliver_at if _is_int(v)], dtype=np.int64)
        late = emitted_ms - due
        idx = np.searchsorted(np.asarray(LATENESS_BOUNDS_MS), late, side="left")
        counts = np.bincount(idx, minlength=len(LATENESS_BOUNDS_MS) + 1)
        self.lateness_counts = [a + int(b) for a, b in
                                zip(self.lateness_counts, counts, strict=True)]
        self.lateness_sum_ms += float(late.sum())


def _is_int(v: int | bytes) -> bool:
    try:
        return -(2**63) <= int(v) < 2**63
    except ValueError:
        return False


def is_dead_letter(rng: Range) -> bool:
    """A range the backoff job sends to a subscription's DLQ (dwell.core.topics.dlq_topic
    names end in -DLQ; retry topics in -RETRY)."""
    return rng.subscription is not None and rng.target.endswith("-DLQ")


@functools.lru_cache(maxsize=4096)
def same_topic(carried: bytes | None, expected: bytes) -> bool:
    """Whether a record whose `dwell-topic` is ``carried`` is one of topic ``expected``:
    the same topic, or either a partition `x-partition-N` of the other's partitioned
    topic (a partition's messages share the ready topic of x)."""
    if carried == expected:
        return True
    if not carried:
        return False
    try:
        a = TopicName.parse(carried.decode()).partitioned_topic
        b = TopicName.parse(expected.decode()).partitioned_topic
    except (UnicodeDecodeError, ValueError):
        return False
    return a == b


def _header(msg, name: str) -> bytes | None:
    """The record's header ``name`` (the last, as for every header lookup of a copy)."""
    found = None
    for n, value in msg.headers() or ():
        if n == name:
            found = value
    return found


def spans(ranges: Iterable[Range], max_gap: int = MAX_GAP) -> list[list[Range]]:
    """Group ranges of one (source, partition) that lie within ``max_gap`` offsets of each
    other: each group is read in one pass, because re-positioning a consumer costs a
    fetch round trip (one seek per range would make scattered offsets crawl), while
    reading past a few unwanted records costs next to nothing."""
    out: list[list[Range]] = []
    end = 0  # the highest offset of the current group: ranges of topics sharing a
    # partition overlap, so a group's end is not its last range's
    for rng in sorted(ranges, key=lambda r: (r.source, r.partition, r.first)):
        cur = out[-1] if out else None
        if (cur and (cur[-1].source, cur[-1].partition) == (rng.source, rng.partition)
                and rng.first - end <= max_gap):
            cur.append(rng)
            end = max(end, rng.last)
        else:
            out.append([rng])
            end = rng.last
    return out


def output_record(rng: Range, msg, deliver_at: list[bytes],
                  partitions: list[int] | None = None) -> kafka.OutRecord:
    """(topic, value, key, headers, None) of the copy of confluent-kafka message ``msg``
    (read from ``rng.source``, partition ``rng.partition``); appends its dwell-deliver-at
    (if any, as the header's bytes) to ``deliver_at`` for the lateness metric, and the
    partition of the target to write it to (-1: the partitioner's choice) to
    ``partitions`` when given: the one its dwell-partition names (a message published to
    a partition `x-partition-N`) for a ready copy from the delay logs.

    The hottest line of the drain: the header list is filtered by one comprehension and
    looked up through one dict (C-level), not by a Python branch per header."""
    hs = msg.headers() or []
    d = dict(hs)  # the last value of a repeated name wins, as for every lookup below
    off = msg.offset()
    if rng.source == names.REFILED:
        # A copy the tracker re-filed (dwell.tracker.restage): it carries the original's
        # dwell-origin and dwell-message-id.
        drop, key, origin = _DROP_READY, d.get(hdr.KEY), []
    elif rng.source == names.DELAYED:
        drop, key = _DROP_DELAYED, d.get(hdr.KEY)
        origin = [(_ORIGIN, b"%d:%d" % (rng.partition, off))]
    else:
        drop, key, origin = _DROP_READY, msg.key(), []
    if rng.subscription is None:
        headers = [h for h in hs if h[0] not in drop]
        at = d.get(_DELIVER_AT)
        if at:  # redeliveries are not late, and have no lateness
            deliver_at.append(at)
        if partitions is not None:
            p = d.get(_PARTITION)
            partitions.append(int(p) if p and p.isdigit() else -1)
    else:
        headers = [h for h in hs if h[0] not in drop and h[0] not in _REDELIVERY]
        if partitions is not None:
            partitions.append(-1)
    if None in d.values():
        headers = [(k, b"" if v is None else v) for k, v in headers]
    headers += origin
    message_id = d.get(_MESSAGE_ID)
    headers.append((_MESSAGE_ID, message_id if message_id is not None
                    else format_message_id(rng.source, rng.partition, off).encode()))
    if rng.subscription is not None:
        headers.append((_COUNT, b"%d" % rng.counts.get(off, 1)))
        headers.append((_SUBSCRIPTION, rng.subscription.encode()))
    return rng.target, msg.value(), key, headers, None


@dataclass(slots=True)
class _Cursor:
    """Where the copy of one (source, partition) stands in :func:`_copy_records`: its
    groups of ranges (see :func:`spans`), read one after another in offset order."""

    groups: list[list[Range]] = field(default_factory=list)
    lasts: list[int] = field(default_factory=list)  # the highest offset of each group
    g: int = 0  # current group
    i: int = 0  # first range of the group that the next record can still fall in

    def add(self, group: list[Range]) -> None:
        self.groups.append(group)
        # Ranges of topics sharing a partition overlap: a group's end is not its last
        # range's.
        self.lasts.append(max(r.last for r in group))


def _reader(bootstrap: str) -> kafka.Consumer:
    return kafka.Consumer(bootstrap, f"dwell-drain-{uuid.uuid4().hex}", **READER_CONFIG)


def _writer(bootstrap: str, compression_type: str) -> kafka.BulkProducer:
    return kafka.BulkProducer(bootstrap, linger_ms=5, compression_type=compression_type,
                              **{"batch.size": 1 << 20})


# Asked between chunks of a copy: the claims (Range.claim) whose records are not to be
# written any more. It may raise to end the copy (the round's deadline).
LostClaims = Callable[[], Set[int]]


def copy_ranges(bootstrap: str, ranges: Sequence[Range], compression_type: str = "none",
                lost: LostClaims | None = None) -> CopyStats:
    """Copy every record in ``ranges``; returns once every copy is acknowledged (acks=all)
    or raises KafkaUnavailable. One consumer and one producer per call (per task).
    ``lost``: see LostClaims."""
    if not ranges:
        return CopyStats()
    consumer, producer = _reader(bootstrap), _writer(bootstrap, compression_type)
    try:
        return _copy(consumer, producer, ranges, lost)
    finally:
        consumer.close()
        producer.close(1.0)


class Copier:
    """:func:`copy_ranges` with one consumer and producer kept from round to round (the
    driver's copies): a fresh pair costs a round its connections and the idempotent
    producer's id, which small rounds feel as lateness. After a failed round both are
    dropped and the next round starts afresh."""

    def __init__(self, bootstrap: str, compression_type: str = "none") -> None:
        self.bootstrap = bootstrap
        self.compression_type = compression_type
        self._pair: tuple[kafka.Consumer, kafka.BulkProducer] | None = None

    def copy(self, ranges: Sequence[Range], lost: LostClaims | None = None) -> CopyStats:
        if not ranges:
            return CopyStats()
        if self._pair is None:
            self._pair = (_reader(self.bootstrap),
                          _writer(self.bootstrap, self.compression_type))
        consumer, producer = self._pair
        try:
            return _copy(consumer, producer, ranges, lost)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        pair, self._pair = self._pair, None
        if pair is not None:
            pair[0].close()
            pair[1].close(1.0)


def _copy(consumer: kafka.Consumer, producer: kafka.BulkProducer,
          ranges: Sequence[Range], lost: LostClaims | None) -> CopyStats:
    # A round allocates a few tuples and lists per record that all live until it ends:
    # the cyclic collector would walk them again and again, for nothing: refcounting
    # frees them after the round.
    with memory.cycles_paused():
        return _copy_records(consumer, producer, ranges, lost)


def _stop_claims(cursors: Iterable[_Cursor], claims: Set[int]) -> None:
    """Empty the ranges of ``claims`` in place: same bounds, so the cursors stay where they
    are, but no offset wanted any more."""
    for c in cursors:
        for group in c.groups:
            for k, rng in enumerate(group):
                if rng.claim in claims:
                    group[k] = dataclasses.replace(rng, offsets=BitMap64())


def _copy_records(consumer: kafka.Consumer, producer: kafka.BulkProducer,
                  ranges: Sequence[Range], lost: LostClaims | None) -> CopyStats:
    stats = CopyStats()
    stopped: Set[int] = frozenset()
    out: list[kafka.OutRecord] = []
    partitions: list[int] = []  # of each record in `out` (output_record)
    deliver_at: list[bytes] = []
    cursors: dict[tuple[str, int], _Cursor] = {}
    for group in spans(ranges):
        cursors.setdefault((group[0].source, group[0].partition), _Cursor()).add(group)
    # Each group is one span of the read: read in one pass, sought from one to the next.
    # The deadline is on progress, not on the round: a round of any size goes on while
    # records keep coming, and fails (into its lease retry) once none came for
    # READ_TIMEOUT_S.
    for msg in kafka.read_spans(
            consumer, {tp: [(g[0].first, last) for g, last in zip(c.groups, c.lasts,
                                                                  strict=True)]
                       for tp, c in cursors.items()}, READ_TIMEOUT_S):
        c = cursors[(msg.topic(), msg.partition())]
        off = msg.offset()
        if off > c.lasts[c.g]:
            while off > c.lasts[c.g]:
                c.g += 1
            c.i = 0
        group = c.groups[c.g]
        while c.i < len(group) and off > group[c.i].last:
            c.i += 1
        # Ranges may overlap (one message redelivered to two subscriptions).
        j = c.i
        while j < len(group) and group[j].first <= off:
            rng = group[j]
            if off <= rng.last and (rng.offsets is None or off in rng.offsets):
                if rng.cancelled is not None and _header(msg, _ORIGIN) in rng.cancelled:
                    stats.cancelled += 1
                    j += 1
                    continue
                if rng.topic is not None and not same_topic(_header(msg, hdr.TOPIC),
                                                            rng.topic):
                    stats.foreign.append((rng.claim, format_message_id(
                        rng.source, rng.partition, off)))
                    j += 1
                    continue
                out.append(output_record(rng, msg, deliver_at, partitions))
                if rng.subscription is None:
                    pass
                elif is_dead_letter(rng):
                    stats.dead_letters += 1
                else:
                    stats.redeliveries[rng.counts.get(off, 1)] += 1
            j += 1
        # Hand records to the producer as they are read: sending overlaps reading, and
        # the first copies are out while the rest of a large round is still being read.
        # Nothing of a chunk is kept once it is handed over, so a round of any size
        # holds at most a chunk and the producer's bounded queue.
        if len(out) >= SEND_CHUNK:
            producer.send_unreported(out, partitions)
            stats.written += len(out)
            stats.observe_lateness(int(time.time() * 1000), deliver_at)
            out, partitions, deliver_at = [], [], []
            if lost is not None:
                gone = lost()
                if not gone <= stopped:
                    _stop_claims(cursors.values(), gone - stopped)
                    stopped = stopped | gone
    producer.send_unreported(out, partitions)
    stats.written += len(out)
    producer.flush(READ_TIMEOUT_S)  # raises unless every copy was written
    stats.observe_lateness(int(time.time() * 1000), deliver_at)
    return stats
