"""What the tracker's ingest does with a batch of `dwell.delayed` records: each record's
position indexed under its topic's bucket (dwell.index), Pulsar's fixed-delay detection,
the positions already delivered left out during a rebuild, replacements by schedule key,
and the folding of deltas into Roaring blobs. dwell.tracker.ingest_loop runs it on the
consumer group's batches.

Replacement by schedule key: the records of a batch with a `dwell-schedule-key` header
are applied in log order before its positions are indexed (TopicIndex.replace): each
cancels the key's pending message by the rules of a cancel request, and a cancel mark of
it goes to `dwell.delivered` (`record_marks`, acknowledged by Kafka) before the batch
counts as ingested, so a rebuild of the index finds the cancellation. A record with the
key and no deliver-at is a release (an immediate publish with the key): it cancels and
indexes nothing of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import redis as redislib
from pyroaring import BitMap64

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.adapters.kafka import Columns, OutRecord
from dwell.core.buckets import bucket_start
from dwell.core.topics import DELAYED as DELAYED_TOPIC
from dwell.core.topics import InvalidTopicName, TopicName
from dwell.headers import DELIVER_AT, MAX_SCHEDULE_KEY_BYTES, SCHEDULE_KEY, TICK_TIME
from dwell.index import bucket_index
from dwell.index import topic as index
from dwell.index.marks import cancel_mark_record
from dwell.index.topic import TopicIndex, append_positions
from dwell.tracker import LUA_DIR
from dwell.tracker.metrics import (
    COMPACTED,
    FLUSH_SECONDS,
    INGESTED,
    INVALID,
    REBUILT,
    REBUILT_DUE,
    REPLACED,
)

log = logging.getLogger("dwell.tracker.ingest")

# What the index needs of each record: the two it is filed by, and a schedule key.
HEADERS: Final = (DELIVER_AT, TICK_TIME, SCHEDULE_KEY)
# How often a replacement whose message's bucket is being re-filed is asked again.
_REPLACE_RETRY_S: Final = 0.05
# Records with a schedule key applied by one script at most (Redis runs nothing else
# meanwhile).
_REPLACE_ROWS: Final = 1000
# The ingest's own script (its progress per delay-log partition); the index's are in
# dwell/index/lua.

# Fixed-delay detection state (as Pulsar's InMemoryDelayedDeliveryTracker keeps it), kept in
# the topic's stats HASH.
HIGHEST_FIELD: Final = "highestDeliverAt"
FIXED_FIELD: Final = "fixedDelay"
SEEN_PREFIX: Final = "fdOffset:"  # + partition: last offset the detection has seen
# The Kafka topic the positions point into (dwell.delayed; tests use their own): only a
# restage reading that topic may move them.
SOURCE_FIELD: Final = "delayedTopic"



def _topic(key: bytes | None) -> str | None:
    """The Pulsar topic a delay-log record's key names, None when it names none: anyone
    who may write the delay log chooses the key, and it becomes part of Redis keys."""
    if not key:
        return None
    try:
        name = key.decode()
        TopicName.parse(name)
    except (UnicodeDecodeError, InvalidTopicName):
        return None
    return name


@dataclass
class _FixedDelay:
    highest: int | None = None
    fixed: bool = True
    seen: dict[int, int] = field(default_factory=dict)


def _parse_ints(raw: list[bytes | None], n: int) -> np.ndarray | None:
    """Decimal header values as int64 in one C-level pass; None when any is missing,
    malformed or out of range (then `_parse_ints_slow` finds which)."""
    try:
        return np.fromiter(map(int, raw), dtype=np.int64, count=n)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None


def _parse_ints_slow(raw: list[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """(values, usable mask) record by record; unusable values become 0."""
    vals = np.zeros(len(raw), dtype=np.int64)
    ok = np.zeros(len(raw), dtype=bool)
    for i, v in enumerate(raw):
        try:
            x = int(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if -(2**63) <= x < 2**63:
            vals[i] = x
            ok[i] = True
    return vals, ok


@dataclass(frozen=True, slots=True)
class Decoded:
    """A polled batch as arrays (`decode`): what the index needs of each record, with no
    Python object per record, so that batches waiting for the writer hold no more than
    their arrays. Row i of every array is the batch's i-th record."""

    partitions: np.ndarray  # int64, Kafka partitions of the delay log
    offsets: np.ndarray  # int64
    deliver_at: np.ndarray  # int64 (0 where not usable)
    tick: np.ndarray  # int64 (0 where not usable)
    ok: np.ndarray  # bool: deliver-at and tick-time usable (tick >= 1)
    keys: list[bytes | None]  # the distinct record keys (Pulsar topics)
    codes: np.ndarray  # intp: each record's key, as an index into `keys`
    # The records with a schedule key, few or none: their rows, keys, and whether each is
    # a release (no dwell-deliver-at at all).
    keyed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    schedule_keys: list[bytes] = field(default_factory=list)
    releases: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __len__(self) -> int:
        return len(self.offsets)

    @staticmethod
    def concat(parts: list[Decoded]) -> Decoded:
        """The batches of `parts` as one, in order."""
        if len(parts) == 1:
            return parts[0]
        keys: dict[bytes | None, int] = {}
        codes = []
        keyed, base = [], 0
        for d in parts:
            remap = np.array([keys.setdefault(k, len(keys)) for k in d.keys], dtype=np.intp)
            codes.append(remap[d.codes] if len(d) else d.codes)
            keyed.append(d.keyed + base)
            base += len(d)
        return Decoded(*(np.concatenate([getattr(d, f) for d in parts])
                         for f in ("partitions", "offsets", "deliver_at", "tick", "ok")),
                       list(keys), np.concatenate(codes), np.concatenate(keyed),
                       [k for d in parts for k in d.schedule_keys],
                       np.concatenate([d.releases for d in parts]))


