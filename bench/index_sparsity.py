"""The index's cost at realistic sparsity (issue 29): N pending positions of one topic,
delays uniform over 30 days of 1 s buckets (2,592,000 buckets), written to a Redis of
its own, and then measured. Two ways to fill it, giving the same keys and blobs:

- `--fill path`: the tracker's index write path (`append_positions`, the same Lua, then
  the same compaction into Roaring blobs); a few hundred µs a bucket, so hours at 30-day
  sparsity on 2 cores;
- `--fill direct` (default): the compacted index written as compaction leaves it (per
  bucket a HASH partition -> `roaring.encode(BitMap64)`, the index ZSET, the due hint,
  the tick), which the issue allows for 100,000,000 positions.

What is measured:

- Redis bytes per pending message: INFO memory `used_memory` after the fill and
  compaction, less before, over N; and MEMORY USAGE of the index's keys over N, the
  measure of docs/benchmarks.md's 0.029 / 4.54 B (fixed delays / uniform over 1 h);
- the claim of a due bucket, by the drain's path (`TopicIndex.claim`, claim-6.lua): one
  bucket, and a round of up to `--round-buckets` due buckets, each timed a few times.

    .venv/bin/python bench/index_sparsity.py --messages 100000000
    .venv/bin/python bench/index_sparsity.py --messages 1000000 --fill path

Redis is a private redis-server (started and stopped here); Kafka is not used."""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time

import numpy as np
from pyroaring import BitMap64
from tracker import PARTITIONS, T0, TICK, start_redis

from dwell import keys
from dwell.adapters.redis import connect
from dwell.index import bucket_index
from dwell.index.roaring import encode
from dwell.index.topic import TICK_FIELD, TopicIndex, append_positions

TOPIC = "persistent://bench/ns/sparse"
DAY_MS = 86_400_000
# Positions per append pipeline: the tracker's ingest batch is 50,000; larger batches
# only make the fill quicker (the blobs after compaction are the same).
FILL_BATCH = 1_000_000
# Bitmaps encoded and written at a time by the direct fill.
FILL_BITMAPS = 1_000_000


def used_memory(r) -> int:
    return int(r.info("memory")["used_memory"])


