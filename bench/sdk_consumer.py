"""The SDK's Consumer reading a subscription, against a plain Kafka consumer reading the
same records, in one run:

(a) a plain consumer (dwell.adapters.kafka.Consumer) polls the N records of a ready topic;
(b) the SDK Consumer receives and acknowledges each, acknowledgements waiting for their
    `dwell.acks` event and commit (the default; `--strict-messages` of them, as it is
    slow);
(c) the same with `ack_group_time_ms=100` (events sent without waiting, offsets committed
    every 100 ms, as a Pulsar consumer groups its acknowledgements);
(d) (c) with an ack timeout, so each message also sends a `delivered` event;
(e) (d) fetching ahead as librdkafka does by itself (receiver_queue_size=10,000,000; the
    SDK's default is Pulsar's 1000).

Each SDK part reads a subscription of its own from the start of the topic. Prints msg/s
and the ratio to (a). Starts the test profile's Redis and Kafka unless they run (and
stops only what it started, unless DWELL_TEST_KEEP_SERVERS=1), and its own tracker, where
the subscriptions register.

    .venv/bin/python bench/sdk_consumer.py [--messages 20000] [--strict-messages 2000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dwell.adapters import kafka
from dwell.client import Consumer
from dwell.core.topics import TopicName
from dwell_dev import devstack
from dwell_dev.benchkit import Procs, load_avg, test_servers, wait_healthy
from dwell_dev.testkit import free_port

ACK_TIMEOUT_MS = 30_000


def plain(bootstrap: str, topic: str, n: int) -> float:
    c = kafka.Consumer(bootstrap, f"bench-{uuid.uuid4().hex}", auto_offset_reset="earliest")
    c.subscribe([topic])
    got, started = 0, time.monotonic()
    try:
        while got < n:
            got += len(c.poll(5000, 1.0))
            if time.monotonic() - started > 120:
                raise RuntimeError(f"plain consumer read {got} of {n} in 120 s")
        return got / (time.monotonic() - started)
    finally:
        c.close()


def sdk(bootstrap: str, tracker: str, topic: str, n: int, **kw: int) -> float:
    c = Consumer(topic, f"bench-{uuid.uuid4().hex[:8]}", bootstrap=bootstrap,
                 tracker_url=tracker, initial_position="earliest", **kw)
    got, started = 0, time.monotonic()
    try:
        while got < n:
            m = c.receive(10)
            if m is None:
                raise RuntimeError(f"SDK consumer {kw} got {got} of {n}")
            c.acknowledge(m)
            got += 1
        return got / (time.monotonic() - started)
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--strict-messages", type=int, default=2_000)
    args = ap.parse_args()
    st = devstack.Stack("test")
    with test_servers(st):
        return run(st, args.messages, min(args.strict_messages, args.messages))


def run(st: devstack.Stack, n: int, strict_n: int) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="dwell-bench-"))
    procs = Procs(tmp)
    kafka.ensure_dwell_topics(st.kafka_bootstrap)
    tracker = f"http://127.0.0.1:{free_port()}"
    procs.start("tracker", ["-m", "dwell.tracker"], st.service_env() | {
        "DWELL_HTTP_PORT": tracker.rsplit(":", 1)[1],
        "DWELL_TRACKER_GROUP_ID": f"dwell-tracker-bench-{uuid.uuid4().hex[:8]}"})
    ok = False
    try:
        wait_healthy(procs, tracker)
        topic = f"persistent://bench{uuid.uuid4().hex[:8]}/ns/t"
        ready = TopicName.parse(topic).kafka_topic
        kafka.ensure_topic(st.kafka_bootstrap, ready, 4)
        p = kafka.Producer(st.kafka_bootstrap, linger_ms=5)
        p.send_many([(ready, b"x" * 200, f"k{i}".encode(), [], None)
                     for i in range(n)]).result(60)
        p.close()
        print(f"{n:,} records of 200 B in a ready topic of 4 partitions; {load_avg()}",
              flush=True)
        base = plain(st.kafka_bootstrap, ready, n)
        rows = [("(a) plain Kafka consumer", n, base)]
        for name, count, kw in (
                ("(b) SDK, each ack waits (default)", strict_n, {}),
                ("(c) SDK, ack_group_time_ms=100", n, {"ack_group_time_ms": 100}),
                ("(d) (c) with an ack timeout", n,
                 {"ack_group_time_ms": 100, "ack_timeout_ms": ACK_TIMEOUT_MS}),
                ("(e) (d), librdkafka's read-ahead", n,
                 {"ack_group_time_ms": 100, "ack_timeout_ms": ACK_TIMEOUT_MS,
                  "receiver_queue_size": 10_000_000})):
            print(f"{name} ...", flush=True)
            rows.append((name, count, sdk(st.kafka_bootstrap, tracker, topic, count, **kw)))
        print()
        for name, count, rate in rows:
            print(f"{name:<36} {count:>7,} msgs {rate:>10,.0f} msg/s  "
                  f"{rate / base:6.3f} of plain")
        ok = True
        return 0
    finally:
        procs.stop_all()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs kept in {tmp}")


if __name__ == "__main__":
    sys.exit(main())
