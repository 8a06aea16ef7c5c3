"""adapters.kafka.close_within: closing a consumer never holds its caller longer than
its timeout (librdkafka's close can wait without end for a group coordinator)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import Consumer as _Consumer

from dwell.adapters.kafka.consumer import close_within


class _StuckClose:
    """A client whose close waits until released, as librdkafka's does while it keeps
    looking for an unreachable group coordinator."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.release.wait(30)
        self.closed.set()


class _FailingClose:
    def close(self) -> None:
        raise RuntimeError("Consumer already closed")


def test_a_close_that_does_not_end_is_left_behind(caplog: pytest.LogCaptureFixture) -> None:
    client = _StuckClose()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dwell.adapters.kafka"):
        close_within(client, 0.3)  # type: ignore[arg-type]
    assert 0.3 <= time.monotonic() - started < 2
    assert "left to finish in the background" in caplog.text
    client.release.set()
    assert client.closed.wait(5)  # it goes on, on its own thread


def test_an_error_within_the_timeout_is_raised() -> None:
    with pytest.raises(RuntimeError, match="already closed"):
        close_within(_FailingClose(), 5)  # type: ignore[arg-type]


def test_a_group_consumer_without_a_broker_closes_in_time() -> None:
    c = _Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "dwell-close-test",
                   "socket.connection.setup.timeout.ms": 1000})
    c.subscribe(["dwell.close.test"])
    c.poll(0.2)
    started = time.monotonic()
    close_within(c, 10)
    assert time.monotonic() - started < 10
