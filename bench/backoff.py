"""Backoff throughput: how fast the Spark app's backoff query turns `dwell.acks` events into
redelivery-index writes, against the test profile's Redis (database 9, flushed) and
Kafka. The app runs as its own process (`python -m dwell_spark`, a fresh checkpoint
reading dwell.acks from its end).

1. N `delivered` events with an ack timeout (600 s: nothing comes due), one per message,
   spread over ``--subscriptions`` subscriptions of one topic (each on a partition of
   dwell.acks of its own, as far as there are partitions), written to dwell.acks at once:
   timed from the first write until the subscriptions' redelivery counts in Redis hold
   all N (each one a schedule decision).
2. N `ack` events for the same messages: timed until the counts are empty again (each a
   cancel of the pending entry and an ack).
3. Baseline, in this process: the same 2N events read back from dwell.acks by a plain
   Kafka consumer (the raw consume rate of what the query reads).

Prints events/s of each phase and its ratio to the baseline, and the backoff's own
per-batch timings from the app's log (deciding, then writing, summed over the partitions'
batches).

4. With ``--restart-events N`` (after the phases; ``--events 0`` skips them): the restart.
   Every process of the app's session (its JVM and Python workers) is killed with SIGKILL,
   N `delivered` events for other messages of the subscription are written to dwell.acks
   while it is down, and the app is started again on the same checkpoint. Prints the time
   from the kill to "backoff ready", from "spark session up" to "backoff ready" (the app's
   log timestamps), and the catch-up: from ready until Redis holds all N redelivery counts,
   its events/s beside phase 1's, and how many counts are missing (lost).

    .venv/bin/python bench/backoff.py [--events 20000] [--subscriptions 1]
        [--master local[1]] [--max-events-per-batch N] [--restart-events 100000]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from delivery import ROOT

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics as names
from dwell_dev import devstack
from dwell_dev.benchkit import (
    BENCH_REDIS_DB,
    Procs,
    load_avg,
    send_ack_events,
    spark_env,
    wait_line,
)
from dwell_dev.testkit import redis_db_url

FAR_MS = 600_000  # an ack timeout nothing in the run reaches
BATCH_LINE = re.compile(r"backoff: (\d+) decisions from \d+ events.*decided in (\d+) ms, "
                        r"written in (\d+) ms")
SESSION_UP = "spark session up"
READY = "backoff ready"


def timed(what: str, start: float, done, procs: Procs, timeout: float) -> float:
    deadline = start + timeout
    while not done():
        procs.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - start


def subscription_names(topic: str, partitions: int, wanted: int) -> list[str]:
    """``wanted`` subscription names whose dwell.acks keys (`<topic>/<sub>`) the producer's
    partitioner (librdkafka's consistent one: CRC32 of the key) puts on different
    partitions, as far as there are partitions."""
    names_: list[str] = []
    taken: set[int] = set()
    i = 0
    while len(names_) < wanted:
        sub = f"s{i}"
        part = zlib.crc32(f"{topic}/{sub}".encode()) % partitions
        if part not in taken or len(taken) >= partitions:
            names_.append(sub)
            taken.add(part)
        i += 1
    return names_


def throughput(st: devstack.Stack, r: Any, procs: Procs, log: Path, topic: str,
               subs: list[str], ids: list[str], timeout: float) -> float:
    """Phases 1-3; returns phase 1's events/s."""
    counts = [keys.sub_counts(topic, s) for s in subs]
    n = len(ids)
    share = [ids[i::len(subs)] for i in range(len(subs))]
    starts = kafka.end_offsets(st.kafka_bootstrap, names.ACKS)

    def held() -> int:
        pipe = r.pipeline(transaction=False)
        for c in counts:
            pipe.hlen(c)
        return sum(pipe.execute())

    figures = []
    for kind, done in (("delivered", lambda: held() >= n), ("ack", lambda: held() == 0)):
        t0 = time.monotonic()
        senders = [threading.Thread(target=send_ack_events, args=(
            st.kafka_bootstrap, kind, topic, mine, FAR_MS, sub))
            for sub, mine in zip(subs, share, strict=True)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        sent = time.monotonic() - t0
        took = timed(kind, t0, done, procs, timeout)
        figures.append((kind, took))
        print(f"  {kind:9} {n / took:9,.0f} events/s ({took:.1f} s; written to "
              f"dwell.acks in {sent:.1f} s)", flush=True)
    t0 = time.monotonic()
    mine = {f"{topic}/{s}".encode() for s in subs}
    raw = [x for x in kafka.read_from(st.kafka_bootstrap, names.ACKS, starts) if x.key in mine]
    base = len(raw) / (time.monotonic() - t0)
    used = sorted({x.partition for x in raw})
    print(f"  baseline  {base:9,.0f} events/s (plain consumer, {len(raw):,} events read; "
          f"dwell.acks partitions used: {used})")
    for kind, took in figures:
        print(f"  {kind:9} / baseline: {n / took / base:.3f}")
    batches = [tuple(int(x) for x in m.groups())
               for m in BATCH_LINE.finditer(log.read_text(errors="replace"))]
    if batches:
        decided = sum(b[0] for b in batches)
        print(f"  the app's {len(batches)} batches with decisions: {decided:,} decisions; "
              f"deciding {sum(b[1] for b in batches) / decided * 1000:.1f} us, writing "
              f"{sum(b[2] for b in batches) / decided * 1000:.1f} us per decision (summed "
              "over the partitions' batches)")
    return n / figures[0][1]


def logged_at(log: Path, text: str) -> datetime:
    """The timestamp of the first line of ``log`` holding ``text``."""
    for line in log.read_text(errors="replace").splitlines():
        if text in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    raise RuntimeError(f"no '{text}' in {log}")


def restart(st: devstack.Stack, r: Any, procs: Procs, start_app: Callable[[str], Path],
            topic: str, subs: list[str], ids: list[str], full_rate: float | None,
            timeout: float) -> int:
    """Phase 4; returns how many of the ids have no redelivery count (lost)."""
    share = {sub: ids[i::len(subs)] for i, sub in enumerate(subs)}
    n = len(ids)

    def held() -> int:
        pipe = r.pipeline(transaction=False)
        for sub in subs:
            pipe.hlen(keys.sub_counts(topic, sub))
        return sum(pipe.execute())

    t_kill = time.monotonic()
    procs.kill("spark")
    killed = time.monotonic() - t_kill
    starts = kafka.end_offsets(st.kafka_bootstrap, names.ACKS)
    for sub, mine in share.items():
        send_ack_events(st.kafka_bootstrap, "delivered", topic, mine, FAR_MS, sub)
    sent = time.monotonic() - t_kill - killed
    print(f"  restart: app killed (JVM and workers gone) in {killed:.2f} s; {n:,} `delivered` "
          f"events written to dwell.acks while it was down, in {sent:.1f} s", flush=True)
    before = held()
    t_start = time.monotonic()
    log = start_app("spark-restarted")
    wait_line(procs, log, READY, timeout)
    t_ready = time.monotonic()
    at_ready = held() - before
    up_to_ready = (logged_at(log, READY) - logged_at(log, SESSION_UP)).total_seconds()
    print(f"  restart: kill -> backoff ready {t_ready - t_kill:.1f} s (app start -> ready "
          f"{t_ready - t_start:.1f} s; Spark session up -> ready {up_to_ready:.1f} s)", flush=True)
    deadline = t_ready + timeout
    while held() - before < n and time.monotonic() < deadline:
        procs.check()
        time.sleep(0.05)
    t_done = time.monotonic()
    caught_up = t_done - t_ready
    found: set[str] = set()
    for sub in subs:
        found |= {k.decode() for k in r.hkeys(keys.sub_counts(topic, sub))}
    lost = n - len(set(ids) & found)
    rate = (n - at_ready) / caught_up
    print(f"  restart: catch-up {caught_up:.1f} s after ready ({at_ready:,} counts written at "
          f"ready): {rate:,.0f} events/s" + (
              f", {rate / full_rate:.2f} of phase 1's {full_rate:,.0f}" if full_rate else "")
          + f"; kill -> all {n:,} counts {t_done - t_kill:.1f} s; lost {lost:,}",
          flush=True)
    t0 = time.monotonic()
    mine = {f"{topic}/{s}".encode() for s in subs}
    got = sum(1 for x in kafka.read_from(st.kafka_bootstrap, names.ACKS, starts)
              if x.key in mine)
    base = got / (time.monotonic() - t0)
    print(f"  restart: baseline {base:,.0f} events/s (plain consumer, {got:,} events read); "
          f"catch-up / baseline: {rate / base:.3f}", flush=True)
    return lost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20000,
                    help="messages (events per phase); 0 skips phases 1-3")
    ap.add_argument("--subscriptions", type=int, default=1,
                    help="subscriptions the messages are spread over (each on a partition "
                         "of dwell.acks of its own)")
    ap.add_argument("--max-events-per-batch", type=int, default=None,
                    help="the app's acks_max_events_per_batch (default: the setting's)")
    ap.add_argument("--master", default=None,
                    help="the app's Spark master, e.g. local[1] or local[2] (default: the "
                         "setting's, local[2])")
    ap.add_argument("--restart-events", type=int, default=0,
                    help="events waiting on a restart after kill -9 (phase 4; 0: none)")
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep the app's logs (printed path) after a run that succeeded")
    args = ap.parse_args()
    st = devstack.Stack("test")
    redis_url = redis_db_url(st, BENCH_REDIS_DB)
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

    def start_app(name: str) -> Path:
        # A restart keeps the checkpoint: the app resumes where the killed one stopped.
        return procs.start(name, ["-m", "dwell_spark"], spark_env(
            st, redis_url, tmp / "checkpoints") | (
            {} if args.max_events_per_batch is None else
            {"DWELL_ACKS_MAX_EVENTS_PER_BATCH": str(args.max_events_per_batch)}) | (
            {} if args.master is None else {"DWELL_SPARK_MASTER": args.master}),
            cwd=ROOT / "spark")

    ok = False
    try:
        log = start_app("spark")
        wait_line(procs, log, READY, 600)
        topic = f"persistent://bench{uuid.uuid4().hex[:8]}/ns/backoff"
        subs = subscription_names(topic, kafka.partition_count(st.kafka_bootstrap, names.ACKS),
                                  args.subscriptions)
        print(f"Spark app ready ({load_avg()}); {args.events:,} messages, master "
              f"{args.master or 'local[2]'}, subscriptions {subs}", flush=True)
        full_rate = None
        if args.events:
            full_rate = throughput(st, r, procs, log, topic, subs,
                                   [f"{names.DELAYED}:0:{i}" for i in range(args.events)],
                                   args.timeout_s)
        if args.restart_events:
            lost = restart(st, r, procs, start_app, topic, subs,
                           [f"{names.DELAYED}:0:{i}" for i in range(
                               args.events, args.events + args.restart_events)],
                           full_rate, args.timeout_s)
            if lost:
                raise RuntimeError(f"restart: {lost:,} of {args.restart_events:,} counts "
                                   "missing")
        ok = True
    finally:
        procs.stop_all()
        r.flushdb()
        if ok and not args.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs kept in {tmp}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
