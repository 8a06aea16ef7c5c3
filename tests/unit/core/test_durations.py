import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwell.core.durations import MAX_DURATION_MS, format_duration_ms, parse_duration_ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("1s", 1000),
        ("10m", 600_000),
        ("5h", 18_000_000),
        ("3d", 259_200_000),
        ("2w", 1_209_600_000),
        ("0", 0),
        ("5", 5000),  # bare integer = seconds, as RelativeTimeUtil
        ("500", 500_000),  # seconds, not ms: pulsar-admin's -t 500 is 500 s
        ("1y", 31_536_000_000),  # RelativeTimeUtil's y is 365 days
        ("10MS", 10),
        ("1S", 1000),
        ("1M", 60_000),
        (" 1s ", 1000),
        ("1m30s", 90_000),
        ("1h1ms", 3_600_001),
    ],
)
def test_parse(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["", "5x", "-1s", "-5", "1.5s", "s", "ms", "1 s", "30s1m", "1s1s", "1e3", "٣s", "+1s"]
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="use a number with a unit, e.g. 500ms, 1s, 10m, 5h, 3d"):
        parse_duration_ms(text)


def test_parse_error_text() -> None:
    with pytest.raises(ValueError) as exc:
        parse_duration_ms("5x")
    assert str(exc.value) == (
        "invalid duration '5x': use a number with a unit, e.g. 500ms, 1s, 10m, 5h, 3d"
    )


def test_parse_rejects_overflow() -> None:
    with pytest.raises(ValueError, match="longer than"):
        parse_duration_ms(f"{MAX_DURATION_MS}s")


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (1, "1ms"),
        (1500, "1500ms"),
        (5000, "5s"),
        (90_000, "1m30s"),
        (3_600_000, "1h"),
        (86_400_000 + 1000, "1d1s"),
        (1_209_600_000, "2w"),
        (31_536_000_000 + 7 * 86_400_000, "1y1w"),
    ],
)
def test_format(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text


def test_format_rejects_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_duration_ms(-1)


@given(st.integers(min_value=0, max_value=MAX_DURATION_MS))
def test_format_parses_back(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@given(
    st.integers(min_value=0, max_value=10**9),
    st.sampled_from([("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)]),
)
def test_single_unit(n: int, unit: tuple[str, int]) -> None:
    assert parse_duration_ms(f"{n}{unit[0]}") == n * unit[1]
    assert parse_duration_ms(f"{n}{unit[0].upper()}") == n * unit[1]