def last_offsets(parts: np.ndarray, offs: np.ndarray) -> dict[int, int]:
    """The offset of the last record of each partition (rows in arrival order)."""
    uniq, first_from_end = np.unique(parts[::-1], return_index=True)
    return dict(zip(uniq.tolist(), offs[::-1][first_from_end].tolist(), strict=True))


def decode(batch: Columns) -> Decoded:
    """`batch` (headers HEADERS) as arrays, in C-level passes over it (and a Python one
    over the records with a schedule key, if any)."""
    n = len(batch)
    da, tick, ok = _parse_ints(batch.headers[0], n), _parse_ints(batch.headers[1], n), None
    if da is None or tick is None:
        da, da_ok = _parse_ints_slow(batch.headers[0])
        tick, tick_ok = _parse_ints_slow(batch.headers[1])
        ok = da_ok & tick_ok
    ok = (tick >= 1) if ok is None else ok & (tick >= 1)
    code = {k: i for i, k in enumerate(dict.fromkeys(batch.keys))}
    codes = (np.zeros(n, dtype=np.intp) if len(code) <= 1 else
             np.fromiter(map(code.__getitem__, batch.keys), dtype=np.intp, count=n))
    out = Decoded(np.array(batch.partitions, dtype=np.int64),
                  np.array(batch.offsets, dtype=np.int64), da, tick, ok, list(code), codes)
    col = batch.headers[2] if len(batch.headers) > 2 else None
    if col is None or col.count(None) == n:
        return out
    # A key admission would have refused (anyone who may write the delay log chooses
    # it, and it becomes a Redis hash field) is not one: the record is indexed without.
    rows = [i for i, k in enumerate(col) if k and len(k) <= MAX_SCHEDULE_KEY_BYTES]
    if not rows:
        return out
    deliver_at = batch.headers[0]
    return Decoded(out.partitions, out.offsets, da, tick, ok, out.keys, codes,
                   np.array(rows, dtype=np.intp), [col[i] or b"" for i in rows],
                   np.array([deliver_at[i] is None for i in rows], dtype=bool))


