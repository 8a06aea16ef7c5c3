"""adapters.kafka.iter_from on a real broker: a read goes on while records come, however
long it takes in all and however slow its caller (its timeout bounds a read that stops
moving on; a read of the whole topic under one deadline would fail here)."""

from __future__ import annotations

import time

import pytest

from dwell.adapters import kafka

pytestmark = pytest.mark.integration


def test_a_read_longer_than_its_timeout_goes_on_while_records_come(
        kafka_bootstrap: str, unique: str) -> None:
    topic = f"test.scan.{unique}"
    kafka.ensure_topic(kafka_bootstrap, topic, 2)
    p = kafka.Producer(kafka_bootstrap, linger_ms=20)
    futures = [p.send(topic, b"%d" % i, b"k%d" % (i % 7)) for i in range(3000)]
    for f in futures:
        f.result(30)
    p.close()
    got = []
    started = time.monotonic()
    for i, rec in enumerate(kafka.iter_from(kafka_bootstrap, topic, {}, timeout=1.0)):
        got.append(int(rec.value or b""))
        if i in (0, 1500):
            time.sleep(1.5)  # the caller's own time, past the timeout, twice
    assert time.monotonic() - started > 3.0
    assert sorted(got) == list(range(3000))



def test_offsets_at_or_past_a_partitions_end_are_passed_over_at_once(
        kafka_bootstrap: str, unique: str) -> None:
    """A span past the end (a messageId forged on dwell.acks) ends the read at once with
    what exists, instead of waiting for records that will never come."""
    topic = f"test.scan.{unique}"
    kafka.ensure_topic(kafka_bootstrap, topic, 1)
    p = kafka.Producer(kafka_bootstrap, linger_ms=0)
    for i in range(3):
        p.send(topic, b"%d" % i).result(30)
    p.close()
    consumer = kafka.Consumer(kafka_bootstrap, f"test-scan-{unique}")
    try:
        started = time.monotonic()
        got = [m.offset() for m in kafka.read_offsets(
            consumer, topic, {0: [1, 2, 3, 999_999]}, max_gap=2, timeout=20.0)]
        took = time.monotonic() - started
    finally:
        consumer.close()
    assert got == [1, 2]
    assert took < 10, f"the read waited {took:.1f} s for offsets that cannot exist"
