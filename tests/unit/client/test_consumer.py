"""The Consumer's offset bookkeeping: only a settled prefix of each partition is committed,
so a crash re-reads what the application or the backoff job does not yet own."""

from __future__ import annotations

from dwell.client import ExponentialRedeliveryBackoff
from dwell.client.consumer import _Offsets, properties_of
from dwell.core import backoff

TP = ("acme.orders.new", 0)


def test_commits_up_to_the_first_unsettled_offset() -> None:
    o = _Offsets()
    for off in (10, 11, 12):
        o.received(TP, off)
    assert o.committable() == {TP: 10}
    o.settle(TP, 11)
    assert o.committable() == {TP: 10}
    o.settle(TP, 10)
    assert o.committable() == {TP: 12}
    o.settle(TP, 12)
    assert o.committable() == {TP: 13}


def test_partitions_are_independent() -> None:
    o = _Offsets()
    other = ("acme.orders.new", 1)
    o.received(TP, 5)
    o.received(other, 7)
    o.settle(other, 7)
    assert o.committable() == {TP: 5, other: 8}


def test_properties_exclude_dwell_headers() -> None:
    assert properties_of({"dwell-topic": b"x", "colour": b"red",
                          "dwell-redelivery-count": b"1"}) == {"colour": "red"}


def test_backoff_is_the_core_one() -> None:
    assert ExponentialRedeliveryBackoff is backoff.ExponentialRedeliveryBackoff
    b = ExponentialRedeliveryBackoff.builder().min_delay_ms(1000).max_delay_ms(60000).build()
    assert [b.next(c) for c in (0, 1, 4, 100)] == [1000, 2000, 16000, 60000]
