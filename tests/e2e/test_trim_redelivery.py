"""A consumer holds a message across the tracker's trim rounds, then nacks it: its
redelivery is copied from the message's record in the delay log, which the trim keeps
for DWELL_TRIM_KEEP_DELIVERED_MS after the low watermark passed it. A trim that cut at
the current low watermark deleted the record, and the drain reported the redelivery
lost."""

from __future__ import annotations

import re
import time

import httpx

from dwell.client import ExponentialRedeliveryBackoff, Producer
from dwell.core import topics as names
from dwell.core.positions import parse_message_id
from dwell.tracker.recovery import committed_lowmarks
from dwell_dev.testkit import wait_for

from .conftest import (
    Dwell,
    consumer,
    make_topic,
    new_tenant,
    receive_one,
    redelivery_margin_ms,
)

NACK_DELAY_MS = 500


def trim_rounds(e2e: Dwell) -> int:
    text = httpx.get(f"{e2e.tracker}/metrics", timeout=10).text
    found = re.search(r'^dwell_tracker_trim_rounds_total\{outcome="ok"\} ([0-9.e+]+)$', text,
                      re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def test_a_message_held_across_trim_rounds_is_redelivered(e2e: Dwell) -> None:
    topic = make_topic(e2e, new_tenant())
    c = consumer(e2e, topic, "held", negative_ack_redelivery_backoff=(
        ExponentialRedeliveryBackoff(NACK_DELAY_MS, NACK_DELAY_MS, 2.0)))
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"held", deliver_after=3000)
        first = receive_one(c, 60).msg
        assert first.message_id == mid
        log, part, off = parse_message_id(mid)
        assert log == names.DELAYED, mid
        # The low watermark passes the delivered record; then two trim rounds go by.
        wait_for(lambda: committed_lowmarks(e2e.bootstrap, e2e.tracker_group,
                                            [(log, part)])[(log, part)] > off,
                 30, "the low watermark committed past the delivered record")
        rounds = trim_rounds(e2e)
        wait_for(lambda: trim_rounds(e2e) >= rounds + 2, 30, "two trim rounds")
        nacked = time.monotonic()
        c.negative_acknowledge(first)
        again = receive_one(c, 30).msg
        waited_ms = (time.monotonic() - nacked) * 1000
        assert (again.message_id, again.redelivery_count, again.value) == (mid, 1, b"held")
        assert waited_ms <= NACK_DELAY_MS + redelivery_margin_ms(NACK_DELAY_MS), waited_ms
        c.acknowledge(again)
    finally:
        c.close()
