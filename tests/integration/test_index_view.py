"""The tracker's view of the index (dwell.tracker.index_view) on real Redis: kept up to
date from the changes streams, it always equals a whole read of the index, through
appends, claims, expired leases, compaction and completion; it reads a topic whole again
when Redis lost its place in the stream; and it refuses data dwell's scripts cannot have
written."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from dwell.adapters.redis import connect
from dwell.index.roaring import pack_deltas
from dwell.index.topic import TopicIndex
from dwell.tracker.index_view import CorruptIndex, Figures, IndexView
from dwell.tracker.recovery import pending_minimums
from dwell_dev.testkit import redis_db_url

pytestmark = pytest.mark.integration

DB = 13
TICK = 1000


@pytest.fixture()
def r(stack):  # type: ignore[no-untyped-def]
    client = connect(redis_db_url(stack, DB))
    client.flushdb()
    return client


def _same(a: Figures, b: Figures, *, nbytes: bool = True) -> None:
    assert a.starts.tolist() == b.starts.tolist()
    assert a.counts.tolist() == b.counts.tolist()
    assert a.minima() == b.minima()
    assert (a.rows_start.tolist(), a.rows_field.tolist(), a.rows_min.tolist()) == (
        b.rows_start.tolist(), b.rows_field.tolist(), b.rows_min.tolist())
    if nbytes:
        assert a.nbytes.tolist() == b.nbytes.tolist()


OPS = st.lists(st.tuples(st.sampled_from(["add", "claim", "expire", "complete", "compact",
                                          "sync"]),
                         st.integers(0, 7), st.integers(1, 40)),
               min_size=5, max_size=40)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_kept_up_to_date_it_equals_a_whole_read(r, ops) -> None:  # type: ignore[no-untyped-def]
    r.flushdb()
    topic = "persistent://t/ns/view"
    idx = TopicIndex(r, topic)
    view = IndexView(r)
    now = int(time.time() * 1000)
    base = (now // TICK + 3600) * TICK
    rng = np.random.default_rng(len(ops))
    held: dict[int, str] = {}  # bucket -> lease id
    for op, k, n in ops:
        bucket = base + k * TICK
        if op == "add":
            offs = rng.integers(0, 1 << 40, size=n).tolist()
            idx.add([(k % 3, o, bucket + (o % TICK), TICK) for o in offs])
        elif op in ("claim", "expire"):
            lease_ms = 1 if op == "expire" else 60_000
            for b in idx.claim_between(bucket, bucket, now, 10, lease_ms):
                held[b.bucket_start] = b.lease_id
            now += 5  # an expired lease is back in the index at the next claim
        elif op == "complete" and bucket in held:
            idx.complete(bucket, held.pop(bucket))
        elif op == "compact":
            idx.compact(100)
        else:
            _same(view.figures(topic), IndexView(r).figures(topic), nbytes=False)
    _same(view.figures(topic), IndexView(r).figures(topic), nbytes=False)
    # Once compaction has settled, the bytes agree too.
    idx.compact(1000)
    view.figures(topic)
    _same(view.figures(topic), IndexView(r).figures(topic))
    # One whole read at most: the first (none when nothing was ever added).
    assert view.full_reads == (1 if any(op == "add" for op, _, _ in ops) else 0)


def test_it_reads_a_topic_whole_again_when_redis_lost_its_place(r) -> None:  # type: ignore[no-untyped-def]
    topic = "persistent://t/ns/lost"
    idx = TopicIndex(r, topic)
    at = int(time.time() * 1000) + 3_600_000
    idx.add([(0, o, at, TICK) for o in range(10, 20)])
    idx.compact()
    view = IndexView(r)
    assert pending_minimums(view) == {0: 10}
    read = view.buckets_read

    idx.add([(1, 7, at + 5_000, TICK)])
    assert pending_minimums(view) == {0: 10, 1: 7}
    # One bucket read: the new one (the first was compacted when read, so it is settled).
    assert (view.full_reads, view.buckets_read - read) == (1, 1)

    # Trimmed past the entry the view read last: everything is read again.
    r.xtrim(idx.keys.changes, maxlen=0)
    idx.add([(2, 3, at + 9_000, TICK)])
    assert pending_minimums(view) == {0: 10, 1: 7, 2: 3}
    assert view.full_reads == 2

    # Redis lost everything and was rebuilt with less: nothing stale is kept.
    r.flushdb()
    idx.add([(0, 40, at, TICK)])
    assert pending_minimums(view) == {0: 40}
    assert view.full_reads == 3

    r.flushdb()
    assert pending_minimums(view) == {}


def test_a_topic_never_indexed_leaves_no_trace(r) -> None:  # type: ignore[no-untyped-def]
    """The tracker's HTTP stats ask the view for any topic a request names."""
    view = IndexView(r)
    fig = view.figures("persistent://t/ns/never-published")
    assert (len(fig.starts), fig.minima()) == (0, {})
    assert r.dbsize() == 0
    assert view.full_reads == 0


@pytest.mark.parametrize("where", ["a blob's name", "a delta's field"])
def test_a_field_no_delay_log_has_is_refused(r, where: str) -> None:  # type: ignore[no-untyped-def]
    """A field beyond any partition (from bytes dwell's scripts cannot have written) could
    make the minima allocate a slot for each value below it."""
    topic = "persistent://t/ns/field"
    idx = TopicIndex(r, topic)
    at = int(time.time() * 1000) + 3_600_000
    idx.add([(0, 5, at, TICK)])
    [b] = idx.buckets()
    if where == "a blob's name":
        r.hset(idx.keys.bucket(b), "4294967295", bytes(BitMap64([1]).serialize()))
    else:
        r.append(idx.keys.delta(b), pack_deltas(np.array([0xFFFFFFFF]), np.array([1])))
    with pytest.raises(CorruptIndex, match="not a partition"):
        IndexView(r).figures(topic)


def test_a_torn_delta_is_refused(r) -> None:  # type: ignore[no-untyped-def]
    topic = "persistent://t/ns/torn"
    idx = TopicIndex(r, topic)
    at = int(time.time() * 1000) + 3_600_000
    idx.add([(0, 5, at, TICK)])
    view = IndexView(r)
    view.figures(topic)
    [b] = idx.buckets()
    r.append(idx.keys.delta(b), b"\x01\x02\x03")
    idx.add([(0, 6, at, TICK)])  # names the bucket in the changes stream
    with pytest.raises(CorruptIndex):
        view.figures(topic)
    with pytest.raises(CorruptIndex):  # and again: the view did not move past it
        view.figures(topic)


@pytest.mark.parametrize("entry", [{"b": "12,x"}, {"b": "9" * 400}, {"b": ","}])
def test_a_changes_entry_that_names_no_bucket_means_a_whole_read(r, entry) -> None:  # type: ignore[no-untyped-def]
    """The stream only says where to look; the index itself is read whole instead."""
    topic = "persistent://t/ns/garbled"
    idx = TopicIndex(r, topic)
    at = int(time.time() * 1000) + 3_600_000
    idx.add([(0, 5, at, TICK)])
    view = IndexView(r)
    assert view.figures(topic).minima() == {0: 5}
    r.xadd(idx.keys.changes, entry)
    idx.add([(1, 2, at, TICK)])
    assert view.figures(topic).minima() == {0: 5, 1: 2}
    assert view.full_reads == 2
    idx.add([(1, 1, at, TICK)])  # and the stream is followed again after it
    assert view.figures(topic).minima() == {0: 5, 1: 1}
    assert view.full_reads == 2
