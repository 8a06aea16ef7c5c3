"""The event-loop side of publishing: Deliveries' deadline and its producer mode, and the
publish fast path's answer to an unexpected error. Real clients aimed at a closed port
stand in for an unreachable Kafka."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest
from fastapi import FastAPI

from dwell.adapters import kafka
from dwell.admission.app import PublishFastPath
from dwell.admission.publish import Deliveries

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


def test_the_fast_path_answers_an_unexpected_error_with_a_500_and_no_trace() -> None:
    async def handle(*_: object) -> tuple[int, bytes, dict[str, str] | None]:
        raise KeyError("secret detail")

    app = PublishFastPath(FastAPI(), handle)

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://admission") as client:
            return await client.post("/topics/persistent/a/b/c", content=b"{}")

    got = asyncio.run(post())
    assert got.status_code == 500
    assert orjson.loads(got.content) == {
        "reason": "internal error (KeyError); see the service log"}
    assert b"secret" not in got.content
