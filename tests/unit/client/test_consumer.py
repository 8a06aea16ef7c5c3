"""The Consumer's offset bookkeeping: only a settled prefix of each partition is committed,
so a crash re-reads what the application or the backoff job does not yet own."""

from __future__ import annotations

import pytest

from dwell.adapters.kafka import KafkaUnavailable
from dwell.client import Consumer, ExponentialRedeliveryBackoff
from dwell.client.consumer import Message, _Offsets, properties_of
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


class _Commits:
    """The commit calls the Consumer makes: the first ``failures`` are refused as the
    adapter refuses them when Kafka stays away past its retries."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.committed: list[dict[tuple[str, int], int]] = []

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        if self.failures:
            self.failures -= 1
            raise KafkaUnavailable("Commit failed: Broker: Coordinator load in progress")
        self.committed.append(dict(offsets))


def _message(offset: int) -> Message:
    return Message(b"x", None, {}, f"m{offset}", 0, None, None, None, "t", TP[0], TP[1],
                   offset)


def test_a_commit_refused_while_kafka_is_away_is_carried_by_the_next(
        caplog: pytest.LogCaptureFixture) -> None:
    """An acknowledgement whose commit fails (Kafka away longer than the commit's retries)
    does not raise into the application: the offset stays settled and the next commit
    carries it."""
    c = Consumer.__new__(Consumer)
    c._offsets = _Offsets()
    c._consumer = commits = _Commits(failures=1)  # type: ignore[assignment]
    for off in (10, 11):
        c._offsets.received(TP, off)
    c._settle(_message(10))
    assert commits.committed == []
    assert "offsets not committed" in caplog.text
    c._settle(_message(11))
    assert commits.committed == [{TP: 12}]
