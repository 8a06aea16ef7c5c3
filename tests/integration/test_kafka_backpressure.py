"""The producers' local queue filling up, against the real Kafka: a send that finds the
queue full serves the delivery reports that empty it, and gives up (KafkaUnavailable)
once its deadline passes instead of waiting forever. A drain worker once sat for good in
`send_unreported` of the report-less BulkProducer: it slept on a queue only `poll()`
would drain, and a 650,000-message bucket stopped every topic's delivery."""

from __future__ import annotations

import threading

import pytest

from dwell.adapters import kafka

pytestmark = pytest.mark.integration


def _within(seconds: float, fn) -> None:
    """Run ``fn`` on a thread and fail if it does not return within ``seconds`` (a hang
    must fail the test, not the suite)."""
    err: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            err.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still sending after {seconds}s: the queue was never drained"
    if err:
        raise err[0]


def test_bulk_producer_sends_far_more_than_its_queue_holds(kafka_bootstrap: str,
                                                           unique: str) -> None:
    topic = f"bp-{unique}"
    kafka.ensure_topic(kafka_bootstrap, topic, 2)
    p = kafka.BulkProducer(kafka_bootstrap, **{"queue.buffering.max.messages": 1000})
    records = [(topic, b"x" * 50, None, None, None)] * 20_000
    try:
        _within(60, lambda: (p.send_unreported(records), p.flush(30)))
    finally:
        p.close(1.0)
    assert sum(kafka.end_offsets(kafka_bootstrap, topic).values()) == 20_000


def test_a_full_queue_that_never_drains_fails_by_its_deadline(kafka_bootstrap: str,
                                                              unique: str) -> None:
    """Kafka unreachable: nothing leaves the queue; the send raises within its deadline
    (the round fails into its lease retry) rather than spinning."""
    p = kafka.BulkProducer("127.0.0.1:1", **{"queue.buffering.max.messages": 100,
                                               "message.timeout.ms": 60000},
                           send_timeout_s=2.0)
    try:
        def send() -> None:
            with pytest.raises(kafka.KafkaUnavailable, match="queue full"):
                p.send_unreported([(f"bp-{unique}", b"x", None, None, None)] * 1000)
        _within(20, send)
    finally:
        p.close(0.1)
