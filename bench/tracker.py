"""Tracker benchmark: Redis bytes per delayed message, ingest rates and claim latency of
dwell's shared Roaring index, against Pulsar's per-subscription model (one ZSET per
subscription, `ledger:entry` -> deliverAt), all measured in one run.

    .venv/bin/python bench/tracker.py [--messages 1000000]

Uses a private redis-server (started and stopped here, so other work on the machine
neither skews nor is skewed by MEMORY USAGE) and the Kafka at DWELL_KAFKA_BOOTSTRAP, or
else the test profile's (started unless it runs, and stopped after). Writes
bench/out/tracker-memory.png.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import redis as redislib

from dwell import keys, memory
from dwell.adapters.kafka import Consumer, Producer, ensure_dwell_topics, ensure_topic
from dwell.adapters.redis import connect
from dwell.core.subscriptions import SubscriptionSettings
from dwell.index import bucket_index, subscriptions
from dwell.index.topic import REPLACED_FIELD, TopicIndex, append_positions
from dwell.tracker.ingest import HEADERS
from dwell.tracker.ingest_loop import IngestLoop
from dwell_dev import devstack
from dwell_dev.benchkit import test_servers
from dwell_dev.procs import Child
from dwell_dev.testkit import free_port

OUT = Path(__file__).parent / "out"
PARTITIONS = 4
TICK = 1000
BATCH = 50_000
T0 = 1_900_000_000_000


def start_redis() -> tuple[Child, str, str]:
    port = free_port()
    d = tempfile.mkdtemp(prefix="dwell-bench-redis-")
    child = Child.spawn("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no", "--dir", d],
                        Path(d) / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    r = connect(url)

    def answers() -> bool:
        try:
            return bool(r.ping())
        except redislib.RedisError:
            return False
    child.wait_until(answers, 5, "answering", poll_s=0.05)
    return child, url, d


def workload(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Columns (partition, offset, deliverAt, tick) in arrival order."""
    i = np.arange(n, dtype=np.int64)
    parts = i % PARTITIONS
    offs = i // PARTITIONS  # contiguous offsets per partition
    if kind == "fixed":
        # 10,000 msg/s for 100 s, every message delayed by exactly 10 minutes
        deliver = T0 + i // 10 + 600_000
    else:
        deliver = T0 + rng.integers(0, 3_600_000, size=n, dtype=np.int64)
    return parts, offs, deliver, np.full(n, TICK, dtype=np.int64)


def index_only(url: str, topic: str, cols: tuple[np.ndarray, ...]) -> dict[str, float]:
    r = connect(url)
    n = len(cols[0])
    t = time.perf_counter()
    for s in range(0, n, BATCH):
        pipe = r.pipeline(transaction=False)
        append_positions(pipe, bucket_index.scripts(r), topic, *(c[s:s + BATCH] for c in cols))
        pipe.execute()
    append_s = time.perf_counter() - t
    idx = TopicIndex(r, topic)
    t = time.perf_counter()
    while idx.compact(2000):
        pass
    compact_s = time.perf_counter() - t
    return {"append_rate": n / append_s, "compact_rate": n / compact_s,
            "ingest_rate": n / (append_s + compact_s)}


def index_bytes(url: str, topic: str) -> int:
    from dwell import keys
    return TopicIndex(connect(url), topic).memory_bytes(extra=[keys.stats(topic)])


def claim_10k(url: str, topic: str) -> tuple[float, int]:
    """Claim the earliest buckets holding >= 10,000 messages; (ms, messages)."""
    r = connect(url)
    idx = TopicIndex(r, topic)
    counts = idx.counts()
    need, nb = 0, 0
    for _, c in sorted(counts.items()):
        need += c
        nb += 1
        if need >= 10_000:
            break
    t = time.perf_counter()
    claimed = idx.claim(T0 + 10 * 3_600_000, nb, 60_000, strict=False)
    ms = (time.perf_counter() - t) * 1000
    return ms, sum(c.count() for c in claimed)


def zset_baseline(url: str, cols: tuple[np.ndarray, ...], copies: int) -> dict[str, float]:
    """Pulsar's model: each subscription keeps its own ZSET of `ledger:entry` -> deliverAt."""
    r = connect(url)
    parts, offs, deliver, _ = cols
    n = len(parts)
    t = time.perf_counter()
    for s in range(0, n, BATCH):
        members = {f"{p}:{o}": d for p, o, d in zip(parts[s:s + BATCH].tolist(),
                                                    offs[s:s + BATCH].tolist(),
                                                    deliver[s:s + BATCH].tolist(), strict=True)}
        r.zadd("ledger:sub0", members)
    rate = n / (time.perf_counter() - t)
    for c in range(1, copies):
        r.copy("ledger:sub0", f"ledger:sub{c}")
    one = r.memory_usage("ledger:sub0", samples=0)
    total = sum(r.memory_usage(f"ledger:sub{c}", samples=0) for c in range(copies))
    # pop 10k due from one subscription's ZSET, as Pulsar's tracker would
    t = time.perf_counter()
    r.zpopmin("ledger:sub0", 10_000)
    pop_ms = (time.perf_counter() - t) * 1000
    r.delete(*[f"ledger:sub{c}" for c in range(copies)])
    return {"bytes_1": one / n, f"bytes_{copies}": total / n, "rate": rate, "pop_ms": pop_ms}


