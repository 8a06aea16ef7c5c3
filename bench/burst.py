"""Memory and disk through a burst: the whole local stack takes N messages published flat
out over HTTP with delays up to two minutes, delivers them, and goes idle again. Prints
each process's RSS idle, at the peak and after, with Redis's `used_memory`, and
after/idle: what a burst leaves behind. Then the disk: the records and bytes the delay
logs and `dwell.delivered` hold before the burst, once it is published, and once it is
delivered and the tracker's trim has run (segments roll every `--segment-ms`, a stand-in
for the hour dwell creates them with, while a trickle of short delays keeps them rolling
as production traffic would).

    .venv/bin/python bench/burst.py                       # 500,000 messages
    .venv/bin/python bench/burst.py --messages 100000 --max-delay-ms 30000

Runs devstack's `bench` profile (its own servers, stopped when done)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid

import httpx

from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.adapters.kafka.admin import ensure_topic_config
from dwell.core.topics import TopicName
from dwell_dev.testkit import now_ms
from dwell_dev.workload import Checker, FaultStack, Generator

# The tracker trims every 10 s here (60 s by default), without keeping delivered records.
TRIM_INTERVAL_MS = 10_000


class BurstStack(FaultStack):
    def service_env(self) -> dict[str, str]:
        # Delivered records go at once: the burst is acknowledged as it is received.
        return super().service_env() | {"DWELL_TRIM_INTERVAL_MS": str(TRIM_INTERVAL_MS),
                                        "DWELL_TRIM_KEEP_DELIVERED_MS": "0"}


def log_sizes(stack: FaultStack) -> dict[str, tuple[int, int]]:
    """(records held, bytes on disk) of each kept log: its partitions' end less start
    offsets, and the disk blocks their files take in Kafka's log dir (not their sizes:
    Kafka preallocates each segment's indexes at 10 MiB, sparse)."""
    data = stack.data_dir("kafka")
    assert data is not None
    starts = kafka.LogStarts(stack.kafka_bootstrap)
    out = {}
    for topic in kafka.KEPT_TOPICS:
        ends = kafka.end_offsets(stack.kafka_bootstrap, topic)
        first = starts.get([(topic, p) for p in ends])
        held = sum(end - first[(topic, p)] for p, end in ends.items())
        disk = sum(f.stat().st_blocks * 512 for p in ends
                   for f in (data / f"{topic}-{p}").iterdir() if f.is_file())
        out[topic] = (held, disk)
    return out


