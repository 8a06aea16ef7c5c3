"""A redelivery scheduled before Redis lost the subscriptions' redelivery indexes still
happens, on time and not before: the Spark app replays dwell.acks and puts the pending
entries back (dwell_spark.recovery). Runs on the package stack after the other e2e modules; the
FLUSHDB empties the database of the e2e tracker and Spark app, which rebuild what they
keep there (the topic index, the subscription registry, the redelivery indexes)."""

from __future__ import annotations

import time

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.client import ExponentialRedeliveryBackoff, Producer
from dwell.index.redelivery import SubscriptionIndex
from dwell_dev.testkit import wait_for

from .conftest import (
    Dwell,
    consumer,
    make_topic,
    new_tenant,
    now_ms,
    receive_one,
    redelivery_margin_ms,
)

NACK_DELAY_MS = 20000
# How long a backoff micro-batch may take to carry an event into the index, or a rebuild to
# run, on a loaded box (batches of 7 s were seen with the 2 cores shared).
BATCH_WAIT_S = 30
# The backoff may still be working through the events of the modules before (the crash
# test's 20,000 acks take minutes on this box): the first nack waits for that.
BACKLOG_WAIT_S = 240
NACK = ExponentialRedeliveryBackoff(min_delay_ms=NACK_DELAY_MS, max_delay_ms=NACK_DELAY_MS,
                                    multiplier=2)


def test_nack_redeliveries_survive_redis_flush(e2e: Dwell) -> None:
    topic = make_topic(e2e, new_tenant())
    r = redis_adapter.connect(e2e.redis_url)
    idx = SubscriptionIndex(r, topic, "work")

    def indexed(mid: str) -> bool:
        return bool(idx.buckets() and r.hget(keys.sub_counts(topic, "work"), mid))

    c = consumer(e2e, topic, "work", negative_ack_redelivery_backoff=NACK)
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mids = [p.send(b"job-a", key="a"), p.send(b"job-b", key="b")]
        nacked: dict[str, tuple[int, int]] = {}
        # The events of one subscription share a dwell.acks partition: once the first
        # nack is in the index, the backoff has caught up, and the second one is timed.
        for wait_s in (BACKLOG_WAIT_S, BATCH_WAIT_S):
            got = receive_one(c, 20)  # the two are on partitions of their own: any order
            mid = got.msg.message_id
            assert mid in mids and mid not in nacked and got.msg.redelivery_count == 0
            before = now_ms()  # the SDK stamps the nack's ts after this
            c.negative_acknowledge(got.msg)
            nacked[mid] = (before, now_ms())
            # Its count goes in first, then the entry: the loss takes both away.
            wait_for(lambda mid=mid: indexed(mid), wait_s, f"the nack of {mid} in the index")
        log_before = e2e.spark.log.read_text(errors="replace") if e2e.spark.log else ""
        r.flushdb()
        flushed = now_ms()
        wait_for(idx.buckets, BATCH_WAIT_S, "the redelivery index rebuilt from dwell.acks")
        rebuilt = now_ms()

        copies = {}
        deadline = time.monotonic() + (NACK_DELAY_MS + redelivery_margin_ms(NACK_DELAY_MS)
                                       ) / 1000 + 10
        while len(copies) < len(mids):
            copy = receive_one(c, max(0.1, deadline - time.monotonic()))
            assert copy.msg.message_id in mids and copy.msg.message_id not in copies, copy.msg
            assert copy.msg.redelivery_count == 1
            copies[copy.msg.message_id] = copy
            c.acknowledge(copy.msg)
        for mid, copy in copies.items():
            nacked_from, nacked_by = nacked[mid]
            early_by = nacked_from + NACK_DELAY_MS - copy.after
            # Due at the nack + the delay; put back (on a slow box) possibly after that.
            late_by = copy.before - max(nacked_by + NACK_DELAY_MS, rebuilt)
            print(f"{mid}: redis flushed {flushed - nacked_by} ms after its nack; index "
                  f"rebuilt {rebuilt - flushed} ms after the flush; redelivered "
                  f"{copy.after - nacked_from} ms after the nack (due {NACK_DELAY_MS})")
            assert early_by <= 0, f"{mid} redelivered {early_by} ms early"
            assert late_by <= redelivery_margin_ms(NACK_DELAY_MS), f"{mid}: {late_by} ms late"
        # Once each: no second copy.
        time.sleep(2)
        again = c.receive(1.0)
        assert again is None, again
        assert e2e.spark.log is not None
        log_after = e2e.spark.log.read_text(errors="replace")[len(log_before):]
        assert "redelivery indexes lost: rebuilt from dwell.acks" in log_after
    finally:
        c.close()
