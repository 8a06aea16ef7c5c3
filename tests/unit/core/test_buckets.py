import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwell.core.buckets import bucket_due_cutoff, bucket_start, delivery_cutoff, is_bucket_due


@pytest.mark.parametrize(
    ("deliver_at", "tick", "start"),
    [
        (0, 1000, 0),
        (999, 1000, 0),
        (1000, 1000, 1000),
        (1_700_000_000_123, 1000, 1_700_000_000_000),
        (12345, 1, 12345),
        (-1, 1000, -1000),
        (-1000, 1000, -1000),
    ],
)
def test_bucket_start(deliver_at: int, tick: int, start: int) -> None:
    assert bucket_start(deliver_at, tick) == start


@pytest.mark.parametrize(
    ("now", "tick", "strict", "delivery", "due"),
    [
        (10_000, 1000, False, 11_000, 10_001),
        (10_000, 1000, True, 10_000, 9_001),
        (10_000, 1, True, 10_000, 10_000),
    ],
)
def test_cutoffs(now: int, tick: int, strict: bool, delivery: int, due: int) -> None:
    assert delivery_cutoff(now, tick, strict) == delivery
    assert bucket_due_cutoff(now, tick, strict) == due


@pytest.mark.parametrize(
    ("start", "now", "strict", "due"),
    [
        (10_001, 10_000, False, True),  # its last message, 11_000, is within now + tick
        (10_002, 10_000, False, False),
        (11_000, 10_000, False, False),
        (9_000, 9_999, True, True),  # strict: due once now reaches the bucket's last ms
        (9_000, 9_998, True, False),
        (10_000, 10_000, True, False),
    ],
)
def test_is_bucket_due(start: int, now: int, strict: bool, due: bool) -> None:
    assert is_bucket_due(start, 1000, now, strict) is due


def test_tick_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tick_time_ms"):
        bucket_start(5, 0)
    with pytest.raises(ValueError, match="tick_time_ms"):
        delivery_cutoff(5, 0, False)
    with pytest.raises(ValueError, match="tick_time_ms"):
        bucket_due_cutoff(5, -1, True)


_times = st.integers(min_value=-(10**13), max_value=10**13)
_ticks = st.integers(min_value=1, max_value=10**7)


@given(_times, _ticks)
def test_bucket_contains_its_message(deliver_at: int, tick: int) -> None:
    start = bucket_start(deliver_at, tick)
    assert start % tick == 0
    assert start <= deliver_at < start + tick
    assert bucket_start(start, tick) == start


@given(_times, _times, _ticks)
def test_bucket_start_is_monotonic(a: int, b: int, tick: int) -> None:
    if a <= b:
        assert bucket_start(a, tick) <= bucket_start(b, tick)


@given(_times, _times, _ticks)
def test_strict_is_never_early(deliver_at: int, now: int, tick: int) -> None:
    if is_bucket_due(bucket_start(deliver_at, tick), tick, now, strict=True):
        assert deliver_at <= now


@given(_times, _times, _ticks)
def test_strict_is_never_late_by_more_than_a_tick(deliver_at: int, now: int, tick: int) -> None:
    # Once deliverAt + tick - 1 has passed, the bucket holding it is due.
    if now >= deliver_at + tick - 1:
        assert is_bucket_due(bucket_start(deliver_at, tick), tick, now, strict=True)


@given(_times, _times, _ticks)
def test_non_strict_early_bound(deliver_at: int, now: int, tick: int) -> None:
    if is_bucket_due(bucket_start(deliver_at, tick), tick, now, strict=False):
        assert deliver_at <= now + tick
    if deliver_at <= now + 1:
        assert is_bucket_due(bucket_start(deliver_at, tick), tick, now, strict=False)


@given(_times, _times, _ticks, st.booleans(), st.integers(min_value=0, max_value=10**7))
def test_due_stays_due(start: int, now: int, tick: int, strict: bool, later: int) -> None:
    if is_bucket_due(start, tick, now, strict):
        assert is_bucket_due(start, tick, now + later, strict)
