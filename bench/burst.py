"""Memory through a burst: the whole local stack takes N messages published flat out over
HTTP with delays up to two minutes, delivers them, and goes idle again. Prints each
process's RSS idle, at the peak and after, with Redis's `used_memory`, and after/idle:
what a burst leaves behind.

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
from workload import Checker, FaultStack, Generator, now_ms

from dwell.adapters import redis as redis_adapter
from dwell.core.topics import TopicName


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--max-delay-ms", type=int, default=120_000)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    stack = FaultStack("bench")
    try:
        stack.start_all()
        tenant = "burst" + uuid.uuid4().hex[:6]
        stack.make_namespace(tenant)
        topics = [f"persistent://{tenant}/ns/t{i}" for i in range(4)]
        time.sleep(2)  # the namespace reaches admission through the policy feed
        r = redis_adapter.connect(stack.redis_url)
        checker = Checker(stack.kafka_bootstrap, [TopicName.parse(t).kafka_topic for t in topics])
        checker.start()
        time.sleep(10)
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
        admission = f"http://127.0.0.1:{stack.ports['admission']}"
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
        print(f"\naccepted {len(ids):,}, delivered {delivered:,}, lost {len(ids) - delivered:,}")
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
        stack.down()
        for name in ("redis", "kafka"):
            stack.discard(name)


if __name__ == "__main__":
    sys.exit(main())