def fill(r, n: int, span_ms: int, rng: np.random.Generator) -> float:
    """Index n positions arriving in offset order (partition i % PARTITIONS), each due
    at a uniform time in [T0, T0 + span_ms); returns seconds taken."""
    scripts = bucket_index.scripts(r)
    t = time.perf_counter()
    for s in range(0, n, FILL_BATCH):
        i = np.arange(s, min(s + FILL_BATCH, n), dtype=np.int64)
        deliver = T0 + rng.integers(0, span_ms, size=len(i), dtype=np.int64)
        pipe = r.pipeline(transaction=False)
        append_positions(pipe, scripts, TOPIC, i % PARTITIONS, i // PARTITIONS, deliver,
                         np.full(len(i), TICK, dtype=np.int64))
        pipe.execute()
        if (s // FILL_BATCH) % 10 == 9:
            print(f"  appended {s + len(i):,} in {time.perf_counter() - t:.0f}s", flush=True)
    return time.perf_counter() - t


def encode_sparse(offsets: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
    """`encode(BitMap64(offsets[a:b]))` for each (a, b) of starts/ends, built with numpy:
    offsets ascending within each group and below 2^32. A group with three consecutive
    offsets (which run_optimize may store as a run) is encoded by `encode` itself; the
    rest are written in the portable format `encode` gives for array containers
    (u64 1, u32 0 for the one 32-bit bitmap; then cookie 12346, the container count,
    (key, cardinality - 1) u16 pairs, u32 offsets, the u16 values)."""
    n = len(offsets)
    groups = len(starts)
    counts = ends - starts
    grp = np.repeat(np.arange(groups), counts)
    hi = offsets >> 16
    first = np.zeros(n, dtype=bool)
    first[starts] = True
    new_container = first.copy()
    new_container[1:] |= hi[1:] != hi[:-1]
    cid = np.cumsum(new_container) - 1
    c_first = np.flatnonzero(new_container)  # each container's first element
    c_grp = grp[c_first]
    n_cont = np.bincount(c_grp, minlength=groups)
    cont_start = np.concatenate(([0], np.cumsum(n_cont)[:-1]))  # a group's first container
    card = np.bincount(cid)
    size = 20 + 8 * n_cont + 2 * counts
    base = np.concatenate(([0], np.cumsum(size)[:-1]))
    buf = np.zeros(int(size.sum()), dtype=np.uint8)

    def put(at: np.ndarray, value: np.ndarray, width: int) -> None:
        value = value.astype(np.uint64)
        for k in range(width):
            buf[at + k] = (value >> np.uint64(8 * k)) & np.uint64(0xFF)

    put(base, np.ones(groups, dtype=np.uint64), 8)
    put(base + 12, np.full(groups, 12346), 4)
    put(base + 16, n_cont, 4)
    j = np.arange(len(c_first)) - cont_start[c_grp]  # a container's index in its group
    put(base[c_grp] + 20 + 4 * j, hi[c_first], 2)
    put(base[c_grp] + 22 + 4 * j, card - 1, 2)
    before = c_first - starts[c_grp]  # values of the group before the container
    put(base[c_grp] + 20 + 4 * n_cont[c_grp] + 4 * j, 8 + 8 * n_cont[c_grp] + 2 * before, 4)
    rank = np.arange(n) - starts[grp]
    put(base[grp] + 20 + 8 * n_cont[grp] + 2 * rank, offsets & 0xFFFF, 2)
    raw = buf.tobytes()
    out = [raw[a:a + z] for a, z in zip(base.tolist(), size.tolist(), strict=True)]
    # Three consecutive offsets in a group: encode decides between array and run.
    step = np.zeros(n, dtype=bool)
    step[1:] = (offsets[1:] - offsets[:-1] == 1) & ~first[1:]
    runs = np.flatnonzero(step[1:] & step[:-1]) + 1
    for g in np.unique(grp[runs]).tolist():
        out[g] = encode(BitMap64(offsets[starts[g]:ends[g]]))
    return out


def fill_direct(r, n: int, span_ms: int, rng: np.random.Generator) -> float:
    """The index compaction would leave after `fill`: the same positions, keys and blobs
    (`encode_sparse`, checked against `encode` on a sample of the bitmaps)."""
    t = time.perf_counter()
    deliver = T0 + rng.integers(0, span_ms, size=n, dtype=np.int64)
    slot = (deliver - T0) // TICK * PARTITIONS + np.arange(n, dtype=np.int64) % PARTITIONS
    del deliver
    order = np.argsort(slot, kind="stable")  # offsets stay ascending within a group
    slot = slot[order]
    offsets = order // PARTITIONS
    del order
    assert n // PARTITIONS < 2**32
    cuts = np.flatnonzero(np.diff(slot)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    groups = slot[starts]
    del slot, cuts
    print(f"  sorted in {time.perf_counter() - t:.0f}s; {len(groups):,} bitmaps", flush=True)
    ks = keys.topic_index(TOPIC)
    sample = rng.choice(len(groups), size=min(len(groups), 2000), replace=False)
    checked = 0
    written = 0
    for c in range(0, len(groups), FILL_BITMAPS):
        g, a, b = groups[c:c + FILL_BITMAPS], starts[c:c + FILL_BITMAPS], ends[c:c + FILL_BITMAPS]
        blobs = encode_sparse(offsets[a[0]:b[-1]], a - a[0], b - a[0])
        mine = sample[(sample >= c) & (sample < c + len(g))]
        for k in mine.tolist():
            want = encode(BitMap64(offsets[starts[k]:ends[k]]))
            assert blobs[k - c] == want, (k, blobs[k - c].hex(), want.hex())
        checked += len(mine)
        # One HSET a bucket (its partitions' bitmaps), one ZADD for the chunk's buckets.
        bucket_of = (T0 + g // PARTITIONS * TICK).tolist()
        fields = (g % PARTITIONS).tolist()
        pipe = r.pipeline(transaction=False)
        i = 0
        while i < len(bucket_of):
            bucket = bucket_of[i]
            args: list[object] = []
            while i < len(bucket_of) and bucket_of[i] == bucket:
                args += [fields[i], blobs[i]]
                i += 1
            pipe.execute_command("HSET", ks.bucket(bucket), *args)
            if len(pipe) >= 20_000:
                pipe.execute()
        # A bucket split between two chunks is added twice: ZADD keeps one.
        buckets_here = sorted(set(bucket_of))
        for z in range(0, len(buckets_here), 10_000):
            pipe.zadd(ks.index, {b_: b_ for b_ in buckets_here[z:z + 10_000]})
        pipe.execute()
        written += len(g)
        print(f"  wrote {written:,} bitmaps in {time.perf_counter() - t:.0f}s", flush=True)
    assert checked == len(sample)
    print(f"  {checked:,} sampled bitmaps equal encode()'s", flush=True)
    first = T0 + int(groups[0]) // PARTITIONS * TICK
    pipe = r.pipeline(transaction=False)
    pipe.hset(keys.stats(TOPIC), TICK_FIELD, TICK)
    pipe.zadd(keys.DUE, {TOPIC: first}, lt=True)
    pipe.sadd(keys.TOPICS, TOPIC)
    pipe.execute()
    return time.perf_counter() - t


def compact(idx: TopicIndex) -> float:
    t = time.perf_counter()
    merged = 0
    while True:
        got = idx.compact(5000)
        if not got:
            break
        merged += got
        if merged % 500_000 < 5000:
            print(f"  compacted {merged:,} buckets in {time.perf_counter() - t:.0f}s",
                  flush=True)
    return time.perf_counter() - t


def timed_claims(idx: TopicIndex, nows: list[int],
                 max_buckets: int) -> tuple[list[float], list[int]]:
    """Claim, at each of `nows`, up to `max_buckets` due buckets; the ms of each claim and
    the messages it took."""
    ms, counts = [], []
    for now in nows:
        t = time.perf_counter()
        got = idx.claim(now, max_buckets, 60_000, strict=False)
        ms.append((time.perf_counter() - t) * 1000)
        counts.append(sum(b.count() for b in got))
    return ms, counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000_000)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--round-buckets", type=int, default=60,
                    help="buckets a round claims at most (a minute of 1 s buckets)")
    ap.add_argument("--claims", type=int, default=20, help="timed claims of each kind")
    ap.add_argument("--fill", choices=("direct", "path"), default="direct")
    args = ap.parse_args()
    n = args.messages
    span = int(args.days * DAY_MS)
    n_buckets = span // TICK
    rng = np.random.default_rng(29)
    proc, url, d = start_redis()
    try:
        r = connect(url)
        base = used_memory(r)
        print(f"{n:,} positions over {args.days:g} days of {TICK} ms buckets "
              f"({n_buckets:,} buckets, {n / n_buckets:.1f} messages a bucket on average), "
              f"{PARTITIONS} partitions", flush=True)
        idx = TopicIndex(r, TOPIC)
        if args.fill == "path":
            fill_s = fill(r, n, span, rng)
            compact_s = compact(idx)
        else:
            fill_s, compact_s = fill_direct(r, n, span, rng), 0.0
        used = used_memory(r) - base
        live = idx.buckets()
        t = time.perf_counter()
        usage = idx.memory_bytes(extra=[keys.stats(TOPIC)])
        usage_s = time.perf_counter() - t

        # The drain's view at the end of the 30 days: every bucket is due, and each claim
        # takes the earliest ones, with the rest of the index (millions of buckets) still
        # in place.
        now = T0 + span
        one_ms, one_counts = timed_claims(idx, [now] * args.claims, 1)
        round_ms, round_counts = timed_claims(idx, [now] * args.claims, args.round_buckets)
        print()
        print(f"{'pending messages':<48} {n:>14,}")
        print(f"{'buckets holding them':<48} {len(live):>14,}")
        print(f"{f'fill ({args.fill}), compaction':<48} {fill_s:>9.0f}s, {compact_s:.0f}s "
              f"({n / (fill_s + compact_s):,.0f} msg/s)")
        print(f"{'used_memory delta':<48} {used:>14,} B ({used / 2**30:.2f} GiB)")
        print(f"{'Redis bytes per pending message (used_memory)':<48} {used / n:>14.2f}")
        print(f"{'MEMORY USAGE of the index keys per message':<48} {usage / n:>14.2f}"
              f"   (README: 0.029 fixed, 4.54 uniform over 1 h; read in {usage_s:.0f}s)")
        print(f"{'bytes per bucket (used_memory / buckets)':<48} {used / len(live):>14.1f}")
        print(f"{'claim of 1 due bucket, median / max':<48} "
              f"{statistics.median(one_ms):>9.2f} / {max(one_ms):.2f} ms "
              f"({statistics.mean(one_counts):.1f} messages each)")
        print(f"{f'claim of a round, <= {args.round_buckets} buckets, median / max':<48} "
              f"{statistics.median(round_ms):>9.2f} / {max(round_ms):.2f} ms "
              f"({statistics.mean(round_counts):,.0f} messages each)")
        return 0
    finally:
        proc.stop(timeout=30)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
