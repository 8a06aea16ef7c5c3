"""A consumer working through a backlog gets a redelivery soon: the SDK fetches no more
than its receiver queue (plus a fetch per partition) ahead of `receive`, so a record the
drain writes to the subscription's retry topic waits behind that, not behind the whole
backlog librdkafka would otherwise have fetched."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.client import Consumer
from dwell.core.topics import TopicName, retry_topic

pytestmark = pytest.mark.integration

BACKLOG = 200_000
PARTITIONS = 4


@pytest.fixture(scope="module")
def tracker(services: Any) -> Iterator[Any]:
    svc = services.start("tracker")
    yield svc
    svc.stop()


def received_before_the_redelivery(kafka_bootstrap: str, tracker_url: str, topic: str,
                                   subscription: str, **settings: int) -> int:
    """Reads one message of ``topic``'s backlog, leaves the consumer a moment to fetch
    ahead, writes that message's redelivery as the drain does, and counts the backlog's
    messages received before it."""
    t = TopicName.parse(topic)
    c = Consumer(topic, subscription, initial_position="earliest", bootstrap=kafka_bootstrap,
                 tracker_url=tracker_url, **settings)
    try:
        first = c.receive(30)
        assert first is not None
        time.sleep(3)  # librdkafka's own read-ahead takes the whole backlog meanwhile
        p = kafka.Producer(kafka_bootstrap)
        p.send(retry_topic(t, subscription), first.value, headers={
            hdr.TOPIC: topic, hdr.MESSAGE_ID: first.message_id, hdr.REDELIVERY_COUNT: "1",
            hdr.SUBSCRIPTION: subscription}).result(10)
        p.close()
        ahead = 0
        while True:
            m = c.receive(30)
            assert m is not None, f"no redelivery after {ahead} messages"
            if m.redelivery_count == 1:
                assert m.message_id == first.message_id
                return ahead
            ahead += 1
    finally:
        c.close()


def test_a_redelivery_waits_behind_the_receiver_queue_not_the_backlog(
        kafka_bootstrap: str, tracker: Any, unique: str) -> None:
    topic = f"persistent://{unique}/ns/backlog"
    ready = TopicName.parse(topic).kafka_topic
    kafka.ensure_topic(kafka_bootstrap, ready, PARTITIONS)
    p = kafka.Producer(kafka_bootstrap, linger_ms=5)
    headers = [(hdr.TOPIC, topic.encode())]
    p.send_many([(ready, b"x" * 200, f"k{i}".encode(), headers, None)
                 for i in range(BACKLOG)]).result(120)
    p.close()
    # Pulsar's default of 1000, and what a fetch brings beyond it: up to 1 MiB a
    # partition, in whole producer batches (30,283 here, against 199,999 unbounded).
    bounded = received_before_the_redelivery(kafka_bootstrap, tracker.url, topic, "bounded")
    unbounded = received_before_the_redelivery(kafka_bootstrap, tracker.url, topic,
                                                "unbounded", receiver_queue_size=10_000_000)
    assert bounded < BACKLOG // 5 < BACKLOG // 2 < unbounded, (bounded, unbounded)
