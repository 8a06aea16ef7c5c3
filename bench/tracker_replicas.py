"""Tracker replicas: how the delay log's ingest splits over 1 and over 3 tracker processes
(`python -m dwell.tracker`, as the chart runs them), in one run against the test
profile's Redis (database 9, flushed) and Kafka.

For each replica count: a delay log of its own with ``--partitions`` partitions, the
trackers started on it (one consumer group) and waited for until the group is stable with
every replica holding partitions; then N records for ``--topics`` topics (each topic's
records keyed by its name, as admission writes them, due 1 h later plus up to
``--spread-s``, uniformly) written while the trackers are stopped (SIGSTOP), and timed
from SIGCONT, as each replica works through its partitions' backlog, until the trackers'
`dwell_tracker_ingested_total` add up to N. Prints, per replica, the messages it
indexed (its share) and the CPU seconds it spent from SIGCONT to the last indexed (utime +
stime of its process); and for the run, Redis's CPU seconds, messages indexed per
CPU-second of all trackers, and the positions the index holds as the trackers' index view
reads them (every message once).

    .venv/bin/python bench/tracker_replicas.py [--messages 600000] [--partitions 12]
        [--topics 200] [--replicas 1 3] [--spread-s 3600]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import ConsumerGroupState

from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.tracker.index_view import IndexView
from dwell_dev import devstack
from dwell_dev.benchkit import BENCH_REDIS_DB, Procs, load_avg, test_servers, wait_healthy
from dwell_dev.testkit import free_port, now_ms, redis_db_url

TICKS = os.sysconf("SC_CLK_TCK")
INGESTED = "dwell_tracker_ingested_total "
IDLE_S = 5.0


def cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def ingested(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(INGESTED):
                return int(float(line[len(INGESTED):]))
    return 0


def group_members(admin: Any, group: str) -> set[str]:
    desc = admin.describe_consumer_groups([group])[group].result(10)
    return {m.member_id for m in desc.members}


def wait_stable(bootstrap: str, group: str, log: str, members: int, procs: Procs,
                timeout: float = 120) -> None:
    """Until ``group`` is stable with ``members`` members holding partitions of ``log``."""
    admin = kafka.admin(bootstrap)
    deadline = time.monotonic() + timeout
    held: dict[str, list[int]] = {}
    state = None
    while time.monotonic() < deadline:
        procs.check()
        desc = admin.describe_consumer_groups([group])[group].result(10)
        state = desc.state
        held = {m.member_id: sorted(tp.partition for tp in m.assignment.topic_partitions
                                    if tp.topic == log) for m in desc.members}
        held = {m: ps for m, ps in held.items() if ps}
        if state == ConsumerGroupState.STABLE and len(held) == members:
            return
        time.sleep(0.5)
    raise RuntimeError(f"group {group}: not stable with {members} members reading {log} in "
                       f"{timeout:.0f} s ({state}; partitions held: {held})")


def write(bootstrap: str, log: str, names: list[str], n: int, spread_ms: int) -> float:
    """n records over the topics ``names``, keyed by topic, due 1 h from now plus up to
    ``spread_ms``; seconds it took."""
    rng = np.random.default_rng(7)
    which = rng.integers(0, len(names), size=n).tolist()
    due = (now_ms() + 3_600_000 + rng.integers(0, spread_ms, size=n)).tolist()
    keys_ = [name.encode() for name in names]
    records = [(log, b"x" * 100, keys_[w], [("dwell-deliver-at", str(d).encode()),
                                            ("dwell-tick-time", b"1000")], None)
               for w, d in zip(which, due, strict=True)]
    p = kafka.Producer(bootstrap, linger_ms=50, **{"batch.size": 1_000_000})
    t = time.monotonic()
    try:
        p.send_many(records).result(300)
    finally:
        p.close()
    return time.monotonic() - t


def run(st: devstack.Stack, redis_url: str, procs: Procs, replicas: int, n: int,
        partitions: int, topics: list[str], spread_ms: int,
        timeout: float) -> dict[str, float]:
    r = redis_adapter.connect(redis_url)
    r.flushdb()
    tag = uuid.uuid4().hex[:8]
    log, group = f"bench.replicas.{tag}", f"dwell-bench-replicas-{tag}"
    env = st.service_env() | {
        "DWELL_REDIS_URL": redis_url, "DWELL_DELAYED_TOPIC": log,
        "DWELL_TRACKER_GROUP_ID": group, "DWELL_DELAYED_TOPIC_PARTITIONS": str(partitions),
        "DWELL_REFILED_TOPIC_PARTITIONS": str(partitions), "DWELL_LOG_LEVEL": "info"}
    urls, pids = [], []
    for i in range(replicas):
        port = free_port()
        procs.start(f"tracker-{replicas}-{i}", ["-m", "dwell.tracker"],
                    env | {"DWELL_HTTP_PORT": str(port)})
        pids.append(procs.children[-1].pid)
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_healthy(procs, url, 120)
    wait_stable(st.kafka_bootstrap, group, log, replicas, procs)
    # What the trackers spend with nothing to index (stats, low watermarks, registry).
    idle = [cpu_s(p) for p in pids]
    time.sleep(IDLE_S)
    before = [cpu_s(p) for p in pids]
    idle_rate = sum(b - i for b, i in zip(before, idle, strict=True)) / IDLE_S
    redis_pid = st.pid("redis")
    # The records wait while the trackers are stopped (SIGSTOP): from SIGCONT on, each
    # indexes its partitions' backlog as fast as it can. A write longer than the group's
    # session timeout makes the group rebalance first (printed).
    admin = kafka.admin(st.kafka_bootstrap)
    members = group_members(admin, group)
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        written = write(st.kafka_bootstrap, log, topics, n, spread_ms)
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
    t0 = time.monotonic()
    redis_before = cpu_s(redis_pid) if redis_pid else 0.0
    deadline = t0 + timeout
    while (counts := [ingested(u) for u in urls]) and sum(counts) < n:
        procs.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{replicas} trackers: {sum(counts):,} of {n:,} indexed after "
                               f"{timeout:.0f} s")
        time.sleep(0.05)
    took = time.monotonic() - t0
    rebalanced = group_members(admin, group) != members
    cpu = [cpu_s(p) - b for p, b in zip(pids, before, strict=True)]
    redis_cpu = cpu_s(redis_pid) - redis_before if redis_pid else 0.0
    view = IndexView(r)
    held = sum(int(view.figures(t).counts.sum()) for t in topics)
    for i, (c, s) in enumerate(zip(counts, cpu, strict=True)):
        print(f"  tracker {i}: {c:9,} messages ({c / n:6.1%})  CPU {s:6.2f} s  "
              f"{c / s if s else 0:9,.0f} msg per CPU-second", flush=True)
    total_cpu = sum(cpu)
    errors = [line for c in procs.children if c.name.startswith(f"tracker-{replicas}-")
              for line in c.log.read_text(errors="replace").splitlines() if " ERROR " in line]
    print(f"  {replicas} tracker(s): {n:,} indexed in {took:.1f} s (written in {written:.1f} "
          f"s), {n / total_cpu:,.0f} msg per CPU-second of all trackers, CPU {total_cpu:.2f} "
          f"s (idle {idle_rate:.2f} CPU-s/s of all trackers; Redis {redis_cpu:.2f} s); index "
          f"holds {held:,} pending; {len(errors)} ERROR lines in their logs; the group "
          f"{'rebalanced' if rebalanced else 'did not rebalance'}", flush=True)
    for line in errors[:5]:
        print(f"    {line}")
    for c in procs.children[:]:
        if c.name.startswith(f"tracker-{replicas}-"):
            c.stop()
            procs.children.remove(c)
    kafka.delete_topic(st.kafka_bootstrap, log)
    kafka.delete_topic(st.kafka_bootstrap, f"{log}.refiled")
    return {"per_cpu_s": n / total_cpu, "errors": len(errors), "took": took,
            "share_max": max(counts) / n, "share_min": min(counts) / n, "pending": held}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=600_000)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--topics", type=int, default=200)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--spread-s", type=int, default=3600,
                    help="delays spread uniformly over this many seconds after 1 h")
    ap.add_argument("--timeout-s", type=float, default=600)
    args = ap.parse_args()
    st = devstack.Stack("test")
    redis_url = redis_db_url(st, BENCH_REDIS_DB)
    topics = [f"persistent://bench/ns/t{i}" for i in range(args.topics)]
    tmp = Path(tempfile.mkdtemp(prefix="dwell-bench-replicas-"))
    procs = Procs(tmp)
    ok = False
    with test_servers(st):
        try:
            print(f"{args.messages:,} messages over {args.topics} topics, due 1 h + up to "
                  f"{args.spread_s:,} s, a delay log of {args.partitions} partitions "
                  f"({load_avg()})", flush=True)
            got = {}
            for k in args.replicas:
                got[k] = run(st, redis_url, procs, k, args.messages, args.partitions, topics,
                             args.spread_s * 1000, args.timeout_s)
            base = got[args.replicas[0]]
            for k, g in got.items():
                print(f"{k} tracker(s): {g['per_cpu_s']:9,.0f} msg per CPU-second "
                      f"({g['per_cpu_s'] / base['per_cpu_s']:.2f} of {args.replicas[0]}), "
                      f"shares {g['share_min']:.1%}-{g['share_max']:.1%}, "
                      f"{g['took']:.1f} s, index holds {g['pending']:,}")
                if g["errors"]:
                    raise RuntimeError(f"{k} trackers: {g['errors']} ERROR lines in the logs")
                if g["pending"] != args.messages:
                    raise RuntimeError(f"{k} trackers: the index holds {g['pending']:,} "
                                       f"messages, not {args.messages:,}")
            ok = True
        finally:
            procs.stop_all()
            redis_adapter.connect(redis_url).flushdb()
            if ok:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                print(f"logs kept in {tmp}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