def raw_consume(bootstrap: str, topic: str, n: int) -> float:
    """Records/s of reading the n records of ``topic`` with `poll_columns`."""
    c = Consumer(bootstrap, f"bench-raw-{uuid.uuid4().hex[:6]}", [topic],
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


def end_to_end(url: str, bootstrap: str, n: int, rng: np.random.Generator,
               keyed: float = 0.0, one_partition: bool = False) -> dict[str, float]:
    """The ingest of n records from a delay log of its own against a raw consume of them,
    spread over its partitions or, as one topic's records are, on one. A share ``keyed``
    of the records carry a schedule key, each key twice: the second replaces the first
    (a cancel mark each, on the test stack's dwell.delivered)."""
    topic = f"bench.delayed.{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, PARTITIONS)
    if keyed:
        ensure_dwell_topics(bootstrap)  # dwell.delivered, for the cancel marks
    p = Producer(bootstrap, linger_ms=50, **{"batch.size": 1_000_000})
    deliver = T0 + rng.integers(0, 3_600_000, size=n, dtype=np.int64)
    t = time.perf_counter()
    ptopic = "persistent://bench/ns/e2e"
    with_key = (rng.random(n) < keyed).tolist()
    sent_keys = 0
    for i, d in enumerate(deliver.tolist()):
        headers = {"dwell-deliver-at": str(d), "dwell-tick-time": "1000"}
        if with_key[i]:
            headers["dwell-schedule-key"] = f"k{sent_keys // 2}"
            sent_keys += 1
        # A topic's records sit on one partition, as the delay log's key puts them.
        p.send(topic, b"x" * 100, ptopic, headers, partition=0 if one_partition else i % PARTITIONS)
    p.flush(120)
    p.close()
    produce_rate = n / (time.perf_counter() - t)

    # Raw Kafka-client consume rate: same client and consumer settings, same batch size,
    # reading the same fields of every record the same way the ingest does; the faster
    # of a plain program and one with the cyclic collector paused, as the ingest polls.
    raw_rate = raw_consume(bootstrap, topic, n)
    with memory.cycles_paused():
        raw_rate = max(raw_rate, raw_consume(bootstrap, topic, n))

    # The service's own loop (poll thread + Redis writer thread, compaction every second),
    # timed from its first polled batch until Redis has every position.
    loop = IngestLoop(connect(url), bootstrap, topic, f"bench-trk-{uuid.uuid4().hex[:6]}",
                      batch_max=BATCH, compaction_interval_ms=1000)
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()
    while loop.indexed < n:
        if not runner.is_alive():
            raise RuntimeError(f"ingest loop died: {loop.error}")
        time.sleep(0.005)
    ingest_s = time.perf_counter() - loop.first_batch_at
    loop.stop()
    runner.join()
    t = time.perf_counter()
    while loop.ingest.compact(2000):
        pass
    total_s = ingest_s + time.perf_counter() - t
    replaced = loop.ingest.redis.hget(keys.stats(ptopic), REPLACED_FIELD)
    return {"produce_rate": produce_rate, "raw_rate": raw_rate, "ingest_rate": n / ingest_s,
            "replaced": int(replaced or 0),
            "ingest_compacted_rate": n / total_s, "ratio": (n / ingest_s) / raw_rate,
            "ratio_compacted": (n / total_s) / raw_rate}


def plot(ours: dict[str, dict[int, float]], zset_per_sub: float, measured_subs: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    subs = [1, 10, 100, 1000]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, series in ours.items():
        xs = sorted(series)
        ax.plot(xs, [series[x] for x in xs], marker="o", label=f"dwell shared index ({kind})")
    ax.plot(subs, [zset_per_sub * s for s in subs], "--", marker="s", color="tab:red",
            label="ZSET per subscription (Pulsar model)")
    ax.scatter(measured_subs, [zset_per_sub * s for s in measured_subs], color="tab:red",
               zorder=3, label="  measured points (rest linear)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("subscriptions")
    ax.set_ylabel("Redis bytes per delayed message")
    ax.set_title("1,000,000 delayed messages, 4 partitions, tick 1 s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    OUT.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT / "tracker-memory.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--zset-copies", type=int, default=10)
    args = ap.parse_args()
    if "DWELL_KAFKA_BOOTSTRAP" in os.environ:
        measure(args, os.environ["DWELL_KAFKA_BOOTSTRAP"])
        return
    stack = devstack.Stack("test")
    with test_servers(stack):
        measure(args, stack.kafka_bootstrap)


def measure(args: argparse.Namespace, bootstrap: str) -> None:
    n = args.messages
    rng = np.random.default_rng(42)
    proc, url, d = start_redis()
    rows: list[tuple[str, str, str, str]] = []

    def row(what: str, value: str, target: str, ok: bool | None) -> None:
        verdict = "" if ok is None else ("MET" if ok else "MISSED")
        rows.append((what, value, target, verdict))
        print(f"{what:<58} {value:>16}   {target:<14} {verdict}", flush=True)

    try:
        r = connect(url)
        ours: dict[str, dict[int, float]] = {}
        results = {}
        for kind in ("fixed", "random"):
            topic = f"persistent://bench/ns/{kind}"
            cols = workload(kind, n, rng)
            rates = index_only(url, topic, cols)
            b = index_bytes(url, topic) / n
            results[kind] = (rates, b)
            target = 1 if kind == "fixed" else 5
            row(f"bytes/msg, {kind} delay", f"{b:.3f}", f"<= {target}", b <= target)
            ours[kind] = {}
            for subs in (1, 10, 1000):
                for s in range(subs):
                    subscriptions.put(r, topic, f"sub-{s}", SubscriptionSettings())
                bs = index_bytes(url, topic) / n
                ours[kind][subs] = bs
                reg = r.memory_usage(f"dwell:subs:{{{topic}}}", samples=0) / n
                row(f"bytes/msg, {kind}, {subs} subscriptions (+ settings {reg:.3f})",
                    f"{bs:.3f}", "= within 1%", abs(bs - b) <= 0.01 * b)
                r.delete(f"dwell:subs:{{{topic}}}")
            target_rate = 500_000 if kind == "fixed" else 150_000
            row(f"index-only ingest, {kind} (append deltas)", f"{rates['append_rate']:,.0f}/s",
                f">= {target_rate:,}", rates["append_rate"] >= target_rate)
            row(f"index-only ingest, {kind} (append + compaction)",
                f"{rates['ingest_rate']:,.0f}/s", f">= {target_rate:,}",
                rates["ingest_rate"] >= target_rate)
            row(f"compaction, {kind}", f"{rates['compact_rate']:,.0f}/s", "", None)
            ms, msgs = claim_10k(url, topic)
            row(f"claim of {msgs:,} due messages, {kind}", f"{ms:.1f} ms", "<= 20 ms", ms <= 20)
            r.flushdb()

        cols = workload("random", n, rng)
        zs = zset_baseline(url, cols, args.zset_copies)
        row("ZSET per subscription, bytes/msg, 1 sub", f"{zs['bytes_1']:.1f}", "", None)
        row(f"ZSET per subscription, bytes/msg, {args.zset_copies} subs (measured)",
            f"{zs[f'bytes_{args.zset_copies}']:.1f}", "", None)
        row("ZSET per subscription, ingest", f"{zs['rate']:,.0f}/s", "", None)
        row("ZSET per subscription, pop 10k due", f"{zs['pop_ms']:.1f} ms", "", None)
        per_sub = zs[f"bytes_{args.zset_copies}"] / args.zset_copies
        for kind in ("fixed", "random"):
            b = results[kind][1]
            r1 = zs["bytes_1"] / b
            r100 = per_sub * 100 / ours[kind][1]
            row(f"ZSET/dwell ratio, {kind}, 1 sub", f"{r1:,.0f}x", ">= 20x", r1 >= 20)
            row(f"ZSET/dwell ratio, {kind}, 100 subs (ZSET linear)", f"{r100:,.0f}x",
                ">= 2,000x", r100 >= 2000)
        r.flushdb()

        e2e = end_to_end(url, bootstrap, n, rng)
        row("Kafka produce (bench setup)", f"{e2e['produce_rate']:,.0f}/s", "", None)
        row("raw Kafka-client consume", f"{e2e['raw_rate']:,.0f}/s", "", None)
        row("end-to-end ingest from the delay log", f"{e2e['ingest_rate']:,.0f}/s", "", None)
        row("end-to-end ingest / raw consume", f"{e2e['ratio']:.2f}", ">= 0.8",
            e2e["ratio"] >= 0.8)
        row("end-to-end ingest incl. final compaction / raw consume",
            f"{e2e['ratio_compacted']:.2f}", ">= 0.8", e2e["ratio_compacted"] >= 0.8)
        r.flushdb()
        # The same with a fifth of the records keyed, each key twice. The baseline: the same
        # run without keys on one partition, as a topic's records are.
        plain = end_to_end(url, bootstrap, n, rng, one_partition=True)
        r.flushdb()
        keyed = end_to_end(url, bootstrap, n, rng, keyed=0.2, one_partition=True)
        row("end-to-end ingest, one partition, no keys", f"{plain['ingest_rate']:,.0f}/s", "",
            None)
        row("end-to-end ingest, one partition, 20% keyed (half replace)",
            f"{keyed['ingest_rate']:,.0f}/s; {keyed['replaced']:,} replaced", "", None)
        row("keyed / no keys", f"{keyed['ingest_rate'] / plain['ingest_rate']:.2f}", "", None)
        plot(ours, per_sub, [1, args.zset_copies])
        print(f"wrote {OUT / 'tracker-memory.png'}")
    finally:
        proc.stop(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