class Ingest:
    """Batches of records -> Redis. `index_batch` is usable without Kafka (bench, tests).
    ``source``: the delay log the positions belong to (its name goes in the topic's
    stats); ``field_base``: added to partitions to make index fields (the re-file log's
    records: dwell.core.positions.index_field)."""

    def __init__(self, r: redislib.Redis, source: str = DELAYED_TOPIC,
                 field_base: int = 0, *, clock_margin_ms: int = 2000,
                 record_marks: Callable[[list[OutRecord]], None] | None = None) -> None:
        self.redis = r
        # Replacements by schedule key (on the delay log's own records only): a message
        # due within the margin is not cancelled, and the cancel marks are written by
        # `record_marks` (KafkaUnavailable when Kafka did not take them).
        self.clock_margin_ms = clock_margin_ms
        self.record_marks = record_marks
        # Called while a replacement waits for a re-filing round (bounded by the round's
        # lease): the writer's heartbeat, so that the wait is not taken for a stall.
        self.waiting: Callable[[], None] | None = None
        self._scripts = redis_adapter.Scripts(r, LUA_DIR)
        self._index_scripts = bucket_index.scripts(r)
        self.source = source
        self.field_base = field_base
        self._fixed: dict[str, _FixedDelay] = {}
        self.dirty_topics: set[str] = set()
        # While a rebuild re-reads a partition (dwell.tracker.recovery): per index field,
        # the delivered offsets to skip and the offset the re-read ends at.
        self.skip: dict[int, BitMap64] = {}
        self.skip_below: dict[int, int] = {}
        # index field -> the dwell:trk:ingested value this writer last set (ingested-1.lua)
        self.expect: dict[int, int] = {}

    def _fixed_state(self, topic: str) -> _FixedDelay:
        st = self._fixed.get(topic)
        if st is None:
            raw = self.redis.hgetall(keys.stats(topic))
            st = _FixedDelay()
            if HIGHEST_FIELD.encode() in raw:
                st.highest = int(raw[HIGHEST_FIELD.encode()])
                st.fixed = raw.get(FIXED_FIELD.encode(), b"1") == b"1"
            for k, v in raw.items():
                if k.startswith(SEEN_PREFIX.encode()):
                    st.seen[int(k[len(SEEN_PREFIX):])] = int(v)
            self._fixed[topic] = st
        return st

    def _detect(self, pipe: object, topic: str, parts: np.ndarray, offs: np.ndarray,
                da: np.ndarray, tick: np.ndarray) -> None:
        """Fixed-delay detection as Pulsar's `InMemoryDelayedDeliveryTracker` does it
        (`checkAndUpdateHighest`): the topic has a fixed delay while every new deliverAt is
        >= the highest seen minus one tick. Records already seen (a replay) are skipped."""
        st = self._fixed_state(topic)
        fresh = np.ones(len(offs), dtype=bool)
        for p, last in st.seen.items():
            fresh &= ~((parts == p) & (offs <= last))
        if not fresh.any():
            return
        da, tick = da[fresh], tick[fresh]
        start = st.highest if st.highest is not None else int(da[0])
        prev = np.maximum.accumulate(np.concatenate(([start], da)))[:-1]
        if st.fixed and bool((da < prev - tick).any()):
            st.fixed = False
        st.highest = max(start, int(da.max()))
        mapping: dict[str, int | str] = {HIGHEST_FIELD: st.highest, FIXED_FIELD: int(st.fixed),
                                         SOURCE_FIELD: self.source}
        for p in np.unique(parts).tolist():
            last = int(offs[parts == p].max())
            if last > st.seen.get(p, -1):
                st.seen[p] = last
                mapping[f"{SEEN_PREFIX}{p}"] = last
        pipe.hset(keys.stats(topic), mapping=mapping)  # type: ignore[attr-defined]

    def index_batch(self, batch: Columns | Decoded) -> int:
        """Index a polled batch (`headers` = [deliverAt, tickTime]) in one pipeline.
        Returns positions indexed; bad records are counted and skipped. Column-wise:
        per-record Python work here is what separates ingest from a raw consume."""
        d = batch if isinstance(batch, Decoded) else decode(batch)
        n = len(d)
        if n == 0:
            return 0
        parts = d.partitions + self.field_base
        offs, da, tick, ok = d.offsets, d.deliver_at, d.tick, d.ok
        # The next offset per index field this batch brings the ingest to, written after
        # the positions (dwell:trk:ingested): even a batch of bad records moves it.
        reached = {f: o + 1 for f, o in last_offsets(parts, offs).items()}
        keep = self._not_delivered(parts, offs) if self.skip_below else None
        # Group by key (the Pulsar topic), keeping arrival order inside a topic.
        if len(d.keys) == 1:
            groups = [(d.keys[0], np.arange(n))]
        else:
            order = np.argsort(d.codes, kind="stable")
            cuts = np.cumsum(np.bincount(d.codes, minlength=len(d.keys)))[:-1]
            groups = list(zip(d.keys, np.split(order, cuts), strict=True))
        rows: list[tuple[str, np.ndarray]] = []
        released = np.zeros(n, dtype=bool)
        # Only the delay log's own records replace: a re-filed copy was applied as its
        # original.
        with_keys = len(d.keyed) > 0 and self.field_base == 0
        if with_keys:
            released[d.keyed[d.releases]] = True
        # The rows applied: indexed (below), or releases.
        applied = released.copy() if with_keys else released
        bad = 0
        for key, idx in groups:
            topic = _topic(key)
            if topic is None:
                bad += len(idx)
                continue
            good = idx[ok[idx]]
            bad += len(idx) - len(good) - int(released[idx].sum())
            if keep is not None:
                good = good[keep[good]]
            if len(good):
                rows.append((topic, good))
                if with_keys:
                    applied[good] = True
        if bad:
            INVALID.inc(bad)
            log.warning("skipped %d dwell.delayed records without a topic key, deliver-at or "
                        "tick-time", bad)
        started = time.perf_counter()
        if with_keys:
            # Each topic's applied keyed rows, in log order: one pass over the keyed rows,
            # not one over the batch per topic.
            keyed: dict[str, list[int]] = {}
            for row in d.keyed[applied[d.keyed]].tolist():
                topic = _topic(d.keys[d.codes[row]])
                if topic is not None:
                    keyed.setdefault(topic, []).append(row)
            if keyed:
                self._replace(d, parts, keyed)
        pipe = self.redis.pipeline(transaction=False)
        indexed = 0
        now = int(time.time() * 1000)
        for topic, idx in rows:
            cols = (parts[idx], offs[idx], da[idx], tick[idx])
            append_positions(pipe, self._index_scripts, topic, *cols)
            self._detect(pipe, topic, *cols)
            self.dirty_topics.add(topic)
            indexed += len(idx)
            if self.skip_below:
                REBUILT.labels("indexed").inc(len(idx))
                REBUILT_DUE.inc(int((cols[2] <= now).sum()))
        args: list[int | str] = []
        for f, o in reached.items():
            args += [f, self.expect.get(f, ""), o]
        self._scripts.run("ingested", [keys.INGESTED], args, client=pipe)
        pipe.execute()
        self.expect |= reached
        for f, o in reached.items():
            if o >= self.skip_below.get(f, o + 1):
                self.end_rebuild(f)
        FLUSH_SECONDS.observe(time.perf_counter() - started)
        INGESTED.inc(indexed)
        return indexed

    def _replace(self, d: Decoded, parts: np.ndarray, keyed: dict[str, list[int]]) -> None:
        """Apply the records with a schedule key (rows of ``d``, per topic, in log order),
        each run of them in three steps: what it would cancel (a dry run), the cancel
        marks of that in Kafka, then the run applied. A crash between any two leaves a
        mark for every cancellation made (a mark of one not made is harmless: the next
        read of the batch makes it). A record whose key's message sits in a bucket being
        re-filed waits for the round."""
        key_of = dict(zip(d.keyed.tolist(), d.schedule_keys, strict=True))
        release = dict(zip(d.keyed.tolist(), d.releases.tolist(), strict=True))
        todo: dict[str, list[tuple[bytes, int | None, int, int]]] = {}
        for topic, mine in keyed.items():
            todo[topic] = [(key_of[row], None if release[row] else bucket_start(
                int(d.deliver_at[row]), int(d.tick[row])), int(parts[row]),
                int(d.offsets[row])) for row in mine]
        while todo:
            cutoff = int(time.time() * 1000) + 1 + self.clock_margin_ms
            runs: dict[str, list[tuple[bytes, int | None, int, int]]] = {}
            marks: list[OutRecord] = []
            for topic, rows in todo.items():
                run = rows[:_REPLACE_ROWS]
                found = TopicIndex(self.redis, topic).replace(run, cutoff, dry_run=True)
                if found and found[-1].code == index.BUSY:
                    # That record and the ones after it wait for the re-filing round to
                    # let go of the bucket (its lease bounds the wait).
                    run = run[:len(found) - 1]
                runs[topic] = run
                marks += [self._cancel_mark(topic, r) for r in found
                          if r.code == index.CANCELLED]
            if marks and self.record_marks is not None:
                self.record_marks(marks)
            stalled = False
            for topic, run in runs.items():
                done = TopicIndex(self.redis, topic).replace(run, cutoff) if run else []
                applied = len(done) - (1 if done and done[-1].code == index.BUSY else 0)
                replaced = sum(r.code == index.CANCELLED for r in done)
                if replaced:
                    REPLACED.labels(topic).inc(replaced)
                stalled |= applied == 0
                todo[topic] = todo[topic][applied:]
                if not todo[topic]:
                    del todo[topic]
            if todo and stalled:
                time.sleep(_REPLACE_RETRY_S)
                if self.waiting is not None:
                    self.waiting()

    def _cancel_mark(self, topic: str, r: index.Replaced) -> OutRecord:
        p, o = r.member.split(b":")
        return cancel_mark_record(self.source, topic, int(r.bucket), int(p), int(o))

    def _not_delivered(self, parts: np.ndarray, offs: np.ndarray) -> np.ndarray:
        """Mask of the records a rebuild must index: not below its end offset with a
        delivered mark."""
        keep = np.ones(len(offs), dtype=bool)
        for f, end in self.skip_below.items():
            marks = self.skip.get(f)
            if marks is None:
                continue
            rows = np.flatnonzero((parts == f) & (offs < end))
            if len(rows):
                hit = np.fromiter((int(o) in marks for o in offs[rows].tolist()), dtype=bool,
                                  count=len(rows))
                keep[rows[hit]] = False
        skipped = int((~keep).sum())
        if skipped:
            REBUILT.labels("skipped_delivered").inc(skipped)
        return keep

    def mark_ingested(self, reached: dict[int, int]) -> None:
        """Set how far the ingest got (`dwell:trk:ingested`) for index fields whose entry
        Redis lost while nothing below it is pending any more."""
        args: list[int | str] = []
        for f, o in reached.items():
            args += [f, "", o]
        self._scripts.run("ingested", [keys.INGESTED], args)
        self.expect |= reached

    def begin_rebuild(self, field: int, end: int, delivered: BitMap64) -> None:
        self.skip_below[field] = end
        self.skip[field] = delivered
        self.expect.pop(field, None)
        self._fixed.clear()

    def end_rebuild(self, field: int) -> None:
        if self.skip_below.pop(field, None) is not None:
            self.skip.pop(field, None)
            log.info("rebuild of index field %d done", field)

    def forget_fixed_state(self) -> None:
        """Drop the cached fixed-delay state: re-read from Redis on the next batch."""
        self._fixed.clear()

    def compact(self, max_buckets: int, min_delta_bytes: int = 0) -> int:
        """Fold deltas of the topics this process wrote (only buckets with at least
        `min_delta_bytes` of them); returns buckets merged."""
        done = 0
        for topic in list(self.dirty_topics):
            idx = TopicIndex(self.redis, topic)
            merged = idx.compact(max_buckets, min_delta_bytes)
            done += merged
            if not idx.dirty_buckets(1):
                self.dirty_topics.discard(topic)
        COMPACTED.inc(done)
        return done
