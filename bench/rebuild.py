"""How long the tracker takes to rebuild a lost index (docs/internals.md, "Losing Redis"):
a delay log with N pending delayed messages (delays uniform over an hour, 4 partitions)
is indexed by the tracker's own ingest loop, the low watermarks are committed, a
quarter of the messages are drained and marked delivered, Redis is flushed, and the
same loop rebuilds the index: re-reads the log from the low watermarks, skips what was
delivered, indexes the rest. Printed next to a plain consume of the same records by the
same client in the same process (the floor a rebuild cannot beat).

    .venv/bin/python bench/rebuild.py                     # 1,000,000 messages
    .venv/bin/python bench/rebuild.py --messages 200000
    .venv/bin/python bench/rebuild.py --messages 200000 --spread-ms 2592000000  # 30 days

Redis is a server of its own; Kafka is the test profile's (`make test` starts it; or set
DWELL_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
import uuid

import numpy as np
from tracker import BATCH, PARTITIONS, T0, start_redis

import devstack
from dwell import keys
from dwell.adapters.kafka import BulkProducer, Consumer, Producer, ensure_topic
from dwell.adapters.redis import connect
from dwell.index.topic import TopicIndex
from dwell.tracker.ingest import HEADERS
from dwell.tracker.ingest_loop import IngestLoop
from dwell.tracker.recovery import LowmarkKeeper, mark_record, write_marks

TOPICS = 8
# Buckets per claim, as the drain's default round (dwell_spark.settings.drain_max_buckets).
DRAIN_ROUND = 100


def produce(bootstrap: str, log: str, n: int, rng: np.random.Generator,
            spread_ms: int) -> list[str]:
    ensure_topic(bootstrap, log, PARTITIONS)
    p = Producer(bootstrap, linger_ms=50, **{"batch.size": 1_000_000})
    deliver = T0 + rng.integers(0, spread_ms, size=n, dtype=np.int64)
    topics = [f"persistent://bench/ns/rebuild-{i}" for i in range(TOPICS)]
    for i, d in enumerate(deliver.tolist()):
        t = topics[i % TOPICS]
        p.send(log, b"x" * 100, t, {"dwell-deliver-at": str(d), "dwell-tick-time": "1000"},
               partition=i % PARTITIONS)
    p.flush(300)
    p.close()
    return topics


def consume_rate(bootstrap: str, log: str, n: int) -> float:
    c = Consumer(bootstrap, f"bench-raw-{uuid.uuid4().hex[:6]}", [log],
                 **{"fetch.max.bytes": 104857600, "queued.max.messages.kbytes": 262144})
    got, start = 0, None
    try:
        while got < n:
            recs = c.poll_columns(HEADERS, BATCH, 0.1)
            if len(recs) and start is None:
                start = time.perf_counter()
            got += len(recs)
    finally:
        c.close()
    assert start is not None
    return n / (time.perf_counter() - start)


def pending(r, topics: list[str]) -> int:
    return sum(sum(TopicIndex(r, t).counts().values()) for t in topics)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--spread-ms", type=int, default=3_600_000,
                    help="delays uniform over this long (30 days: 2592000000)")
    args = ap.parse_args()
    n = args.messages
    bootstrap = os.environ.get("DWELL_KAFKA_BOOTSTRAP", devstack.Stack("test").kafka_bootstrap)
    rng = np.random.default_rng(7)
    proc, url, d = start_redis()
    try:
        r = connect(url)
        log = f"bench.delayed.{uuid.uuid4().hex[:8]}"
        group = f"bench-trk-{uuid.uuid4().hex[:6]}"
        t = time.perf_counter()
        topics = produce(bootstrap, log, n, rng, args.spread_ms)
        print(f"produced {n:,} delayed messages in {time.perf_counter() - t:.1f}s", flush=True)
        raw = consume_rate(bootstrap, log, n)
        print(f"plain consume of the log: {raw:,.0f} msg/s", flush=True)

        loop = IngestLoop(connect(url), bootstrap, log, group, source=log, batch_max=BATCH,
                          redis_check_interval_ms=100)
        runner = threading.Thread(target=loop.run, daemon=True)
        runner.start()
        while loop.indexed < n:
            if not runner.is_alive():
                raise RuntimeError(f"ingest loop died: {loop.error}")
            time.sleep(0.01)
        ingest_s = time.perf_counter() - (loop.first_batch_at or 0)
        print(f"first ingest: {n / ingest_s:,.0f} msg/s", flush=True)

        # The drain takes the earliest quarter of the spread and marks it delivered, in
        # rounds of the drain's default size (DrainSettings.drain_max_buckets).
        marks = BulkProducer(bootstrap)
        drained = 0
        t = time.perf_counter()
        for topic in topics:
            idx = TopicIndex(r, topic)
            while claims := idx.claim(T0 + args.spread_ms // 4, DRAIN_ROUND, 600_000,
                                      strict=False):
                write_marks(marks, [mark_record(log, topic, b.bucket_start, b.positions)
                                    for b in claims])
                for b in claims:
                    idx.complete(b.bucket_start, b.lease_id)
                    drained += b.count()
        marks.close()
        print(f"drained {drained:,} in rounds of {DRAIN_ROUND} buckets in "
              f"{time.perf_counter() - t:.1f}s", flush=True)
        keeper = LowmarkKeeper(r, bootstrap, group, delayed_topic=log,
                               refiled_topic=f"{log}.refiled", interval_s=1)
        t = time.perf_counter()
        keeper.run_once()
        lowmark_s = time.perf_counter() - t
        left = n - drained
        print(f"drained and marked {drained:,}; {left:,} pending; low watermarks computed "
              f"in {lowmark_s:.2f}s", flush=True)

        before = loop.indexed
        r.flushdb()
        t = time.perf_counter()
        deadline = t + 600 + n / 20_000  # a slack under the ingest rate
        while True:
            ingested = {int(f): int(o) for f, o in r.hgetall(keys.INGESTED).items()}
            if not loop.rebuilding and loop.indexed - before >= left and ingested:
                break
            if time.perf_counter() > deadline or not runner.is_alive():
                raise RuntimeError(f"no rebuild: {loop.error}")
            time.sleep(0.01)
        rebuild_s = time.perf_counter() - t
        loop.stop()
        runner.join()
        got = pending(r, topics)
        per_million = rebuild_s * 1_000_000 / left
        print()
        print(f"{'pending messages':<44} {left:>12,}")
        print(f"{'rebuild (detect, read marks, re-read, index)':<44} {rebuild_s:>11.2f}s")
        print(f"{'rebuild time per million pending':<44} {per_million:>11.2f}s")
        print(f"{'rebuild rate (log records re-read)':<44} {n / rebuild_s:>10,.0f}/s")
        print(f"{'plain consume of the same log':<44} {raw:>10,.0f}/s")
        print(f"{'rebuild / plain consume':<44} {(n / rebuild_s) / raw:>12.2f}")
        print(f"{'positions in the rebuilt index':<44} {got:>12,}  "
              + ("ok" if got == left else f"MISMATCH (want {left:,})"))
        return 0 if got == left else 1
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
