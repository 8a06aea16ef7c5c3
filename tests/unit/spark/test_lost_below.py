"""What the drain keeps of a range whose first records are gone from their log."""

from __future__ import annotations

from pyroaring import BitMap64

from dwell_spark.drain import lost_below
from dwell_spark.records import Range


def test_a_dense_range_is_cut_at_the_logs_start() -> None:
    r = Range("ready", "dwell.delayed", 3, 9, 58)
    assert lost_below(r, 0) == (0, r)
    gone, rest = lost_below(r, 20)
    assert gone == 11 and rest == Range("ready", "dwell.delayed", 3, 20, 58)
    assert lost_below(r, 59) == (50, None)
    assert lost_below(r, 1000) == (50, None)


def test_a_scattered_range_keeps_its_offsets_above_the_start() -> None:
    r = Range("ready", "dwell.delayed", 0, 2, 40, offsets=BitMap64([2, 5, 9, 30, 40]))
    gone, rest = lost_below(r, 9)
    assert gone == 2
    assert rest is not None and (rest.first, rest.last) == (9, 40)
    assert list(rest.offsets or []) == [9, 30, 40]
    assert lost_below(r, 41) == (5, None)


def test_a_redeliverys_counts_follow_the_cut() -> None:
    r = Range("t-RETRY", "t", 1, 4, 7, "sub", {4: 1, 5: 2, 6: 1, 7: 3})
    gone, rest = lost_below(r, 6)
    assert gone == 2 and rest is not None and rest.counts == {6: 1, 7: 3}
