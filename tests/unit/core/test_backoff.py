import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwell.core.backoff import (
    DEFAULT_NACK_DELAY_MS,
    MAX_DELAY_MS,
    MIN_NACK_DELAY_MS,
    ExponentialRedeliveryBackoff,
    ack_timeout_redelivery_at,
    nack_redelivery_at,
    next_delay,
    validate_ack_timeout_ms,
)

B = ExponentialRedeliveryBackoff


def test_defaults() -> None:
    b = B()
    assert (b.min_delay_ms, b.max_delay_ms, b.multiplier) == (10000, 600000, 2.0)
    assert (DEFAULT_NACK_DELAY_MS, MIN_NACK_DELAY_MS) == (60000, 100)


@pytest.mark.parametrize(
    ("backoff", "count", "delay"),
    [
        (B(1000, 600000, 2), 0, 1000),
        (B(1000, 600000, 2), 1, 2000),
        (B(1000, 600000, 2), 4, 16000),
        (B(1000, 600000, 2), 100, 600000),
        (B(1000, 600000, 2), 10**6, 600000),  # 2.0**1e6 overflows a float
        (B(1000, 600000, 2), -3, 1000),
        (B(2000, 6000000, 5), 1, 10000),
        (B(2000, 6000000, 5), 2, 50000),
        (B(2000, 6000000, 5), 4, 1250000),
        (B(0, 600000, 2), 5, 0),
        (B(1000, 1000, 2), 3, 1000),
        (B(1000, MAX_DELAY_MS, 1.5), 3, 3375),
    ],
)
def test_next_table(backoff: B, count: int, delay: int) -> None:
    assert backoff.next(count) == delay
    assert next_delay(count, backoff) == delay


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 600000, 2.0), "min delay time must be >= 0"),
        ((1000, 999, 2.0), "maxDelayMs must be >= minDelayMs"),
        ((1000, 2000, 1.0), "multiplier must be > 1"),
        ((1000, 2000, 0.5), "multiplier must be > 1"),
        ((1000, 2000, math.nan), "multiplier must be > 1"),
        ((1000, 2000, math.inf), "multiplier must be finite"),
        # Past Pulsar's checks: bounds that keep every due time inside a signed 64-bit count.
        ((1000, MAX_DELAY_MS + 1, 2.0), f"maxDelayMs must be at most {MAX_DELAY_MS} (100 years)"),
        ((1000, 2000, 1000.5), "multiplier must be at most 1000"),
    ],
)
def test_validation_uses_pulsar_messages(args: tuple[int, int, float], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        B(*args)
    assert str(exc.value) == message


def test_builder() -> None:
    b = B.builder().min_delay_ms(1000).max_delay_ms(60000).multiplier(2).build()
    assert b == B(1000, 60000, 2.0)
    assert B.builder().build() == B()
    with pytest.raises(ValueError, match="maxDelayMs must be >= minDelayMs"):
        B.builder().min_delay_ms(5).max_delay_ms(1).build()


def test_json_round_trip() -> None:
    b = B(1000, 60000, 2.5)
    assert b.to_json() == {"minDelayMs": 1000, "maxDelayMs": 60000, "multiplier": 2.5}
    assert B.from_json(b.to_json()) == b
    assert B.from_json({"minDelayMs": 1, "maxDelayMs": 2, "multiplier": 3}) == B(1, 2, 3.0)
    assert B.from_json({}) == B()


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"minDelayMs": "1000"}, "minDelayMs must be an integer"),
        ({"maxDelayMs": 1.5}, "maxDelayMs must be an integer"),
        ({"minDelayMs": True}, "minDelayMs must be a number, got a boolean"),
        ({"multiplier": "2"}, "multiplier must be a number"),
        ({"multiplier": False}, "multiplier must be a number"),
        ({"minDelay": 5}, "unknown field 'minDelay'"),
        ({"minDelayMs": -1}, "min delay time must be >= 0"),
        ([], "must be a JSON object"),
    ],
)
def test_from_json_rejects(doc: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        B.from_json(doc)  # type: ignore[arg-type]


@pytest.mark.parametrize("ms", [0, 1000, 10_000])
def test_ack_timeout_accepts(ms: int) -> None:
    assert validate_ack_timeout_ms(ms) == ms


@pytest.mark.parametrize("ms", [1, 999, -1])
def test_ack_timeout_rejects(ms: int) -> None:
    with pytest.raises(ValueError, match="0 \\(off\\) or at least 1000 ms"):
        validate_ack_timeout_ms(ms)


def test_pip130_schedule() -> None:
    # ackTimeout 10 s, min 1 s, max 60 s, x2: each redelivery comes this long after the last.
    b = B(1000, 60000, 2)
    delivered = 0
    gaps = []
    for count in range(8):
        at = ack_timeout_redelivery_at(delivered, 10_000, b, count)
        gaps.append((at - delivered) // 1000)
        delivered = at
    assert gaps == [11, 12, 14, 18, 26, 42, 70, 70]


def test_ack_timeout_without_backoff() -> None:
    assert ack_timeout_redelivery_at(5000, 10_000, None, 7) == 15_000


@pytest.mark.parametrize(
    ("backoff", "count", "delay_ms", "expected"),
    [
        (None, 0, DEFAULT_NACK_DELAY_MS, 1000 + 60_000),
        (None, 9, 5000, 1000 + 5000),
        (None, 0, 10, 1000 + MIN_NACK_DELAY_MS),  # Pulsar raises tiny nack delays to 100 ms
        (B(1000, 60000, 2), 3, DEFAULT_NACK_DELAY_MS, 1000 + 8000),
        (B(1000, 60000, 2), 0, 5, 1000 + 1000),
    ],
)
def test_nack_redelivery_at(backoff: B | None, count: int, delay_ms: int, expected: int) -> None:
    assert nack_redelivery_at(1000, backoff, count, delay_ms) == expected


def test_nack_default_delay() -> None:
    assert nack_redelivery_at(0, None, 0) == DEFAULT_NACK_DELAY_MS


_backoffs = st.integers(min_value=0, max_value=10**9).flatmap(
    lambda lo: st.builds(
        B,
        min_delay_ms=st.just(lo),
        max_delay_ms=st.integers(min_value=lo, max_value=10**12),
        multiplier=st.floats(min_value=1.0001, max_value=1000, allow_nan=False),
    )
)
_counts = st.integers(min_value=-10, max_value=10**9)


@given(_backoffs, _counts, _counts)
def test_next_is_monotonic(b: B, c1: int, c2: int) -> None:
    lo, hi = sorted((c1, c2))
    assert b.next(lo) <= b.next(hi)


@given(_backoffs, _counts)
def test_next_is_bounded(b: B, count: int) -> None:
    delay = b.next(count)
    assert isinstance(delay, int)
    assert b.min_delay_ms <= delay <= b.max_delay_ms


@given(_backoffs)
def test_next_reaches_the_cap(b: B) -> None:
    assert b.next(10**9) == b.max_delay_ms or b.min_delay_ms == 0


@given(_backoffs)
def test_json_round_trip_property(b: B) -> None:
    assert B.from_json(b.to_json()) == b
