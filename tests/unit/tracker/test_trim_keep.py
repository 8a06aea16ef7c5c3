"""The trim's cut of the delay logs lags the committed low watermarks by
DWELL_TRIM_KEEP_DELIVERED_MS (dwell.tracker.trim.Trimmer.kept_lows): a delivered record
stays that long for its redeliveries."""

from __future__ import annotations

from dwell.tracker.trim import Trimmer

TP = ("dwell.delayed", 0)


def trimmer(keep_s: float) -> Trimmer:
    return Trimmer("127.0.0.1:1", "g", delayed_topic="dwell.delayed",
                   refiled_topic="dwell.delayed.refiled", interval_s=1,
                   keep_delivered_s=keep_s)


def test_without_keep_the_current_marks_are_cut_below() -> None:
    assert trimmer(0).kept_lows({TP: 7}, 0.0) == {TP: 7}


def test_nothing_is_cut_until_a_round_is_as_old_as_the_keep() -> None:
    t = trimmer(10)
    assert t.kept_lows({TP: 5}, 100.0) == {}
    assert t.kept_lows({TP: 9}, 109.9) == {}
    assert t.kept_lows({TP: 12}, 110.0) == {TP: 5}


def test_the_cut_is_the_newest_round_at_least_keep_old() -> None:
    t = trimmer(10)
    for now, low in ((0.0, 1), (4.0, 2), (8.0, 3), (12.0, 4), (16.0, 5)):
        t.kept_lows({TP: low}, now)
    # At 19: the rounds of 0 and 8 are >= 10 s old; 8's marks are the newest of them.
    assert t.kept_lows({TP: 6}, 19.0) == {TP: 3}
    assert [at for at, _ in t._seen] == [8.0, 12.0, 16.0, 19.0]


def test_a_partition_gone_or_lower_now_is_never_cut_above_its_current_mark() -> None:
    t = trimmer(1)
    other = ("dwell.delayed", 1)
    t.kept_lows({TP: 50, other: 3}, 0.0)
    assert t.kept_lows({TP: 40}, 2.0) == {TP: 40}
