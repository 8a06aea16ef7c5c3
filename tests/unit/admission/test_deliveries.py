"""The event-loop side of publishing: Deliveries' deadline and its producer mode. Real
clients aimed at a closed port stand in for an unreachable Kafka."""

from __future__ import annotations

import asyncio
import time

import pytest

from dwell.adapters import kafka
from dwell.admission.deliveries import Deliveries

DEAD_KAFKA = "127.0.0.1:1"
RECORD: kafka.OutRecord = ("t", b"v", None, [("h", b"1")], None)


def test_a_batch_without_a_delivery_report_times_out_at_its_deadline() -> None:
    # The producer would report the failure only after 30 s (message.timeout.ms).
    producer = kafka.Producer(DEAD_KAFKA, poll_in_background=False,
                              **{"message.timeout.ms": 30000})
    deliveries = Deliveries(producer, timeout_s=0.3)

    async def send() -> float:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="no delivery report in 0.3 s"):
            await deliveries.send([RECORD])
        return time.monotonic() - t0

    try:
        waited = asyncio.run(send())
    finally:
        producer.close(0.1)
    assert 0.3 <= waited < 1.5


def test_a_failed_delivery_fails_the_batch() -> None:
    producer = kafka.Producer(DEAD_KAFKA, poll_in_background=False,
                              **{"message.timeout.ms": 300})
    deliveries = Deliveries(producer, timeout_s=10)

    async def send() -> None:
        with pytest.raises(kafka.KafkaUnavailable):
            await deliveries.send([RECORD, RECORD])

    try:
        asyncio.run(send())
    finally:
        producer.close(0.1)


def test_deliveries_needs_a_producer_polled_by_its_caller() -> None:
    producer = kafka.Producer(DEAD_KAFKA)  # a background thread serves its reports
    try:
        with pytest.raises(ValueError, match="poll_in_background=False"):
            Deliveries(producer, timeout_s=1)
    finally:
        producer.close(0.1)
