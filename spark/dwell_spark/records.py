"""Copying indexed records from their source topic to the ready / retry / DLQ topic in
Python (on the driver for small rounds, inside Spark tasks for large scattered ones), with
dwell's headers (docs/internals.md). The lean loop works on confluent-kafka's messages
directly: building a `Record` with a header dict and a Future per record cost ~60 µs of a
~70 µs record in the profile (pyinstrument / cProfile of a 100k-record round)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.positions import format_message_id

# Headers that only make sense on dwell.delayed; the emitted copy carries the key itself.
_DELAY_LOG_ONLY = frozenset(("dwell-key", "dwell-tick-time"))
# Headers a copy sets itself, replacing any the source record carries.
_ORIGIN = "dwell-origin"
_MESSAGE_ID = "dwell-message-id"
_COUNT = "dwell-redelivery-count"
_SUBSCRIPTION = "dwell-subscription"
_DELIVER_AT = "dwell-deliver-at"
READ_TIMEOUT_S = 30.0
MAX_GAP = 2000
# Large fetches: a range is read in a few round trips instead of 1 MiB at a time.
READER_CONFIG = {"fetch.wait.max.ms": 10, "fetch.error.backoff.ms": 10,
                 "fetch.queue.backoff.ms": 1, "max.partition.fetch.bytes": 16 << 20,
                 "fetch.max.bytes": 64 << 20, "queued.max.messages.kbytes": 64 << 10,
                 "enable.partition.eof": False}
# Lateness histogram bounds (ms) shared by every copy path and the Prometheus metric.
LATENESS_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 750, 1000, 1250, 1500, 2000, 3000,
                      5000, 10000, 30000, 60000)


@dataclass(frozen=True, slots=True)
class Range:
    """Offsets ``first..last`` (inclusive) of ``source`` to copy to ``target``.

    ``counts`` (offset → redelivery count) and ``subscription`` are set for redeliveries.
    """

    target: str
    source: str
    partition: int
    first: int
    last: int
    subscription: str | None = None
    counts: dict[int, int] = field(default_factory=dict)


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

    def add(self, other: CopyStats) -> CopyStats:
        self.written += other.written
        self.lateness_counts = [a + b for a, b in
                                zip(self.lateness_counts, other.lateness_counts, strict=True)]
        self.lateness_sum_ms += other.lateness_sum_ms
        self.redeliveries.update(other.redeliveries)
        self.dead_letters += other.dead_letters
        return self

    def observe_lateness(self, emitted_ms: int, deliver_at: Sequence[int]) -> None:
        if not deliver_at:
            return
        late = emitted_ms - np.asarray(deliver_at, dtype=np.int64)
        idx = np.searchsorted(np.asarray(LATENESS_BOUNDS_MS), late, side="left")
        counts = np.bincount(idx, minlength=len(LATENESS_BOUNDS_MS) + 1)
        self.lateness_counts = [a + int(b) for a, b in
                                zip(self.lateness_counts, counts, strict=True)]
        self.lateness_sum_ms += float(late.sum())


def is_dead_letter(rng: Range) -> bool:
    """A range the backoff job sends to a subscription's DLQ (dwell.core.topics.dlq_topic
    names end in -DLQ; retry topics in -RETRY)."""
    return rng.subscription is not None and rng.target.endswith("-DLQ")


def spans(ranges: Iterable[Range], max_gap: int = MAX_GAP) -> list[list[Range]]:
    """Group ranges of one (source, partition) that lie within ``max_gap`` offsets of each
    other: each group is read in one pass, because re-positioning a consumer costs a
    fetch round trip (measured: one seek per range made 20k scattered offsets take
    minutes), while reading past a few unwanted records costs next to nothing."""
    out: list[list[Range]] = []
    for rng in sorted(ranges, key=lambda r: (r.source, r.partition, r.first)):
        cur = out[-1] if out else None
        if (cur and (cur[-1].source, cur[-1].partition) == (rng.source, rng.partition)
                and rng.first - cur[-1].last <= max_gap):
            cur.append(rng)
        else:
            out.append([rng])
    return out


def output_record(rng: Range, msg, deliver_at: list[int]) -> kafka.OutRecord:  # noqa: ANN001
    """(topic, value, key, headers, None) of the copy of confluent-kafka message ``msg``;
    appends its dwell-deliver-at (if any) to ``deliver_at`` for the lateness metric."""
    src, part, off = msg.topic(), msg.partition(), msg.offset()
    delayed = src == names.DELAYED
    key = None if delayed else msg.key()
    headers: list[tuple[str, bytes]] = []
    message_id = None
    redelivery = rng.subscription is not None
    for k, v in msg.headers() or ():
        if k in _DELAY_LOG_ONLY:
            if k == "dwell-key" and delayed:
                key = v
        elif k == _MESSAGE_ID:
            message_id = v
        elif (k == _ORIGIN and delayed) or (redelivery and k in (_COUNT, _SUBSCRIPTION)):
            pass
        else:
            if k == _DELIVER_AT and v and not redelivery:  # redeliveries are not late
                deliver_at.append(int(v))
            headers.append((k, v if v is not None else b""))
    if delayed:
        headers.append((_ORIGIN, f"{part}:{off}".encode()))
    headers.append((_MESSAGE_ID, message_id if message_id is not None
                    else format_message_id(src, part, off).encode()))
    if redelivery:
        headers.append((_COUNT, str(rng.counts.get(off, 1)).encode()))
        headers.append((_SUBSCRIPTION, rng.subscription.encode()))
    return rng.target, msg.value(), key, headers, None


@dataclass(slots=True)
class _Cursor:
    """Reading position of one (source, partition) in :func:`copy_ranges`."""

    tp: tuple[str, int]
    groups: list[list[Range]] = field(default_factory=list)
    g: int = 0  # current group
    i: int = 0  # first range of the group that the next record can still fall in
    expect: int = 0  # next offset wanted
    last: int = 0  # last offset of the current group
    done: bool = False

    def start(self) -> int:
        group = self.groups[self.g]
        self.i, self.expect, self.last = 0, group[0].first, max(r.last for r in group)
        return self.expect

    def next_group(self) -> bool:
        """Move to the next group; False (and done) when there is none."""
        self.g += 1
        if self.g >= len(self.groups):
            self.done = True
            return False
        self.start()
        return True


def copy_ranges(bootstrap: str, ranges: Sequence[Range]) -> CopyStats:
    """Copy every record in ``ranges``; returns once every copy is acknowledged (acks=all)
    or raises KafkaUnavailable. One consumer and one producer per call (per task)."""
    stats = CopyStats()
    if not ranges:
        return stats
    consumer = kafka.Consumer(bootstrap, f"dwell-drain-{uuid.uuid4().hex}", **READER_CONFIG)
    producer = kafka.Producer(bootstrap, linger_ms=5, **{"batch.size": 1 << 20})
    out: list[kafka.OutRecord] = []
    futures = []
    deliver_at: list[int] = []
    # One cursor per (source, partition), all assigned at once so their fetches overlap
    # (read one after another, each partition's first fetch cost ~0.2 s); a partition
    # with several spans seeks to the next one when it finishes one.
    cursors = {}
    for group in spans(ranges):
        tp = (group[0].source, group[0].partition)
        cursors.setdefault(tp, _Cursor(tp)).groups.append(group)
    try:
        consumer.assign([(t, p, c.start()) for (t, p), c in cursors.items()])
        active = len(cursors)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while active:
            if time.monotonic() > deadline:
                raise kafka.KafkaUnavailable(
                    "not read within {}s: {}".format(READ_TIMEOUT_S, ", ".join(
                        f"{t}[{p}] {c.expect}..{c.last}" for (t, p), c in cursors.items()
                        if not c.done)))
            # Ask for exactly what is left: consume() returns as soon as it has that many,
            # where a larger ask waits out its timeout.
            left = sum(c.last - c.expect + 1 for c in cursors.values() if not c.done)
            for msg in consumer.poll_messages(max(1, min(left, 100000)), 0.2):
                c = cursors.get((msg.topic(), msg.partition()))
                off = msg.offset()
                if c is None or c.done or off < c.expect:
                    continue  # prefetched past a finished span, or before a seek
                c.expect = off + 1
                group = c.groups[c.g]
                while c.i < len(group) and off > group[c.i].last:
                    c.i += 1
                # Ranges may overlap (one message redelivered to two subscriptions).
                j = c.i
                while j < len(group) and group[j].first <= off:
                    if off <= group[j].last:
                        rng = group[j]
                        out.append(output_record(rng, msg, deliver_at))
                        if rng.subscription is None:
                            pass
                        elif is_dead_letter(rng):
                            stats.dead_letters += 1
                        else:
                            stats.redeliveries[rng.counts.get(off, 1)] += 1
                    j += 1
                if off >= c.last:
                    if c.next_group():
                        kafka.seek(consumer, {c.tp: c.expect})
                    else:
                        active -= 1
            # Hand records to the producer as they are read: sending overlaps reading.
            if len(out) >= 20000:
                futures.append(producer.send_many(out))
                stats.written += len(out)
                out = []
        futures.append(producer.send_many(out))
        stats.written += len(out)
        producer.flush(READ_TIMEOUT_S)
        # flush() returns when the queue is empty; errors surface through the futures
        # (each fails on the first error among the records it was given).
        for fut in futures:
            fut.result(READ_TIMEOUT_S)
        stats.observe_lateness(int(time.time() * 1000), deliver_at)
        return stats
    finally:
        consumer.close()
        producer.close(1.0)
