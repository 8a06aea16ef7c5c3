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
    .venv/bin/python bench/rebuild.py --direct --topics 1 --producers 2 \
        --messages 100000000 --spread-ms 2592000000     # the 100M index of index_sparsity.py

`--direct` is for sizes too big to ingest twice: the log is written by several producer
processes, the quarter due first is marked delivered straight into `dwell.delivered` (one
mark a bucket, as the drain writes them), and the tracker group is committed at the log's
end with no low watermark. The tracker then starts on an empty Redis and rebuilds the
whole index from the log, as after losing Redis with nothing trimmed yet.

Redis is a server of its own; Kafka is the test profile's (`make test` starts it; or set
DWELL_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import threading
import time
import uuid

import numpy as np
from pyroaring import BitMap64
from tracker import BATCH, PARTITIONS, T0, TICK, raw_consume, start_redis

from dwell import keys
from dwell.adapters.kafka import (
    BulkProducer,
    Producer,
    end_offsets,
    ensure_topic,
    start_group_at_end,
)
from dwell.adapters.redis import connect
from dwell.core.buckets import bucket_starts
from dwell.core.positions import index_field
from dwell.index.marks import mark_record, write_marks
from dwell.index.topic import TopicIndex
from dwell.tracker.index_view import IndexView
from dwell.tracker.ingest_loop import IngestLoop
from dwell.tracker.recovery import LowmarkKeeper
from dwell_dev import devstack

TOPICS = 8
# Buckets per claim, as the drain's default round (dwell_spark.settings.drain_max_buckets).
DRAIN_ROUND = 100
# Records a producer process hands librdkafka at a time, and marks a write (--direct).
SEND_CHUNK = 100_000
MARK_CHUNK = 10_000
# Records the plain consume reads: the whole log up to this.
RAW_SAMPLE = 5_000_000
# Seconds between progress lines of a rebuild.
PROGRESS_S = 60


def produce(bootstrap: str, log: str, n: int, rng: np.random.Generator,
            spread_ms: int, topics: list[str]) -> None:
    ensure_topic(bootstrap, log, PARTITIONS)
    p = Producer(bootstrap, linger_ms=50, **{"batch.size": 1_000_000})
    deliver = T0 + rng.integers(0, spread_ms, size=n, dtype=np.int64)
    for i, d in enumerate(deliver.tolist()):
        t = topics[i % len(topics)]
        p.send(log, b"x" * 100, t, {"dwell-deliver-at": str(d), "dwell-tick-time": "1000"},
               partition=i % PARTITIONS)
    p.flush(300)
    p.close()


def partition_count(n: int, partition: int) -> int:
    """How many of ``n`` records one log partition holds (--direct)."""
    return n // PARTITIONS + (1 if partition < n % PARTITIONS else 0)


def partition_delays(n: int, partition: int, spread_ms: int) -> np.ndarray:
    """deliverAt of each record of one log partition, in offset order (--direct)."""
    rng = np.random.default_rng([7, partition])
    return T0 + rng.integers(0, spread_ms, size=partition_count(n, partition),
                             dtype=np.int64)


def produce_partitions(bootstrap: str, log: str, n: int, spread_ms: int, topics: list[str],
                       partitions: list[int]) -> None:
    """One producer process of --direct: the records of ``partitions``, each partition's
    in offset order (idempotent, so each lands at the offset it was sent for); the record
    at offset o names topic o % len(topics)."""
    p = BulkProducer(bootstrap, linger_ms=50, **{"batch.size": 1_000_000})
    value = b"x" * 100
    keys_ = [t.encode() for t in topics]
    tick = ("dwell-tick-time", str(TICK).encode())
    for part in partitions:
        deliver = partition_delays(n, part, spread_ms)
        for i in range(0, len(deliver), SEND_CHUNK):
            chunk = deliver[i:i + SEND_CHUNK].tolist()
            p.send_unreported(
                [(log, value, keys_[(i + j) % len(keys_)],
                  [("dwell-deliver-at", str(d).encode()), tick], None)
                 for j, d in enumerate(chunk)],
                partitions=[part] * len(chunk))
        p.flush(600)
    p.close()


