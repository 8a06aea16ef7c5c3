"""What the tracker's periodic work needs of each topic's index, per bucket: how many
distinct positions it holds, its keys' bytes (MEMORY USAGE) and the lowest offset of each
field. A topic is read whole once; after that, each sync reads its changes stream
(`keys.IndexKeys.changes`: the buckets append-3.lua appended to, claim-6.lua claimed and
complete-7.lua completed) and then only those buckets. A round of the stats or of the
low watermarks costs what changed since the last one, not the size of the index.

Why the figures stay exact (the low watermarks depend on it, dwell.tracker.recovery): a
position enters a bucket only through append-3.lua, which names the bucket in the changes
stream in the same call. After that it moves only among the bucket's own four keys
(a claim, which names the bucket; compaction; an expired lease) until complete-7.lua
deletes it, which names the bucket again. A sync reads the stream first and then the
buckets it names, the four keys of each bucket at once, and moves its place in the stream
only once they are read. So every position appended before the stream was read is in
what the view holds for its bucket. A topic is read whole again when the entry its view
read last is gone from the stream: the stream was trimmed past it (a reader more than
`CHANGES_KEPT` calls behind), or Redis lost it (FLUSHALL, a failover).

Compaction and an expired lease change a bucket's bytes but not its positions, and they
write no change. The bytes of a bucket read while its deltas still waited to be
compacted are measured again at the first sync that finds it compacted; a bucket whose
lease expired keeps its data in the claimed keys, as measured, until it is claimed
again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np
import redis as redislib
from pyroaring import BitMap64

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.core.positions import REFILED_FIELD_BASE
from dwell.index.roaring import DELTA_DTYPE, decode, unpack_deltas
from dwell.index.topic import CHANGES_KEPT
from dwell.tracker import LUA_DIR
from dwell.tracker.metrics import VIEW_READS

log = logging.getLogger("dwell.tracker.index_view")

# Buckets read a round trip (one buckets-1.lua call).
READ_CHUNK: Final = 1000
# Entries of a changes stream read a round trip.
CHANGES_PAGE: Final = 10_000
_EMPTY = np.zeros(0, dtype=np.int64)
_NONE = np.iinfo(np.int64).max  # no offset in Kafka is this high


@dataclass(frozen=True, slots=True)
class Figures:
    """One topic's buckets as last read, by bucket start (ascending); each array is new
    at every change, so a caller may keep one while the view moves on.

    `rows_*` list the lowest offset of each field of each bucket, ordered by bucket
    start, then field."""

    starts: np.ndarray
    counts: np.ndarray
    nbytes: np.ndarray
    rows_start: np.ndarray
    rows_field: np.ndarray
    rows_min: np.ndarray

    def minima(self) -> dict[int, int]:
        """Per field, the lowest offset any bucket holds."""
        if not len(self.rows_field):
            return {}
        # Fields are small (partitions, the re-file log's from 2**20; `_field`): one slot
        # each.
        low = np.full(int(self.rows_field.max()) + 1, _NONE, dtype=np.int64)
        np.minimum.at(low, self.rows_field, self.rows_min)
        fields = np.flatnonzero(low != _NONE)
        return dict(zip(fields.tolist(), low[fields].tolist(), strict=True))

    def due_by(self, at_ms: int) -> int:
        """Positions of the buckets starting at or before ``at_ms``."""
        return int(self.counts[:np.searchsorted(self.starts, at_ms, side="right")].sum())


NO_FIGURES: Final = Figures(_EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY)


class CorruptIndex(ValueError):
    """Redis holds index data that dwell's scripts cannot have written: no low watermark
    is computed from it (a wrong one could let the trim delete pending records)."""


def _field(bucket: int, raw: bytes | int) -> int:
    """An index field as a blob's name or a delta entry gives it: a partition of a delay
    log (the re-file log's from REFILED_FIELD_BASE)."""
    try:
        field = int(raw)
    except ValueError:
        field = -1
    if not 0 <= field < 2 * REFILED_FIELD_BASE:
        shown = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        raise CorruptIndex(f"bucket {bucket} holds field {shown!r}, not a partition of a "
                           f"delay log")
    return field


def _bitmap(bucket: int, field: bytes, blob: bytes) -> BitMap64:
    try:
        return decode(blob)
    except (ValueError, IndexError) as exc:
        raise CorruptIndex(f"the blob of field {field.decode()} in bucket {bucket} is not "
                           f"a Roaring bitmap ({len(blob)} bytes)") from exc


@dataclass(slots=True)
class _Read:
    """Buckets as one read found them; a bucket holding nothing is left out."""

    starts: list[int]
    counts: list[int]
    nbytes: list[int]
    rows: list[tuple[int, int, int]]  # (bucket start, field, lowest offset)
    unsettled: set[int]  # read while their deltas waited for compaction


def read_buckets(scripts: redis_adapter.Scripts, ks: keys.IndexKeys,
                 starts: Iterable[int]) -> _Read:
    """The figures of buckets ``starts`` (ascending), each read atomically (buckets-1.lua):
    its live blobs and deltas, its claimed blobs and deltas, their MEMORY USAGE and its
    dirty mark."""
    out = _Read([], [], [], [], set())
    todo = list(starts)
    prefixes = [ks.bucket_prefix, ks.delta_prefix, ks.claimed_prefix, ks.claimed_delta_prefix]
    for i in range(0, len(todo), READ_CHUNK):
        chunk = todo[i:i + READ_CHUNK]
        res = scripts.run("buckets", [ks.dirty], [*prefixes, *chunk])
        for b, (live, delta, claimed, claimed_delta, size, dirty) in zip(chunk, res,
                                                                         strict=True):
            fields: dict[int, BitMap64] = {}
            for raw_field, blob in zip(live[::2] + claimed[::2], live[1::2] + claimed[1::2],
                                       strict=True):
                f = _field(b, raw_field)
                bm = _bitmap(b, raw_field, blob)
                if f in fields:
                    fields[f] |= bm
                else:
                    fields[f] = bm
            for raw in (delta, claimed_delta):
                if not raw:
                    continue
                if len(raw) % DELTA_DTYPE.itemsize:
                    # Unpacked, a torn string would shift every entry after it.
                    raise CorruptIndex(f"the deltas of bucket {b} are not whole "
                                       f"{DELTA_DTYPE.itemsize}-byte entries ({len(raw)} "
                                       f"bytes)")
                for f, offs in unpack_deltas(raw).items():
                    fields.setdefault(_field(b, f), BitMap64()).update(offs)
            n = sum(len(bm) for bm in fields.values())
            if not n:
                continue
            out.starts.append(b)
            out.counts.append(n)
            out.nbytes.append(int(size))
            out.rows += [(b, f, fields[f].min()) for f in sorted(fields) if fields[f]]
            if dirty:
                out.unsettled.add(b)
    return out


def _replace(fig: Figures, changed: np.ndarray, got: _Read) -> Figures:
    """``fig`` with the buckets ``changed`` (ascending, unique) replaced by ``got``."""
    at = np.searchsorted(fig.starts, changed)
    hit = at[(at < len(fig.starts)) & (fig.starts[np.minimum(at, len(fig.starts) - 1)]
                                       == changed)] if len(fig.starts) else at[:0]
    starts, counts, nbytes = (np.delete(a, hit) for a in (fig.starts, fig.counts, fig.nbytes))
    new = np.array(got.starts, dtype=np.int64)
    pos = np.searchsorted(starts, new)
    starts = np.insert(starts, pos, new)
    counts = np.insert(counts, pos, np.array(got.counts, dtype=np.int64))
    nbytes = np.insert(nbytes, pos, np.array(got.nbytes, dtype=np.int64))
    # Rows: drop every row of a changed bucket, insert the ones read.
    lo = np.searchsorted(fig.rows_start, changed, side="left")
    hi = np.searchsorted(fig.rows_start, changed, side="right")
    edge = np.zeros(len(fig.rows_start) + 1, dtype=np.int64)
    np.add.at(edge, lo, 1)
    np.add.at(edge, hi, -1)
    keep = np.cumsum(edge[:-1]) == 0
    rows = np.array(got.rows, dtype=np.int64).reshape(-1, 3)
    r_start = fig.rows_start[keep]
    at_rows = np.searchsorted(r_start, rows[:, 0])
    return Figures(starts, counts, nbytes,
                   np.insert(r_start, at_rows, rows[:, 0]),
                   np.insert(fig.rows_field[keep], at_rows, rows[:, 1]),
                   np.insert(fig.rows_min[keep], at_rows, rows[:, 2]))


class _TopicView:
    __slots__ = ("lock", "anchor", "figures", "unsettled")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.anchor: bytes | None = None  # id of the last changes entry read
        self.figures = NO_FIGURES
        self.unsettled: set[int] = set()


class IndexView:
    """Every topic's `Figures`, kept up to date from the changes streams; thread-safe
    (the stats, the low watermarks and the HTTP stats share one)."""

    def __init__(self, r: redislib.Redis) -> None:
        self.redis = r
        self._topics: dict[str, _TopicView] = {}
        self._lock = threading.Lock()
        self._scripts = redis_adapter.Scripts(r, LUA_DIR)
        self.full_reads = 0  # topics read whole (the first time, or after a loss)
        self.buckets_read = 0

    def figures(self, topic: str) -> Figures:
        """``topic``'s figures, synced now; none for a topic nothing was indexed for (a
        request naming any topic writes nothing and keeps nothing)."""
        if not self.redis.sismember(keys.TOPICS, topic):
            return NO_FIGURES
        return self._figures(topic)

    def _figures(self, topic: str) -> Figures:
        with self._lock:
            view = self._topics.setdefault(topic, _TopicView())
        with view.lock:
            self._sync(topic, view)
            return view.figures

    def sync_all(self) -> dict[str, Figures]:
        """Every indexed topic's figures, synced now; topics no longer indexed are
        dropped."""
        names = sorted(t.decode() for t in self.redis.smembers(keys.TOPICS))
        with self._lock:
            for gone in set(self._topics) - set(names):
                del self._topics[gone]
        return {t: self._figures(t) for t in names}

    def _sync(self, topic: str, view: _TopicView) -> None:
        ks = keys.topic_index(topic)
        changed = self._changes(ks, view.anchor)
        if changed is None:
            self._read_whole(topic, ks, view)
            return
        anchor, starts = changed
        if starts:
            todo = np.array(sorted(starts), dtype=np.int64)
            got = read_buckets(self._scripts, ks, todo.tolist())
            self.buckets_read += len(todo)
            VIEW_READS.labels("changed").inc(len(todo))
            view.figures = _replace(view.figures, todo, got)
            view.unsettled = (view.unsettled - starts) | got.unsettled
        # Only once what it names is read: a sync that fails reads it again.
        view.anchor = anchor
        self._remeasure(ks, view)

    def _remeasure(self, ks: keys.IndexKeys, view: _TopicView) -> None:
        """Measure again the bytes of the unsettled buckets compacted since."""
        if not view.unsettled:
            return
        waiting = sorted(view.unsettled)
        dirty = self.redis.zmscore(ks.dirty, waiting)
        settled = [b for b, d in zip(waiting, dirty, strict=True) if d is None]
        if not settled:
            return
        view.unsettled -= set(settled)
        fig = view.figures
        at = np.searchsorted(fig.starts, settled)
        sizes = np.zeros(len(settled), dtype=np.int64)
        for i in range(0, len(settled), READ_CHUNK):
            pipe = self.redis.pipeline(transaction=False)
            for b in settled[i:i + READ_CHUNK]:
                for name in (ks.bucket(b), ks.delta(b), ks.claimed(b), ks.claimed_delta(b)):
                    pipe.memory_usage(name, samples=0)
            res = pipe.execute()
            sizes[i:i + READ_CHUNK] = [sum(x or 0 for x in res[j:j + 4])
                                       for j in range(0, len(res), 4)]
        # A bucket no longer held (completed meanwhile) is named in the changes stream.
        ok = (at < len(fig.starts)) & (fig.starts[np.minimum(at, len(fig.starts) - 1)]
                                       == np.array(settled, dtype=np.int64))
        nbytes = fig.nbytes.copy()
        nbytes[at[ok]] = sizes[ok]
        view.figures = Figures(fig.starts, fig.counts, nbytes, fig.rows_start,
                               fig.rows_field, fig.rows_min)

    def _changes(self, ks: keys.IndexKeys,
                 anchor: bytes | None) -> tuple[bytes, set[int]] | None:
        """The buckets named after ``anchor`` and the last entry's id; None when
        ``anchor`` is gone from the stream (or there is none yet), or an entry is not
        a list of bucket starts."""
        if anchor is None:
            return None
        starts: set[int] = set()
        first = True
        start = anchor
        while True:
            page = self.redis.xrange(ks.changes, min=start, count=CHANGES_PAGE)
            more = len(page) == CHANGES_PAGE
            if first:
                if not page or page[0][0] != anchor:
                    return None
                page = page[1:]
                first = False
            for entry_id, values in page:
                anchor = entry_id
                raw = values.get(b"b", b"")
                try:
                    named = [int(x) for x in raw.split(b",")] if raw else []
                    if not all(0 <= b < 1 << 63 for b in named):
                        raise ValueError(raw)
                    starts.update(named)
                except ValueError:
                    # Only dwell's scripts write here; the index itself is still whole.
                    log.warning("the changes stream of %s holds %r at %s: reading the "
                                "index whole", ks.changes, raw[:80], entry_id)
                    return None
            if not more:
                return anchor, starts
            start = b"(" + anchor

    def _read_whole(self, topic: str, ks: keys.IndexKeys, view: _TopicView) -> None:
        # The anchor goes in first: whatever changes while the buckets are read is
        # named after it, and read again at the next sync.
        anchor = self.redis.xadd(ks.changes, {"b": ""}, maxlen=CHANGES_KEPT,
                                 approximate=True)
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrange(ks.index, 0, -1)
        pipe.zrange(ks.claims, 0, -1)
        live, claimed = pipe.execute()
        starts = sorted({int(float(b)) for b in (*live, *claimed)})
        got = read_buckets(self._scripts, ks, starts)
        self.full_reads += 1
        self.buckets_read += len(starts)
        VIEW_READS.labels("whole").inc(len(starts))
        view.figures = _replace(NO_FIGURES, _EMPTY, got)
        view.unsettled = got.unsettled
        view.anchor = anchor
        if view.figures.starts.size > READ_CHUNK:
            log.info("read the index of %s whole: %d buckets", topic, len(starts))
