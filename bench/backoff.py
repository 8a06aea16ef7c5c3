"""Backoff throughput: how fast the Spark app's backoff query turns `dwell.acks` events into
redelivery-index writes, against the test profile's Redis (database 9, flushed) and
Kafka. The app runs as its own process (`python -m dwell_spark`, a fresh checkpoint
reading dwell.acks from its end).

1. N `delivered` events with an ack timeout (600 s: nothing comes due), one per message
   of one subscription, written to dwell.acks at once: timed from the first write until
   the subscription's redelivery counts in Redis hold all N (each one a schedule decision
   written by the driver).
2. N `ack` events for the same messages: timed until the counts are empty again (each a
   cancel of the pending entry and an ack).
3. Baseline, in this process: the same 2N events read back from dwell.acks by a plain
   Kafka consumer (the raw consume rate of what the query reads).

Prints events/s of each phase and its ratio to the baseline, and the backoff's own
per-batch timings from the app's log ("events and state", then writing: the index check and
applying the decisions).

    .venv/bin/python bench/backoff.py [--events 20000] [--state-partitions 1] [--state-shards 64]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from delivery import ROOT
from procs import BENCH_REDIS_DB, Procs, load_avg, send_ack_events, spark_env, wait_line

import devstack
from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics as names

FAR_MS = 600_000  # an ack timeout nothing in the run reaches
BATCH_LINE = re.compile(r"backoff: (\d+) decisions.*events and state (\d+) ms, written in "
                        r"(\d+) ms")


def timed(what: str, start: float, done, procs: Procs, timeout: float) -> float:
    deadline = start + timeout
    while not done():
        procs.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20000, help="messages (events per phase)")
    ap.add_argument("--state-partitions", type=int, default=1,
                    help="the app's state_partitions (shuffle partitions of the state)")
    ap.add_argument("--state-shards", type=int, default=64,
                    help="the app's backoff_state_shards (shards of a subscription's state)")
    ap.add_argument("--max-events-per-batch", type=int, default=None,
                    help="the app's acks_max_events_per_batch (default: the setting's)")
    ap.add_argument("--timeout-s", type=float, default=600)
    args = ap.parse_args()
    st = devstack.Stack("test")
    redis_url = st.redis_url.rsplit("/", 1)[0] + f"/{BENCH_REDIS_DB}"
    r = redis_adapter.connect(redis_url)
    try:
        r.flushdb()
    except Exception as exc:
        sys.exit(f"test profile's Redis not reachable at {redis_url} ({exc}); start the test "
                 "stack first (scripts/devstack.py up --profile test)")
    if not kafka.ping(st.kafka_bootstrap):
        sys.exit(f"test profile's Kafka not reachable at {st.kafka_bootstrap}")
    tmp = Path(tempfile.mkdtemp(prefix="dwell-bench-backoff-"))
    procs = Procs(tmp)
    ok = False
    try:
        log = procs.start("spark", ["-m", "dwell_spark"], spark_env(
            st, redis_url, tmp / "checkpoints") | {
            "DWELL_STATE_PARTITIONS": str(args.state_partitions),
            "DWELL_BACKOFF_STATE_SHARDS": str(args.state_shards)} | (
            {} if args.max_events_per_batch is None else
            {"DWELL_ACKS_MAX_EVENTS_PER_BATCH": str(args.max_events_per_batch)}),
            cwd=ROOT / "spark")
        wait_line(procs, log, "backoff ready", 600)
        print(f"Spark app ready ({load_avg()}); {args.events:,} messages, state_partitions "
              f"{args.state_partitions}, state shards {args.state_shards}", flush=True)
        topic = f"persistent://bench{uuid.uuid4().hex[:8]}/ns/backoff"
        counts = keys.sub_counts(topic, "s")
        ids = [f"{names.DELAYED}:0:{i}" for i in range(args.events)]
        starts = kafka.end_offsets(st.kafka_bootstrap, names.ACKS)
        figures = []
        for kind, done in (("delivered", lambda: r.hlen(counts) >= args.events),
                           ("ack", lambda: r.hlen(counts) == 0)):
            t0 = time.monotonic()
            send_ack_events(st.kafka_bootstrap, kind, topic, ids, FAR_MS)
            sent = time.monotonic() - t0
            took = timed(kind, t0, done, procs, args.timeout_s)
            figures.append((kind, took))
            print(f"  {kind:9} {args.events / took:9,.0f} events/s ({took:.1f} s; written to "
                  f"dwell.acks in {sent:.1f} s)", flush=True)
        t0 = time.monotonic()
        raw = [x for x in kafka.read_from(st.kafka_bootstrap, names.ACKS, starts)
               if x.key == f"{topic}/s".encode()]
        base = len(raw) / (time.monotonic() - t0)
        print(f"  baseline  {base:9,.0f} events/s (plain consumer, {len(raw):,} events read)")
        for kind, took in figures:
            print(f"  {kind:9} / baseline: {args.events / took / base:.3f}")
        batches = [tuple(int(x) for x in m.groups())
                   for m in BATCH_LINE.finditer(log.read_text(errors="replace"))]
        if batches:
            n = sum(b[0] for b in batches)
            print(f"  the app's {len(batches)} batches with decisions: {n:,} decisions; "
                  f"events and state {sum(b[1] for b in batches) / n * 1000:.0f} us, "
                  f"writing {sum(b[2] for b in batches) / n * 1000:.0f} us per decision")
        ok = True
    finally:
        procs.stop_all()
        r.flushdb()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs kept in {tmp}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
