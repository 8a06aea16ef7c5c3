"""Lease renewal on real Redis: renew-2.lua extends only the holder's lease, and touches
neither a bucket claimed by another lease nor a completed one; LeaseKeeper keeps a
round's claims past their lease until the round's maximum time, and reports the claims it
lost."""

from __future__ import annotations

import time

import pytest

from dwell import keys
from dwell.adapters.redis import connect
from dwell.index.bucket_index import LEASE_MISMATCH, NOT_CLAIMED, RENEWED
from dwell.index.leases import LeaseKeeper, RoundExpired
from dwell.index.topic import TopicIndex
from dwell_dev.testkit import wait_for

pytestmark = pytest.mark.integration
TICK = 1000
LEASE = 1000


def _now() -> int:
    return int(time.time() * 1000)


@pytest.fixture()
def index(redis_url: str, unique: str) -> TopicIndex:
    """A topic index with one bucket an hour ahead: claimed with claim_between, as the
    restage does, so that no drainer of the test stack ever takes it."""
    idx = TopicIndex(connect(redis_url), f"persistent://t/ns/lease-{unique}")
    at = _now() + 3_600_000
    idx.add([(0, off, at, TICK) for off in range(10)])
    return idx


def _bucket(idx: TopicIndex) -> int:
    [b] = idx.buckets()
    return b


def _expiry(idx: TopicIndex, b: int) -> int | None:
    score = idx.redis.zscore(idx.keys.claims, b)
    return None if score is None else int(score)


def test_renew_by_the_holder_extends_its_lease(index: TopicIndex) -> None:
    b = _bucket(index)
    now = _now()
    [claim] = index.claim_between(b, b, now, 10, LEASE)
    assert _expiry(index, b) == now + LEASE
    assert index.renew([b], claim.lease_id, now + 60_000) == [RENEWED]
    assert _expiry(index, b) == now + 60_000
    # Past the first lease, another claim finds the bucket still held.
    assert index.claim_between(b, b, now + 2 * LEASE, 10, LEASE) == []
    # A renewal never shortens a lease.
    assert index.renew([b], claim.lease_id, now + 5_000) == [RENEWED]
    assert _expiry(index, b) == now + 60_000
    assert index.complete(b, claim.lease_id)


def test_renew_by_a_stale_lease_changes_nothing(index: TopicIndex) -> None:
    b = _bucket(index)
    now = _now()
    [old] = index.claim_between(b, b, now, 10, LEASE)
    # The lease ran out before a renewal: another round claims the bucket.
    [new] = index.claim_between(b, b, now + 2 * LEASE, 10, LEASE)
    assert new.lease_id != old.lease_id and new.count() == old.count() == 10
    assert index.renew([b], old.lease_id, now + 60_000) == [LEASE_MISMATCH]
    assert _expiry(index, b) == now + 3 * LEASE
    assert index.redis.hget(index.keys.leases, b) == new.lease_id.encode()
    assert not index.complete(b, old.lease_id)
    assert index.complete(b, new.lease_id)


def test_renew_after_complete_does_nothing(index: TopicIndex) -> None:
    b = _bucket(index)
    now = _now()
    [claim] = index.claim_between(b, b, now, 10, LEASE)
    due_before = index.redis.zscore(keys.DUE, index.topic)
    assert index.complete(b, claim.lease_id)
    assert index.redis.zscore(keys.DUE, index.topic) is None, "completed: nothing left"
    assert index.renew([b], claim.lease_id, now + 60_000) == [NOT_CLAIMED]
    assert index.redis.zcard(index.keys.claims) == 0
    assert index.redis.hlen(index.keys.leases) == 0
    assert index.redis.zscore(keys.DUE, index.topic) is None
    assert due_before == b


def test_a_keeper_holds_the_claims_past_their_lease(index: TopicIndex) -> None:
    b = _bucket(index)
    claims = [(index, c) for c in index.claim_between(b, b, _now(), 10, LEASE)]
    with LeaseKeeper(claims, LEASE, 60_000) as keeper:
        end = time.monotonic() + 3 * LEASE / 1000
        while time.monotonic() < end:
            assert index.claim_between(b, b, _now(), 10, LEASE) == [], "taken while kept"
            time.sleep(0.05)
        assert keeper.check() == frozenset()
        assert keeper.renewals >= 6
    assert index.complete(b, claims[0][1].lease_id)


def test_a_keeper_reports_a_claim_another_round_took(index: TopicIndex) -> None:
    b = _bucket(index)
    now = _now()
    claims = [(index, c) for c in index.claim_between(b, b, now, 10, LEASE)]
    keeper = LeaseKeeper(claims, LEASE, 60_000)  # not started: renewed by hand
    # The lease ran out before a renewal came through: another round claims the bucket.
    [other] = index.claim_between(b, b, now + 2 * LEASE, 10, LEASE)
    keeper.renew()
    assert keeper.check() == frozenset({0})
    assert keeper.renewals == 0
    assert index.redis.hget(index.keys.leases, b) == other.lease_id.encode()


def test_a_keeper_stops_at_the_round_s_maximum_time(index: TopicIndex) -> None:
    """Past max_round_ms the round is told to stop and its leases run out: the claims
    come back however long the round goes on."""
    b = _bucket(index)
    max_round_ms = 1500
    claims = [(index, c) for c in index.claim_between(b, b, _now(), 10, LEASE)]
    with LeaseKeeper(claims, LEASE, max_round_ms) as keeper:
        assert keeper.check() == frozenset()
        taken = wait_for(lambda: index.claim_between(b, b, _now(), 10, LEASE),
                         (max_round_ms + 3 * LEASE) / 1000, "the claim back after the lease")
        assert time.monotonic() >= keeper.deadline
        with pytest.raises(RoundExpired):
            keeper.check()
    assert [c.count() for c in taken] == [10]


def test_positions_arriving_for_a_held_bucket_wait_for_its_holder(index: TopicIndex) -> None:
    """New positions make a claimed bucket live again (the restage's copies land in the
    buckets it holds): another claim leaves it to its holder, and takes the newcomers only
    once the holder completed, without the holder's data."""
    b = _bucket(index)
    now = _now()
    [held] = index.claim_between(b, b, now, 10, LEASE)
    index.add([(1, off, b, TICK) for off in range(5)])
    assert index.buckets() == [b]
    assert index.claim_between(b, b, now + 1, 10, LEASE) == []
    assert index.redis.hget(index.keys.leases, b) == held.lease_id.encode()
    assert index.complete(b, held.lease_id)
    [later] = index.claim_between(b, b, now + 2, 10, LEASE)
    assert {f: list(bm) for f, bm in later.positions.items()} == {1: list(range(5))}
    assert index.complete(b, later.lease_id)
