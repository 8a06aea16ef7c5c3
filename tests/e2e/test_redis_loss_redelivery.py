"""A redelivery scheduled before Redis lost the subscriptions' redelivery indexes still
happens, on time and not before: the Spark app puts the backoff state's pending entries
back (dwell_spark.recovery). Runs on the package stack after the other e2e modules; the
FLUSHDB empties the database of the e2e tracker and Spark app, which rebuild what they
keep there (the topic index, the subscription registry, the redelivery indexes)."""

from __future__ import annotations

import time

from conftest import wait_for
from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.client import ExponentialRedeliveryBackoff, Producer
from dwell.index.redelivery import SubscriptionIndex

from .conftest import (
    Stack,
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
NACK = ExponentialRedeliveryBackoff(min_delay_ms=NACK_DELAY_MS, max_delay_ms=NACK_DELAY_MS,
                                    multiplier=2)


def test_nack_redelivery_survives_redis_flush(e2e: Stack) -> None:
    topic = make_topic(e2e, new_tenant())
    r = redis_adapter.connect(e2e.redis_url)
    idx = SubscriptionIndex(r, topic, "work")
    c = consumer(e2e, topic, "work", negative_ack_redelivery_backoff=NACK)
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"job", key="j")
        first = receive_one(c, 20)
        assert (first.msg.message_id, first.msg.redelivery_count) == (mid, 0)
        nacked_from = now_ms()  # the SDK stamps the nack's ts after this
        c.negative_acknowledge(first.msg)
        nacked_by = now_ms()
        # The backoff has written the redelivery into the index (its count first, then the
        # entry): the loss takes it away.
        wait_for(lambda: idx.buckets() and r.hget(keys.sub_counts(topic, "work"), mid),
                 BATCH_WAIT_S, "the nack's redelivery in the index")
        log_before = e2e.spark.log.read_text(errors="replace") if e2e.spark.log else ""
        r.flushdb()
        flushed = now_ms()
        # Put back while it is still pending (well before its due time).
        wait_for(idx.buckets, BATCH_WAIT_S, "the redelivery index rebuilt from the backoff state")
        rebuilt = now_ms()
        assert r.hget(keys.sub_counts(topic, "work"), mid) == b"1"

        copy = receive_one(c, (NACK_DELAY_MS + redelivery_margin_ms(NACK_DELAY_MS)) / 1000 + 5)
        assert (copy.msg.message_id, copy.msg.redelivery_count) == (mid, 1)
        early_by = nacked_from + NACK_DELAY_MS - copy.after
        # Due at the nack + the delay; put back (if the box was slow) possibly after that.
        late_by = copy.before - max(nacked_by + NACK_DELAY_MS, rebuilt)
        print(f"redis flushed {flushed - nacked_by} ms after the nack; index rebuilt "
              f"{rebuilt - flushed} ms after the flush; redelivery {copy.after - nacked_from} "
              f"ms after the nack (due {NACK_DELAY_MS})")
        assert early_by <= 0, f"redelivered {early_by} ms early"
        assert late_by <= redelivery_margin_ms(NACK_DELAY_MS), f"{late_by} ms late"
        c.acknowledge(copy.msg)
        # Once: no second copy of it.
        time.sleep(2)
        again = c.receive(1.0)
        assert again is None, again
        assert e2e.spark.log is not None
        log_after = e2e.spark.log.read_text(errors="replace")[len(log_before):]
        assert "redelivery indexes lost: rebuilt from the backoff state" in log_after
    finally:
        c.close()
