"""A consumer with an ack timeout at Kafka's pace (issue 30): the SDK's Consumer reads a
subscription at --rate msg/s for --seconds, acknowledging 99% of what it receives and
dropping 1% (every message whose key ends in 00). The dropped ones must come back on
PIP-130's schedule: received + ackTimeout + the backoff's first delay. A message
acknowledged within ack_group_time_ms (100) sends one `dwell.acks` event, its ack; a
dropped one sends its delivered event after that time. The backoff in the Spark app takes
those events; its lag (dwell_backoff_lag_events) is printed each minute, and the events
per message received at the end.

The stack: the test profile's Redis (database 9, flushed) and Kafka, started unless they
run; a tracker and the Spark app (drain and backoff) as processes. The ready topic (4
partitions) is filled before the consumer starts with rate x seconds records of 200 B,
so the run measures the read path and the backoff, not a producer beside them.

Printed: the rate reached, the backoff's lag per minute, the dropped messages' lateness
against the schedule (negative: early), how many came back, were lost, or reached the
application twice (an acknowledged message received again, or one copy twice), and the
records the drain wrote to the retry topic (a redelivery the SDK filtered out shows there
as a record more than the dropped ones).

    .venv/bin/python bench/ack_timeout.py [--rate 20000] [--seconds 120]
        [--receiver-queue-size 1000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from delivery import pct, report_spark_log, start_dwell

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.client import Consumer, ExponentialRedeliveryBackoff, Message
from dwell.client.consumer import DEFAULT_RECEIVER_QUEUE_SIZE
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell_dev import devstack
from dwell_dev.benchkit import BENCH_REDIS_DB, Procs, gauge, load_avg, test_servers
from dwell_dev.testkit import now_ms, redis_db_url

ACK_TIMEOUT_MS = 10_000
BACKOFF = ExponentialRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=60_000, multiplier=2)
DROP_EVERY = 100  # 1%
FILL_CHUNK = 100_000


def backoff_lag(metrics_url: str) -> int:
    return gauge(metrics_url, "dwell_backoff_lag_events")


def fill(bootstrap: str, topic: str, n: int) -> None:
    """``n`` records in ``topic``'s ready topic, each with the header admission writes that
    names its topic (a redelivery of a record without it is refused as foreign)."""
    ready = TopicName.parse(topic).kafka_topic
    headers = [(hdr.TOPIC, topic.encode())]
    p = kafka.Producer(bootstrap, linger_ms=5)
    try:
        for lo in range(0, n, FILL_CHUNK):
            p.send_many([(ready, b"x" * 200, f"k{i:09d}".encode(), headers, None)
                         for i in range(lo, min(n, lo + FILL_CHUNK))]).result(120)
    finally:
        p.close()


def acks_events(bootstrap: str) -> int:
    return sum(kafka.end_offsets(bootstrap, names.ACKS).values())


def retry_records(bootstrap: str, retry: str) -> int:
    return sum(kafka.end_offsets(bootstrap, retry).values())


class Run:
    """What the consumer saw: first receipts, the dropped ones' redeliveries, repeats."""

    def __init__(self) -> None:
        self.received = 0  # first deliveries
        self.first_at: dict[str, int] = {}  # dropped message id -> first receipt (ms)
        self.late: list[int] = []  # redelivery - PIP-130's due time, ms
        self.acked: set[str] = set()
        self.copies: set[tuple[str, int]] = set()
        self.twice = 0

    def take(self, c: Consumer, m: Message) -> None:
        self.received += m.redelivery_count == 0
        if (m.message_id, m.redelivery_count) in self.copies or m.message_id in self.acked:
            self.twice += 1
        self.copies.add((m.message_id, m.redelivery_count))
        if m.redelivery_count == 0 and (m.key or "").endswith("00"):
            self.first_at[m.message_id] = now_ms()
            return  # dropped: comes back after the ack timeout
        if m.redelivery_count > 0:
            first = self.first_at.get(m.message_id)
            if first is not None:
                self.late.append(now_ms() - (first + ACK_TIMEOUT_MS + BACKOFF.next(0)))
        self.acked.add(m.message_id)
        c.acknowledge(m)

    def back(self) -> int:
        return sum(1 for mid in self.first_at if mid in self.acked)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=20_000, help="msg/s the consumer reads at")
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--receiver-queue-size", type=int, default=DEFAULT_RECEIVER_QUEUE_SIZE,
                    help="the Consumer's receiver_queue_size (default: the SDK's, "
                         f"{DEFAULT_RECEIVER_QUEUE_SIZE})")
    ap.add_argument("--keep-logs", action="store_true")
    args = ap.parse_args()
    st = devstack.Stack("test")
    with test_servers(st):
        return run(st, args.rate, args.seconds, args.receiver_queue_size, args.keep_logs)


