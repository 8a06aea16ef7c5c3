"""The low watermarks on real Redis (dwell.tracker.recovery.pending_minimums, from the
index view dwell.tracker.index_view): the lowest pending offset is found wherever the
index keeps it, including a bucket whose lease
expired while another caller's claim skipped it, which is back in the index with its
positions still in its claimed keys. A mark above a pending position would let the trim
delete a message that was never delivered."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from pyroaring import BitMap64

from dwell import keys
from dwell.adapters.kafka import KafkaUnavailable
from dwell.adapters.redis import connect
from dwell.index.roaring import pack_deltas
from dwell.index.topic import TopicIndex
from dwell.tracker.index_view import IndexView
from dwell.tracker.recovery import (
    CorruptIndex,
    LowmarkKeeper,
    committed_lowmarks,
    pending_minimums,
)
from dwell_dev.testkit import redis_db_url, wait_for

pytestmark = pytest.mark.integration

DB = 12
TICK = 1000


@pytest.fixture()
def index(stack, unique: str) -> TopicIndex:  # type: ignore[no-untyped-def]
    r = connect(redis_db_url(stack, DB))
    r.flushdb()
    return TopicIndex(r, f"persistent://t/ns/lowmark-{unique}")


def test_every_place_a_position_waits_counts(index: TopicIndex) -> None:
    now = int(time.time() * 1000)
    early, late = now + 3_600_000, now + 7_200_000
    index.add([(0, off, early, TICK) for off in range(10, 20)])
    index.add([(0, off, late, TICK) for off in range(100, 110)] + [(1, 5, late, TICK)])
    b_early, b_late = index.buckets()
    # One view throughout: after its first read, each call reads what changed.
    view = IndexView(index.redis)
    assert pending_minimums(view) == {0: 10, 1: 5}

    # Claimed under a lease that then expires: the positions wait in the claimed keys.
    [held] = index.claim_between(b_early, b_early, now, 10, 1)
    assert pending_minimums(view) == {0: 10, 1: 5}
    # A claim of another bucket returns the expired one to the index and leaves it
    # there, its data in the claimed keys (the restage's claim_between does this).
    [other] = index.claim_between(b_late, b_late, now + 10, 10, 60_000)
    assert index.redis.zscore(index.keys.index, b_early) is not None
    assert index.read_bucket(b_early) == {}
    assert pending_minimums(view) == {0: 10, 1: 5}

    # Delivered (completed by the holder of the live lease): the marks move up.
    assert index.complete(b_late, other.lease_id)
    assert pending_minimums(view) == {0: 10}
    [again] = index.claim_between(b_early, b_early, now + 20, 10, 60_000)
    assert sorted(again.positions[0]) == list(range(10, 20))
    assert not index.complete(b_early, held.lease_id)  # the expired lease is not the holder
    assert index.complete(b_early, again.lease_id)
    assert pending_minimums(view) == {}


def _shapes() -> list[BitMap64]:
    """Bitmaps in each container kind the portable format has, alone and mixed."""
    rng = np.random.default_rng(11)
    shapes = [BitMap64([7]), BitMap64([0]), BitMap64(range(5, 70_000)),  # runs
              BitMap64(range(3, 200_000, 2)),  # bitsets (over 4,096 a container)
              BitMap64([1 << 32, (1 << 32) + 9]),  # above 32 bits
              BitMap64([65_536 * 3 + 4, 65_536 * 9]),  # a first container past key 0
              BitMap64([(5 << 32) + 70_000, 6 << 32])]
    for _ in range(40):
        base = int(rng.integers(0, 1 << 40))
        size = int(rng.choice([1, 10, 5_000, 100_000]))
        span = max(size, 1 << int(rng.integers(10, 24)))
        values = base + rng.choice(span, size, replace=False)
        shapes.append(BitMap64(values.tolist()))
    shapes += [BitMap64(range(1_000, 2_000)) | BitMap64([70_000]),  # a run, then an array
               BitMap64([5]) | BitMap64(range(70_000, 80_000)),  # an array, then a run
               BitMap64(range(17, 400_000))]  # runs in 4 containers or more (offsets kept)
    return shapes


@pytest.mark.parametrize("run_optimize", [True, False])
def test_the_view_reads_the_minimum_of_every_blob_shape(index: TopicIndex,
                                                          run_optimize: bool) -> None:
    ks = index.keys
    r = index.redis
    r.sadd(keys.TOPICS, index.topic)
    shapes = _shapes()
    for i, bm in enumerate(shapes):
        if run_optimize:
            bm.run_optimize()
        b = 1000 * (i + 1)
        r.zadd(ks.index, {str(b): b})
        r.hset(ks.bucket(b), str(i), bytes(bm.serialize()))
        assert pending_minimums(IndexView(r)) == {i: bm.min()}, (i, bm.min())
        r.delete(ks.bucket(b))
    # Deltas, claimed blobs and claimed deltas, several fields each.
    b = 9_000_000
    r.zadd(ks.claims, {str(b): 1})
    r.rpush(ks.claimed(b), "3", bytes(BitMap64([40, 41]).serialize()))
    r.set(ks.claimed_delta(b), pack_deltas(np.array([3, 4, 4]), np.array([39, 12, 1 << 40])))
    r.set(ks.delta(b), pack_deltas(np.array([5, 4]), np.array([1 << 33, 11])))
    assert pending_minimums(IndexView(r)) == {3: 39, 4: 11, 5: 1 << 33}


def _torn_delta() -> bytes:
    return pack_deltas(np.array([0, 0]), np.array([3, 4]))[:-5]


@pytest.mark.parametrize("where", ["empty blob", "cut blob", "not roaring", "torn delta"])
def test_a_corrupt_bucket_stops_the_marks_and_says_so(  # type: ignore[no-untyped-def]
        index: TopicIndex, stack, unique: str, where: str) -> None:
    """Data dwell's scripts cannot have written gives no mark at all: a minimum read from
    it could be above a pending position. The keeper reports it and commits nothing."""
    r = index.redis
    now = int(time.time() * 1000)
    index.add([(0, off, now + 3_600_000, TICK) for off in range(10, 20)])
    [b] = index.buckets()
    r.hset(keys.INGESTED, "0", 20)
    blob = bytes(BitMap64(range(100, 110)).serialize())
    if where == "torn delta":
        r.append(index.keys.delta(b), _torn_delta())
    else:
        r.hset(index.keys.bucket(b), "1", {"empty blob": b"", "cut blob": blob[:16],
                                           "not roaring": b"\x01" * 40}[where])
    with pytest.raises(CorruptIndex):
        pending_minimums(IndexView(r))

    group = f"dwell-lowmark-test-{unique}"
    keeper = LowmarkKeeper(IndexView(r), stack.kafka_bootstrap, group, delayed_topic=f"t.{unique}",
                           refiled_topic=f"t.{unique}.refiled", interval_s=0.05)
    runner = threading.Thread(target=keeper.run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while not keeper.error and time.monotonic() < deadline:
            time.sleep(0.02)
        assert keeper.error
        assert runner.is_alive()  # it goes on retrying
    finally:
        keeper.stop()
        runner.join(5)

    def committed() -> tuple[dict[tuple[str, int], int]] | None:
        try:  # a fresh cluster's group coordinator may still be loading
            return (committed_lowmarks(stack.kafka_bootstrap, group, [(f"t.{unique}", 0)]),)
        except KafkaUnavailable:
            return None

    assert wait_for(committed, 30, "the committed low watermarks") == ({},)
