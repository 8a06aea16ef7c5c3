"""Reading known offsets without a consumer group: whole topics up to their end
(`iter_from`, `iter_messages_from`, `read_from`, `read_all`) and chosen offset spans (`read_spans`,
`read_offsets`), the one reader behind the drain's record copy and the tracker's restage."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer as _Consumer
from confluent_kafka import Message, TopicPartition

from .admin import partitions
from .config import connection
from .consumer import Consumer, close_within, watermarks
from .errors import KafkaUnavailable
from .record import Record, record_of

# A consumer that reads known offset ranges as fast as the broker serves them (the drain's
# copies, the tracker's restage): large fetches, no waiting for more records, and the next
# fetch not postponed when the local queue is full (librdkafka's fetch.queue.backoff.ms
# defaults to 1 s, which a scan of a few hundred MB would wait out again and again).
SCAN_CONFIG: Mapping[str, Any] = {
    "fetch.wait.max.ms": 10, "fetch.error.backoff.ms": 10, "fetch.queue.backoff.ms": 1,
    "max.partition.fetch.bytes": 16 << 20, "fetch.max.bytes": 64 << 20,
    "queued.max.messages.kbytes": 32 << 10, "queued.min.messages": 20000,
    "enable.partition.eof": False}

# Records taken from librdkafka's queue per call: each is a Python object until the
# caller is done with it, and a burst of many small objects freed together leaves the
# interpreter's arenas fragmented.
READ_CHUNK = 10_000

Span = tuple[int, int]  # first, last offset (inclusive)


def iter_from(bootstrap: str, topic: str, starts: Mapping[int, int],
              timeout: float = 30.0) -> Iterator[Record]:
    """:func:`iter_messages_from`, each message as a Record."""
    return (record_of(msg) for msg in iter_messages_from(bootstrap, topic, starts, timeout))


def iter_messages_from(bootstrap: str, topic: str, starts: Mapping[int, int],
                       timeout: float = 30.0) -> Iterator[Message]:
    """Every committed record of a topic from `starts` (offset per partition; partitions
    not named start at the beginning) to the end offsets at the time of the call, read
    with read_committed and without a group, as they come: no more than one read's
    records are held at a time. KafkaUnavailable once the read has not moved on for
    ``timeout`` s; a read of any size goes on while records keep coming, and the time
    the caller spends between records does not count."""
    # The tracker's trim may delete the records below the read's position meanwhile: the
    # read then goes on from the partition's new start, not from its end.
    c = _Consumer({**connection(bootstrap), "group.id": "dwell-reader",
                   "enable.auto.commit": False, "isolation.level": "read_committed",
                   "fetch.wait.max.ms": 50, "auto.offset.reset": "earliest"})
    try:
        marks = {p: watermarks(c, topic, p, timeout)
                 for p in partitions(bootstrap, topic, timeout)}
        ends = {p: hi for p, (_, hi) in marks.items()}
        # A compacted or expired log may start above 0: begin at its first offset.
        begin = {p: max(starts.get(p, lo), lo) for p, (lo, _) in marks.items()}
        pending = {p for p, end in ends.items() if end > begin[p]}
        if not pending:
            return
        c.assign([TopicPartition(topic, p, begin[p]) for p in pending])
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"reading {topic}: nothing read for {timeout:.0f} s")
            got = [msg for msg in c.consume(1000, 0.2)
                   if msg.error() is None and msg.offset() < ends[msg.partition()]]
            left = len(pending)
            # Transaction markers leave gaps: compare the position with the end.
            for tp in c.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
            if got:
                yield from got
            if got or len(pending) < left:
                deadline = time.monotonic() + timeout
    finally:
        close_within(c)


def read_from(bootstrap: str, topic: str, starts: Mapping[int, int],
              timeout: float = 30.0) -> list[Record]:
    """`iter_from` as a list (tests check exactly-once outputs this way)."""
    return list(iter_from(bootstrap, topic, starts, timeout))


def read_all(bootstrap: str, topic: str, timeout: float = 30.0) -> list[Record]:
    """Every record of a topic from the beginning to its current end, without a group
    (admission replays the compacted policy feed this way)."""
    return read_from(bootstrap, topic, {}, timeout)


def coalesce(offsets: Sequence[int], max_gap: int) -> list[Span]:
    """Sorted offsets as spans whose neighbours are at most ``max_gap`` apart."""
    spans: list[Span] = []
    for o in offsets:
        if spans and o - spans[-1][1] <= max_gap:
            spans[-1] = (spans[-1][0], int(o))
        else:
            spans.append((int(o), int(o)))
    return spans


def read_spans(consumer: Consumer, spans: Mapping[tuple[str, int], Sequence[Span]],
               timeout: float) -> Iterator[Message]:
    """Every record within ``spans`` (per (topic, partition), sorted and disjoint), as
    confluent-kafka messages in offset order per partition, all partitions read side by
    side so that their fetches overlap. A span is read in one pass; the consumer is
    sought from one span to the next (a seek costs a fetch round trip, which is why
    callers make a span of offsets a few unwanted records apart). An offset with no
    record (a transaction marker, an aborted or expired record, one at or past the
    partition's end) is passed over.
    KafkaUnavailable once no span moved on for ``timeout`` s: a read of any size goes
    on while records keep coming. The consumer is unassigned when the read ends."""
    todo = {tp: list(s)[::-1] for tp, s in spans.items() if s}  # spans left, popped
    if not todo:
        return
    consumer.learn({t for t, _ in todo})
    # Nothing lies at or past a partition's end: a span there (a messageId forged or left
    # by a truncated log) is passed over at once, where waiting for it would fail the read
    # for good. The end is the broker's ListOffsets answer, which a new leader gives only
    # once it holds every record acknowledged before (KIP-207).
    for (t, p), left in list(todo.items()):
        end = consumer.end_offsets(t, [p], timeout)[p]
        kept = [(first, min(last, end - 1)) for first, last in left if first < end]
        if kept:
            todo[(t, p)] = kept
        else:
            del todo[(t, p)]
    if not todo:
        return
    expect = {tp: s[-1][0] for tp, s in todo.items()}  # next offset wanted
    consumer.assign([(t, p, o) for (t, p), o in expect.items()])

    def advance(tp: tuple[str, int]) -> None:
        todo[tp].pop()
        if todo[tp]:
            expect[tp] = todo[tp][-1][0]
            consumer.seek({tp: expect[tp]})
        else:
            del todo[tp]

    deadline = time.monotonic() + timeout
    try:
        while todo:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"nothing read for {timeout:g}s: " + ", ".join(
                    f"{t}[{p}] {expect[(t, p)]}..{s[-1][1]}" for (t, p), s in todo.items()))
            # Ask for what the current spans still hold: consume() returns as soon as
            # it has that many, where a larger ask waits out its timeout.
            left = sum(s[-1][1] - expect[tp] + 1 for tp, s in todo.items())
            msgs = consumer.poll_messages(max(1, min(left, READ_CHUNK)), 0.2)
            moved = False
            for msg in msgs:
                tp = (msg.topic(), msg.partition())
                s = todo.get(tp)
                off = msg.offset()
                if s is None or off < expect[tp]:
                    continue  # fetched before a seek, or past a finished partition
                expect[tp] = off + 1
                moved = True
                last = s[-1][1]
                if off <= last:
                    yield msg
                if off >= last:
                    advance(tp)
            if not msgs:
                # Markers or aborted records at a span's end leave no message to see.
                for tp, pos in consumer.positions(todo).items():
                    if pos > todo[tp][-1][1]:
                        advance(tp)
                        moved = True
            if moved:
                deadline = time.monotonic() + timeout
    finally:
        consumer.unassign()


def read_offsets(consumer: Consumer, topic: str, wanted: Mapping[int, Sequence[int]],
                 max_gap: int, timeout: float = 60.0) -> Iterator[Message]:
    """The records at ``wanted`` offsets (sorted, per partition) of ``topic``, through
    `read_spans`: offsets at most ``max_gap`` apart are read in one pass (reading past a
    few unwanted records costs less than a seek), farther ones are sought. An offset
    with no record is passed over; KafkaUnavailable once nothing was read for
    ``timeout`` s."""
    spans = {(topic, p): coalesce(offs, max_gap) for p, offs in wanted.items()}
    members = {p: frozenset(int(o) for o in offs) for p, offs in wanted.items()}
    for msg in read_spans(consumer, spans, timeout):
        if msg.offset() in members[msg.partition()]:
            yield msg