def run(st: devstack.Stack, rate: int, seconds: int, queue: int,
        keep_logs: bool) -> int:
    redis_url = redis_db_url(st, BENCH_REDIS_DB)
    redis_adapter.connect(redis_url).flushdb()
    kafka.ensure_dwell_topics(st.kafka_bootstrap)
    tmp = Path(tempfile.mkdtemp(prefix="dwell-bench-"))
    procs = Procs(tmp)
    ok = False
    try:
        _svc, tracker, metrics_url = start_dwell(procs, st, redis_url, tmp, None)
        topic = f"persistent://bench{uuid.uuid4().hex[:8]}/ns/t"
        ready = TopicName.parse(topic).kafka_topic
        kafka.ensure_topic(st.kafka_bootstrap, ready, 4)
        n = rate * seconds
        t0 = time.monotonic()
        fill(st.kafka_bootstrap, topic, n)
        print(f"{n:,} records of 200 B in a ready topic of 4 partitions in "
              f"{time.monotonic() - t0:.0f} s; ackTimeout {ACK_TIMEOUT_MS} ms, first "
              f"redelivery {ACK_TIMEOUT_MS + BACKOFF.next(0)} ms after a receipt; "
              f"receiver_queue_size {queue}; "
              f"{load_avg()}", flush=True)
        c = Consumer(topic, "bench", ack_timeout_ms=ACK_TIMEOUT_MS,
                     ack_timeout_redelivery_backoff=BACKOFF, ack_group_time_ms=100,
                     initial_position="earliest", bootstrap=st.kafka_bootstrap,
                     tracker_url=tracker, receiver_queue_size=queue)
        seen = Run()
        events_before = acks_events(st.kafka_bootstrap)
        try:
            read_at_rate(c, seen, rate, n, metrics_url, procs)
            wait_redeliveries(c, seen, metrics_url, procs)
        finally:
            c.close()
        events = acks_events(st.kafka_bootstrap) - events_before
        print(f"  dwell.acks events {events:,}: {events / (n + len(seen.first_at)):.2f} a "
              "message received (a delivery acknowledged within ack_group_time_ms sends "
              "its ack alone)")
        retried = retry_records(st.kafka_bootstrap, c.retry_topic)
        dropped, back = len(seen.first_at), seen.back()
        early = sum(1 for x in seen.late if x < -1000)
        print(f"\n  dropped {dropped:,}, redelivered {back:,}, lost {dropped - back:,}, "
              f"received by the application twice {seen.twice}")
        print(f"  redelivery lateness against PIP-130's schedule: {pct(seen.late)}; "
              f"early by more than a tick (1 s): {early}")
        print(f"  records in the retry topic {retried:,} ({retried - back:,} more than the "
              "redeliveries the application received: filtered by the SDK)")
        ok = dropped == back and seen.twice == 0 and early == 0
        if not ok:
            print("  FAILED: a dropped message lost, early, or received twice")
        return 0 if ok else 1
    finally:
        report_spark_log(tmp)
        procs.stop_all()
        if ok and not keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"   logs kept in {tmp}")


def read_at_rate(c: Consumer, seen: Run, rate: int, n: int, metrics_url: str,
                 procs: Procs) -> None:
    """Receives ``n`` first deliveries, no faster than ``rate`` msg/s; prints the rate and
    the backoff's lag every minute."""
    start = time.monotonic()
    minute_start, minute_count, lags = start, 0, [backoff_lag(metrics_url)]
    next_lag = start + 5
    while seen.received < n:
        m = c.receive(10)
        if m is None:
            raise RuntimeError(f"nothing to receive after {seen.received:,} of {n:,}")
        seen.take(c, m)
        minute_count += 1
        if minute_count % 1000 == 0:
            now = time.monotonic()
            ahead = seen.received / rate - (now - start)
            if ahead > 0:
                time.sleep(ahead)
            if now >= next_lag:
                procs.check()
                lags.append(backoff_lag(metrics_url))
                next_lag = now + 5
            if now - minute_start >= 60:
                per_s = minute_count / (now - minute_start)
                print(f"  minute {round((now - start) / 60)}: {per_s:,.0f} msg/s, backoff "
                      f"lag {lags[-1]:,} events (max {max(lags):,}); "
                      f"{load_avg()}", flush=True)
                minute_start, minute_count, lags = now, 0, [lags[-1]]
    took = time.monotonic() - start
    print(f"  read {seen.received:,} in {took:.1f} s: {seen.received / took:,.0f} msg/s "
          f"(target {rate:,}); backoff lag now {backoff_lag(metrics_url):,} events",
          flush=True)


def wait_redeliveries(c: Consumer, seen: Run, metrics_url: str, procs: Procs) -> None:
    """Receives until every dropped message came back and the backoff has no lag, then one
    ack timeout more: an acknowledged message redelivered would show as received twice."""
    t0 = time.monotonic()
    deadline = t0 + 300
    settled_at: float | None = None
    while time.monotonic() < deadline:
        m = c.receive(0.5)
        if m is not None:
            seen.take(c, m)
            continue
        procs.check()
        if settled_at is None and seen.back() == len(seen.first_at) \
                and backoff_lag(metrics_url) == 0:
            settled_at = time.monotonic()
            print(f"  every dropped message back and the backoff's lag 0 after "
                  f"{settled_at - t0:.0f} s more", flush=True)
        if settled_at is not None and time.monotonic() - settled_at > \
                (ACK_TIMEOUT_MS + BACKOFF.next(0)) / 1000 + 5:
            return
    print(f"  waited {deadline - t0:.0f} s: {seen.back():,} of {len(seen.first_at):,} "
          f"dropped messages back, backoff lag {backoff_lag(metrics_url):,}")


if __name__ == "__main__":
    sys.exit(main())
