"""The tracker's periodic work at scale (issue 31): the stats refresh and the low
watermarks, every 10 s each, over N pending positions of one topic with delays uniform
over `--days` of 1 s buckets (the compacted index written directly, as
bench/index_sparsity.py's `--fill direct` writes it), in a Redis of its own.

Each round is timed two ways in the same process:

- **whole**: the index read whole, every bucket's keys, by a fresh `IndexView` (each
  round read at least this much when the stats and the minima were computed from
  scratch), then the stats and the low watermarks from it;
- **kept**: the tracker's `IndexView` kept up to date from the changes stream, after a
  round of work like a busy topic's between two refreshes: `--appends` new positions
  over the same span (through the ingest's append path) and `--completes` due buckets
  claimed and completed (the drain's path).

    .venv/bin/python bench/periodic.py --messages 10000000 --days 30

Both ways must give the same figures; the bench checks it and says so."""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time

import numpy as np
from index_sparsity import DAY_MS, TOPIC, fill_direct
from tracker import PARTITIONS, T0, TICK, start_redis

from dwell import keys
from dwell.adapters.redis import connect
from dwell.index.topic import TopicIndex
from dwell.tracker.index_view import IndexView
from dwell.tracker.recovery import low_watermarks
from dwell.tracker.stats import StatsRefresher

INGEST_BATCH = 50_000


def work(idx: TopicIndex, rng: np.random.Generator, span_ms: int, appends: int,
         completes: int, next_offset: int, now: int) -> int:
    """A round's worth of changes: appends through the ingest's path, the earliest due
    buckets claimed and completed; returns the next offset."""
    for at in range(0, appends, INGEST_BATCH):
        n = min(INGEST_BATCH, appends - at)
        deliver = T0 + rng.integers(0, span_ms, size=n)
        offs = next_offset + np.arange(n)
        idx.add(zip((offs % PARTITIONS).tolist(), (offs // PARTITIONS + (1 << 32)).tolist(),
                    deliver.tolist(), [TICK] * n, strict=True))
        next_offset += n
    idx.compact(5000)
    for b in idx.claim(now, completes, 60_000, strict=False):
        idx.complete(b.bucket_start, b.lease_id)
    return next_offset


def timed(fn):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--appends", type=int, default=100_000,
                    help="positions indexed between two rounds (10,000 msg/s for 10 s)")
    ap.add_argument("--completes", type=int, default=10,
                    help="due buckets completed between two rounds")
    args = ap.parse_args()
    span = int(args.days * DAY_MS)
    rng = np.random.default_rng(31)
    proc, url, d = start_redis()
    try:
        r = connect(url)
        print(f"{args.messages:,} positions over {args.days:g} days of {TICK} ms buckets",
              flush=True)
        fill_direct(r, args.messages, span, rng)
        r.hset(keys.INGESTED, mapping={p: 1 << 40 for p in range(PARTITIONS)})
        idx = TopicIndex(r, TOPIC)
        kept = IndexView(r)
        first_s, _ = timed(lambda: kept.figures(TOPIC))
        print(f"  the view's first read (whole): {first_s:.1f}s", flush=True)
        now = T0
        offset = 0
        rows = []
        for i in range(args.rounds):
            now += 10_000
            offset = work(idx, rng, span, args.appends, args.completes, offset, now)
            read_before = kept.buckets_read
            k_stats, _ = timed(lambda: StatsRefresher(kept, "bench", strict=False,
                                                      lookahead=0, interval_s=10).refresh())
            k_marks, k_low = timed(lambda: low_watermarks(kept))
            read = kept.buckets_read - read_before
            whole = IndexView(r)
            w_read, b = timed(lambda v=whole: v.figures(TOPIC))
            w_stats, _ = timed(lambda v=whole: StatsRefresher(
                v, "bench", strict=False, lookahead=0, interval_s=10).refresh())
            w_marks, w_low = timed(lambda v=whole: low_watermarks(v))
            a = kept.figures(TOPIC)
            same = (a.counts.tolist() == b.counts.tolist()
                    and a.starts.tolist() == b.starts.tolist() and k_low == w_low)
            rows.append((w_read + w_stats + w_marks, k_stats + k_marks, read, same))
            print(f"  round {i + 1}: whole {w_read:.2f}s read + {w_stats:.2f}s stats + "
                  f"{w_marks:.2f}s marks; kept {k_stats:.3f}s stats + {k_marks:.3f}s marks "
                  f"({read:,} buckets read); same figures: {same}", flush=True)
        n_buckets = len(kept.figures(TOPIC).starts)
        print()
        print(f"{'pending messages':<44} {int(kept.figures(TOPIC).counts.sum()):>14,}")
        print(f"{'buckets holding them':<44} {n_buckets:>14,}")
        print(f"{'changes a round':<44} {args.appends:>10,} appended, {args.completes} "
              f"buckets completed")
        w = statistics.median(x[0] for x in rows)
        k = statistics.median(x[1] for x in rows)
        print(f"{'stats + low watermarks, whole / kept':<44} {w:>9.2f}s / {k:.3f}s "
              f"({w / max(k, 1e-9):,.0f}x; median of {len(rows)} rounds)")
        print(f"{'buckets read a round, kept (median)':<44} "
              f"{statistics.median(x[2] for x in rows):>14,.0f}")
        fig = kept.figures(TOPIC)
        held = sum(getattr(fig, f).nbytes for f in fig.__slots__)
        print(f"{'the view in the tracker':<44} {held / 2**20:>12,.0f} MB "
              f"({held / max(len(fig.starts), 1):.0f} B a bucket)")
        print(f"{'figures equal in every round':<44} {all(x[3] for x in rows)!s:>14}")
        return 0 if all(x[3] for x in rows) else 1
    finally:
        proc.stop(timeout=30)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