def trickle(admission: str, namespace: str, stop: threading.Event) -> None:
    """A few messages a second with delays of 5-9 s (varied, so that they are re-filed
    too), over 32 topics: records are keyed by topic, so that every partition of every
    kept log gets new records and its segments keep rolling."""
    with httpx.Client(base_url=admission, timeout=30) as c:
        i = 0
        while not stop.wait(0.125):
            i += 1
            c.post(f"/topics/persistent/{namespace}/trickle{i % 32}", json={"messages": [
                {"payload": "t", "deliverAfterMs": 5000 + i * 397 % 4000}]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--max-delay-ms", type=int, default=120_000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--segment-ms", type=int, default=20_000,
                    help="segment.ms set on the kept logs for the run")
    ap.add_argument("--trim-wait-s", type=int, default=180,
                    help="how long to wait for the logs to be trimmed after delivery")
    args = ap.parse_args()
    stack = BurstStack("bench")
    stop_trickle = threading.Event()
    try:
        stack.start_all()
        for topic in kafka.KEPT_TOPICS:
            ensure_topic_config(stack.kafka_bootstrap, topic,
                                {"segment.ms": str(args.segment_ms)})
        tenant = "burst" + uuid.uuid4().hex[:6]
        stack.make_namespace(tenant)
        topics = [f"persistent://{tenant}/ns/t{i}" for i in range(4)]
        time.sleep(2)  # the namespace reaches admission through the policy feed
        r = redis_adapter.connect(stack.redis_url)
        checker = Checker(stack.kafka_bootstrap, [TopicName.parse(t).kafka_topic for t in topics])
        checker.start()
        time.sleep(10)
        admission = f"http://127.0.0.1:{stack.ports['admission']}"
        threading.Thread(target=trickle, args=(admission, f"{tenant}/ns", stop_trickle),
                         daemon=True).start()
        disk_before = log_sizes(stack)
        idle = stack.rss_kib()
        idle_maps = stack.memory_maps()
        idle_alloc = stack.allocators()
        idle_redis = int(r.info("memory")["used_memory"])
        peak = dict(idle)
        peak_redis = idle_redis
        sampling = threading.Event()

        def sample() -> None:
            nonlocal peak_redis
            while not sampling.wait(0.5):
                for name, kib in stack.rss_kib().items():
                    peak[name] = max(peak.get(name, 0), kib)
                peak_redis = max(peak_redis, int(r.info("memory")["used_memory"]))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        gens = [Generator(admission, topics, rate=1, max_delay_ms=args.max_delay_ms, seed=i)
                for i in range(args.clients)]
        per = args.messages // args.clients // 1000

        def publish(g: Generator) -> None:
            with httpx.Client(base_url=admission, timeout=60) as c:
                for i in range(per):
                    g.send(c, topics[i % len(topics)], count=1000)

        t0 = time.monotonic()
        threads = [threading.Thread(target=publish, args=(g,)) for g in gens]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        published_s = time.monotonic() - t0
        accepted = {i: at for g in gens for i, at in g.out.deliver_at.items()}
        print(f"published {len(accepted):,} in {published_s:.1f}s "
              f"({len(accepted) / published_s:,.0f} msg/s)", flush=True)
        disk_published = log_sizes(stack)
        last_due = max(accepted.values())
        ids = set(accepted)
        deadline = time.monotonic() + (last_due - now_ms()) / 1000 + 300
        while checker.delivered(ids) < len(ids) and time.monotonic() < deadline:
            time.sleep(1)
            print(f"\rdelivered {checker.delivered(ids):,} of {len(ids):,}", end="", flush=True)
        print()
        delivered = checker.delivered(ids)
        time.sleep(20)  # idle again: what is still held now stays
        sampling.set()
        sampler.join()
        after = stack.rss_kib()
        after_maps = stack.memory_maps()
        after_alloc = stack.allocators()
        after_redis = int(r.info("memory")["used_memory"])
        checker.stop()
        # Trimmed: the kept logs hold no more than before the burst plus what the trickle
        # added, give or take a segment a partition (or the wait ends).
        t_trim = time.monotonic()
        while time.monotonic() - t_trim < args.trim_wait_s:
            disk_after = log_sizes(stack)
            if all(disk_after[t][1] < max(disk_published[t][1] // 10, 1 << 20)
                   for t in disk_after):
                break
            time.sleep(5)
        trim_s = time.monotonic() - t_trim
        stop_trickle.set()
        print(f"\naccepted {len(ids):,}, delivered {delivered:,}, lost {len(ids) - delivered:,}")
        print(f"\nkept logs: records held / bytes on disk (segments of {args.segment_ms} ms, "
              f"trim every {TRIM_INTERVAL_MS} ms; after = {trim_s:.0f} s after delivery)")
        print(f"{'':<24} {'before':>22} {'published':>24} {'delivered, trimmed':>24}")
        for t in disk_before:
            row = "   ".join(f"{held:>10,} {disk / 2**20:8.1f} MiB" for held, disk in
                             (disk_before[t], disk_published[t], disk_after[t]))
            print(f"{t:<24} {row}")
        total = [sum(x[t][1] for t in x) for x in (disk_before, disk_published, disk_after)]
        print(f"{'all three, bytes':<24} {total[0] / 2**20:19.1f} MiB   "
              f"{total[1] / 2**20:21.1f} MiB   {total[2] / 2**20:21.1f} MiB "
              f"(after / published: {total[2] / max(total[1], 1):.3f})")
        print(f"\n{'RSS (MiB)':<20} {'idle':>8} {'peak':>8} {'after':>8} {'after/idle':>11}")
        worst = 0.0
        for name in sorted(set(idle) | set(after)):
            a, p, b = (x.get(name, 0) / 1024 for x in (idle, peak, after))
            ratio = b / a if a else 0.0
            if name in ("tracker", "spark-driver(py)", "admission", "policy"):
                worst = max(worst, ratio)
            print(f"{name:<20} {a:8.0f} {p:8.0f} {b:8.0f} {ratio:11.2f}")
        print(f"{'redis used_memory':<20} {idle_redis / 2**20:8.1f} {peak_redis / 2**20:8.1f} "
              f"{after_redis / 2**20:8.1f}")
        print("\nwhere it sits (MiB, idle -> after): heap / anon / file")
        for name, m in sorted(after_maps.items()):
            i = idle_maps.get(name, {})
            print(f"{name:<20} " + "   ".join(
                f"{k} {i.get(k, 0) / 1024:5.0f} -> {m[k] / 1024:5.0f}" for k in m))
        print("\nallocators (MiB, idle -> after): glibc in use / free / mapped, "
              "Python blocks (thousands)")
        for name, a in sorted(after_alloc.items()):
            i = idle_alloc.get(name, {})
            print(f"{name:<20} " + "   ".join(
                f"{k} {i.get(k, 0):6.1f} -> {v:6.1f}" for k, v in a.items()))
        print(f"\nworst after/idle of dwell's Python services: {worst:.2f} (target <= 1.25)")
        return 0 if delivered == len(ids) else 1
    finally:
        stop_trickle.set()
        stack.down()
        for name in ("redis", "kafka"):
            stack.discard(name)


if __name__ == "__main__":
    sys.exit(main())