def produce_direct(bootstrap: str, log: str, n: int, spread_ms: int, topics: list[str],
                   producers: int) -> None:
    ensure_topic(bootstrap, log, PARTITIONS)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=produce_partitions,
                         args=(bootstrap, log, n, spread_ms, topics,
                               list(range(k, PARTITIONS, producers))))
             for k in range(producers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a producer process exited with {proc.exitcode}")
    want = {p: partition_count(n, p) for p in range(PARTITIONS)}
    got = end_offsets(bootstrap, log)
    if got != want:
        raise RuntimeError(f"the log holds {got} records a partition, not {want}")


def mark_direct(bootstrap: str, log: str, n: int, spread_ms: int, topics: list[str]) -> int:
    """Mark the records due in the first quarter of the spread delivered, one
    `dwell.delivered` record per (topic, bucket) as the drain writes them; the count."""
    cutoff = T0 + spread_ms // 4
    cols = []
    for part in range(PARTITIONS):
        deliver = partition_delays(n, part, spread_ms)
        offs = np.flatnonzero(deliver < cutoff)
        cols.append((offs % len(topics), bucket_starts(deliver[offs], TICK),
                     np.full(len(offs), index_field(part, False)), offs))
    t, b, f, o = (np.concatenate(c) for c in zip(*cols, strict=True))
    order = np.lexsort((o, f, b, t))
    t, b, f, o = t[order], b[order], f[order], o[order]
    cut = np.flatnonzero((np.diff(t) != 0) | (np.diff(b) != 0)) + 1
    starts = np.concatenate(([0], cut)).tolist()
    ends = np.concatenate((cut, [len(t)])).tolist()
    marks = BulkProducer(bootstrap)
    batch = []
    for s, e in zip(starts, ends, strict=True):
        fs, os_ = f[s:e], o[s:e]
        fields = {int(x): BitMap64(os_[fs == x].tolist()) for x in np.unique(fs).tolist()}
        batch.append(mark_record(log, topics[int(t[s])], int(b[s]), fields))
        if len(batch) == MARK_CHUNK:
            write_marks(marks, batch, timeout_s=120)
            batch = []
    write_marks(marks, batch, timeout_s=120)
    marks.close()
    return len(t)


def pending(r, topics: list[str]) -> int:
    return sum(sum(TopicIndex(r, t).counts().values()) for t in topics)


def first_ingest_and_drain(r, bootstrap: str, log: str, group: str, n: int,
                           topics: list[str], spread_ms: int
                           ) -> tuple[IngestLoop, threading.Thread, int]:
    """Index the log with the tracker's ingest loop, drain the earliest quarter of the
    spread in the drain's rounds and mark it delivered, commit the low watermarks. The
    loop is left running; the count drained."""
    loop = IngestLoop(r, bootstrap, log, group, source=log, batch_max=BATCH,
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
        while claims := idx.claim(T0 + spread_ms // 4, DRAIN_ROUND, 600_000, strict=False):
            write_marks(marks, [mark_record(log, topic, b.bucket_start, b.positions)
                                for b in claims])
            for b in claims:
                idx.complete(b.bucket_start, b.lease_id)
                drained += b.count()
    marks.close()
    print(f"drained {drained:,} in rounds of {DRAIN_ROUND} buckets in "
          f"{time.perf_counter() - t:.1f}s", flush=True)
    keeper = LowmarkKeeper(IndexView(r), bootstrap, group, delayed_topic=log,
                           refiled_topic=f"{log}.refiled", interval_s=1)
    t = time.perf_counter()
    keeper.run_once()
    print(f"drained and marked {drained:,}; {n - drained:,} pending; low watermarks "
          f"computed in {time.perf_counter() - t:.2f}s", flush=True)
    return loop, runner, drained


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--spread-ms", type=int, default=3_600_000,
                    help="delays uniform over this long (30 days: 2592000000)")
    ap.add_argument("--topics", type=int, default=TOPICS)
    ap.add_argument("--direct", action="store_true",
                    help="write the log and the delivered marks directly and time only the "
                         "rebuild (for sizes too big to ingest twice)")
    ap.add_argument("--producers", type=int, default=2,
                    help="producer processes of --direct")
    args = ap.parse_args()
    n = args.messages
    bootstrap = os.environ.get("DWELL_KAFKA_BOOTSTRAP", devstack.Stack("test").kafka_bootstrap)
    rng = np.random.default_rng(7)
    topics = [f"persistent://bench/ns/rebuild-{i}" for i in range(args.topics)]
    proc, url, d = start_redis()
    try:
        r = connect(url)
        log = f"bench.delayed.{uuid.uuid4().hex[:8]}"
        group = f"bench-trk-{uuid.uuid4().hex[:6]}"
        t = time.perf_counter()
        if args.direct:
            produce_direct(bootstrap, log, n, args.spread_ms, topics, args.producers)
        else:
            produce(bootstrap, log, n, rng, args.spread_ms, topics)
        print(f"produced {n:,} delayed messages in {time.perf_counter() - t:.1f}s", flush=True)
        raw = raw_consume(bootstrap, log, min(n, RAW_SAMPLE))
        print(f"plain consume of the log: {raw:,.0f} msg/s", flush=True)

        if args.direct:
            t = time.perf_counter()
            drained = mark_direct(bootstrap, log, n, args.spread_ms, topics)
            print(f"marked {drained:,} delivered in {time.perf_counter() - t:.1f}s", flush=True)
            start_group_at_end(bootstrap, group, [log])
            before = 0
            loop = IngestLoop(connect(url), bootstrap, log, group, source=log, batch_max=BATCH,
                              redis_check_interval_ms=100)
            runner = threading.Thread(target=loop.run, daemon=True)
            t = time.perf_counter()
            runner.start()
        else:
            loop, runner, drained = first_ingest_and_drain(r, bootstrap, log, group, n, topics,
                                                           args.spread_ms)
            before = loop.indexed
            r.flushdb()
            t = time.perf_counter()
        left = n - drained
        deadline = t + 600 + n / 20_000  # a slack under the ingest rate
        shown = t
        while True:
            if time.perf_counter() - shown > PROGRESS_S:
                shown = time.perf_counter()
                print(f"  rebuilding: {loop.indexed - before:,} of {left:,} indexed after "
                      f"{shown - t:.0f}s", flush=True)
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
        print(f"{'Redis used_memory after the rebuild':<44} "
              f"{r.info('memory')['used_memory'] / 2**30:>10.2f} GiB")
        print(f"{'positions in the rebuilt index':<44} {got:>12,}  "
              + ("ok" if got == left else f"MISMATCH (want {left:,})"))
        return 0 if got == left else 1
    finally:
        proc.stop(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
