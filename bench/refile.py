"""Re-filing at Kafka's speed (docs/internals.md, "Re-filing long, varied delays"): a burst
of N delayed messages of one topic, published flat out with delays uniform over 60-120 s
(so every chunk's records lie scattered over the whole burst), is indexed by the
tracker's own ingest loop; then the tracker's Restager re-files the burst chunk after
chunk, as it does 40 s before each chunk is due. Printed next to a plain
consume-and-produce of the same N records by the same clients with the same producer
settings, in the same process (what a copy of the log costs, the floor re-filing cannot
beat; the faster of a plain program and one with the cyclic collector paused, as the
restage's copy runs), and the ratio of the two.

    .venv/bin/python bench/refile.py                      # 1,000,000 messages
    .venv/bin/python bench/refile.py --messages 200000
    .venv/bin/python bench/refile.py --ahead-chunks 0     # each round its own chunk

Redis is a server of its own; Kafka is the test profile's (`make test` starts it; or set
DWELL_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time
import uuid

import numpy as np
from tracker import BATCH, start_redis

from dwell import memory
from dwell.adapters.kafka import BulkProducer, Consumer, Producer, ensure_topic
from dwell.adapters.redis import connect
from dwell.core.positions import format_message_id
from dwell.headers import MESSAGE_ID, ORIGIN
from dwell.index.topic import TopicIndex
from dwell.tracker.ingest_loop import IngestLoop
from dwell.tracker.restage import Restager
from dwell_dev import devstack

LEAD_MS, CHUNK_MS = 40_000, 20_000
# Ten minutes ahead: nothing comes due while the bench runs; rounds are given their `now`.
AHEAD_MS = 600_000
PAYLOAD = b"x" * 100


def produce(bootstrap: str, log: str, topic: str, n: int, first_at: int,
            rng: np.random.Generator) -> None:
    """N records of ``topic`` as admission writes them (one partition: a topic's records
    share one), due uniformly over [first_at, first_at + 60 s)."""
    ensure_topic(bootstrap, log, 1)
    ensure_topic(bootstrap, f"{log}.refiled", 1)
    p = Producer(bootstrap, linger_ms=50, **{"batch.size": 1_000_000})
    for i, at in enumerate((first_at + rng.integers(0, 60_000, size=n)).tolist()):
        p.send(log, PAYLOAD, topic, {"dwell-deliver-at": str(at), "dwell-tick-time": "1000",
                                     "dwell-topic": topic, "dwell-key": f"k{i}"})
    p.flush(600)
    p.close()


def plain_copy(bootstrap: str, log: str, n: int, target: str) -> float:
    """Records/s of reading the log's N records and writing each to ``target`` with the
    headers a re-filed copy adds, through the restage's producer settings."""
    ensure_topic(bootstrap, target, 1)
    c = Consumer(bootstrap, f"bench-plain-{uuid.uuid4().hex[:6]}", [log],
                 **{"fetch.max.bytes": 104857600, "queued.max.messages.kbytes": 262144})
    p = BulkProducer(bootstrap, linger_ms=5, **{"batch.size": 1 << 20})
    got, start = 0, None
    try:
        while got < n:
            msgs = c.poll_messages(10_000, 0.2)
            if msgs and start is None:
                start = time.perf_counter()
            out = []
            for m in msgs:
                hs = list(m.headers() or [])
                hs.append((MESSAGE_ID, format_message_id(log, 0, m.offset()).encode()))
                hs.append((ORIGIN, b"0:%d" % m.offset()))
                out.append((target, m.value(), m.key(), hs, None))
            p.send_unreported(out)
            got += len(msgs)
        p.flush()
    finally:
        c.close()
        p.close(5.0)
    assert start is not None
    return n / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--ahead-chunks", type=int, default=2,
                    help="chunks a large round takes after the due one "
                         "(DWELL_RESTAGE_AHEAD_CHUNKS; 0: one chunk a round)")
    args = ap.parse_args()
    n = args.messages
    bootstrap = os.environ.get("DWELL_KAFKA_BOOTSTRAP", devstack.Stack("test").kafka_bootstrap)
    proc, url, d = start_redis()
    try:
        r = connect(url)
        log = f"bench.delayed.{uuid.uuid4().hex[:8]}"
        topic = "persistent://bench/ns/refile"
        # The burst's first due time starts a chunk, so its 60 s are exactly 3 chunks.
        first_at = (int(time.time() * 1000) + AHEAD_MS) // CHUNK_MS * CHUNK_MS
        t = time.perf_counter()
        produce(bootstrap, log, topic, n, first_at, np.random.default_rng(7))
        print(f"produced {n:,} delayed messages in {time.perf_counter() - t:.1f}s", flush=True)

        loop = IngestLoop(connect(url), bootstrap, log, f"bench-trk-{uuid.uuid4().hex[:6]}",
                          source=log, batch_max=BATCH)
        runner = threading.Thread(target=loop.run, daemon=True)
        runner.start()
        while loop.indexed < n:
            if not runner.is_alive():
                raise RuntimeError(f"ingest loop died: {loop.error}")
            time.sleep(0.05)
        loop.stop()
        runner.join(30)
        print(f"indexed {n:,} in {sum(TopicIndex(r, topic).counts().values()):,} positions",
              flush=True)

        # The floor twice: as a plain program runs, and with the cyclic collector paused
        # as the restage's copy runs (dwell.memory.cycles_paused); the faster one counts.
        as_is = plain_copy(bootstrap, log, n, f"{log}.plain")
        with memory.cycles_paused():
            paused = plain_copy(bootstrap, log, n, f"{log}.plain-paused")
        plain = max(as_is, paused)
        print(f"plain consume-and-produce of the same records: {as_is:,.0f} records/s, "
              f"{paused:,.0f} with the cyclic collector paused", flush=True)

        rs = Restager(r, bootstrap, delayed_topic=log, refiled_topic=f"{log}.refiled",
                      lead_ms=LEAD_MS, chunk_ms=CHUNK_MS, lease_ms=600_000,
                      ahead_chunks=args.ahead_chunks)
        first_k = first_at // CHUNK_MS
        copied, busy = 0, 0.0
        try:
            # The first round notes the topic; each next one re-files the chunk it is due.
            rs.run_once(first_k * CHUNK_MS - LEAD_MS - CHUNK_MS)
            for k in range(first_k, first_k + 3):
                t = time.perf_counter()
                rnd = rs.run_once(k * CHUNK_MS - LEAD_MS)
                took = time.perf_counter() - t
                copied, busy = copied + rnd.records, busy + took
                print(f"chunk {k - first_k}: re-filed {rnd.records:,} records of "
                      f"{rnd.buckets} buckets ({rnd.ahead} chunks ahead) in {took:.1f}s "
                      f"({rnd.records / took:,.0f}/s)", flush=True)
        finally:
            rs.close()
        rate = copied / busy
        print(f"\nre-filed {copied:,} of {n:,} records in {busy:.1f}s: {rate:,.0f} records/s; "
              f"plain consume-and-produce {plain:,.0f}/s; ratio {rate / plain:.2f} "
              f"(target >= 0.5)")
        return 0 if copied == n else 1
    finally:
        proc.stop(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
