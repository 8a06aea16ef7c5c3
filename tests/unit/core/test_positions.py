import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwell.core.positions import (
    REFILED_FIELD_BASE,
    coalesce,
    field_partition,
    format_message_id,
    index_field,
    parse_message_id,
)


def test_message_id() -> None:
    assert format_message_id("acme.orders.x", 3, 42) == "acme.orders.x:3:42"
    assert parse_message_id("acme.orders.x:3:42") == ("acme.orders.x", 3, 42)


@given(st.integers(0, REFILED_FIELD_BASE - 1), st.booleans())
def test_index_fields_name_the_delay_log_and_the_refile_log_apart(part: int, refiled: bool) -> None:
    field = index_field(part, refiled)
    assert (field >= REFILED_FIELD_BASE) is refiled
    assert field_partition(field) == (refiled, part)


@pytest.mark.parametrize("part", [-1, REFILED_FIELD_BASE])
def test_index_field_rejects_partitions_out_of_range(part: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        index_field(part, False)


@pytest.mark.parametrize(
    "junk", ["", "x", "x:1", ":1:2", "x:a:2", "x:1:b", "x:-1:2", "x:1: 2", "x:+1:2", "x:1_0:2"]
)
def test_parse_message_id_rejects(junk: str) -> None:
    with pytest.raises(ValueError, match="invalid message id"):
        parse_message_id(junk)


@given(
    st.text(min_size=1).filter(lambda s: ":" not in s),
    st.integers(min_value=0, max_value=2**31),
    st.integers(min_value=0, max_value=2**63),
)
def test_message_id_round_trips(topic: str, partition: int, offset: int) -> None:
    assert parse_message_id(format_message_id(topic, partition, offset)) == (
        topic,
        partition,
        offset,
    )


@pytest.mark.parametrize(
    ("offsets", "ranges"),
    [
        ([], []),
        ([5], [(5, 5)]),
        ([3, 1, 2], [(1, 3)]),
        ([1, 2, 4, 5, 7], [(1, 2), (4, 5), (7, 7)]),
        ([2, 2, 3], [(2, 3)]),
    ],
)
def test_coalesce(offsets: list[int], ranges: list[tuple[int, int]]) -> None:
    assert coalesce(offsets) == ranges
    assert coalesce(iter(offsets)) == ranges


@given(st.sets(st.integers(min_value=0, max_value=500)))
def test_coalesce_covers_exactly(offsets: set[int]) -> None:
    ranges = coalesce(offsets)
    covered = [o for first, last in ranges for o in range(first, last + 1)]
    assert covered == sorted(offsets)
    for (_, last), (first, _) in zip(ranges, ranges[1:], strict=False):
        assert first > last + 1  # ranges are maximal
