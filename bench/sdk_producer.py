"""The SDK's producers against one admission process, in one run, so the ratios compare
like with like:

(a) the sync `Producer` from one thread: N messages, one send after the other;
(b) `AsyncProducer` from one event loop (stdlib asyncio) with K sends in flight;
(c) the sync `Producer` from K threads, one Producer each (a Producer's sequence ids
    are its own, and it takes them without a lock).

Every other message is delayed by 1 h, so both of admission's routes are measured; each
send's id is checked. Prints msg/s, p50/p99 per send, and the ratios to (a); writes
bench/out/sdk_producer.json.

Starts the test-profile Redis and Kafka unless running (and stops only what it started,
unless DWELL_TEST_KEEP_SERVERS=1), plus its own policy and admission processes on free
ports (their logs in .dwell/test/bench-logs/sdk_producer/).

    .venv/bin/python bench/sdk_producer.py [--messages 20000] [--concurrency 64] [--no-threads]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from dwell.adapters import kafka
from dwell.client import AsyncProducer, Producer
from dwell_dev import devstack
from dwell_dev.benchkit import Procs, load_avg, start_service, test_servers

ROOT = Path(__file__).resolve().parent.parent

PAYLOAD = b"x" * 200
DELAY_MS = 3_600_000
# Sends before each measured part, not counted: connections opened, admission's caches
# and Kafka's producer warm.
WARM_UP = 500


def delay(i: int) -> int | None:
    return DELAY_MS if i % 2 else None


def figures(sent: int, elapsed: float, latencies: list[float]) -> dict[str, float]:
    latencies.sort()
    return {"msgs_per_s": sent / elapsed, "seconds": elapsed,
            "p50_ms": latencies[len(latencies) // 2] * 1000,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000}


def sync_sends(producer: Producer, indexes: range, latencies: list[float],
               ids: list[str]) -> None:
    for i in indexes:
        t0 = time.perf_counter()
        ids.append(producer.send(PAYLOAD, key=f"k{i}", deliver_after=delay(i)))
        latencies.append(time.perf_counter() - t0)


def bench_sync(topic: str, url: str, n: int) -> dict[str, float]:
    """(a): one Producer, one thread."""
    with Producer(topic, producer_name=f"bench-sync-{uuid.uuid4().hex[:6]}",
                  admission_url=url) as p:
        sync_sends(p, range(WARM_UP), [], [])
        latencies: list[float] = []
        ids: list[str] = []
        t0 = time.perf_counter()
        sync_sends(p, range(n), latencies, ids)
        elapsed = time.perf_counter() - t0
    check(ids, n, "sync")
    return figures(n, elapsed, latencies)


def bench_async(topic: str, url: str, n: int, concurrency: int) -> dict[str, float]:
    """(b): one AsyncProducer, K tasks on one loop, each sending its next message as
    soon as its last one is answered."""

    async def run() -> dict[str, float]:
        async with AsyncProducer(topic, producer_name=f"bench-async-{uuid.uuid4().hex[:6]}",
                                 admission_url=url) as p:
            async def worker(todo: Any, latencies: list[float], ids: list[str]) -> None:
                for i in todo:
                    t0 = time.perf_counter()
                    ids.append(await p.send(PAYLOAD, key=f"k{i}", deliver_after=delay(i)))
                    latencies.append(time.perf_counter() - t0)

            warm = iter(range(WARM_UP))
            await asyncio.gather(*(worker(warm, [], []) for _ in range(concurrency)))
            todo = iter(range(n))
            latencies: list[float] = []
            ids: list[str] = []
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(todo, latencies, ids) for _ in range(concurrency)))
            elapsed = time.perf_counter() - t0
        check(ids, n, "async")
        return figures(n, elapsed, latencies)

    return asyncio.run(run())


def bench_threads(topic: str, url: str, n: int, threads: int) -> dict[str, float]:
    """(c): K threads, one Producer each, N/K messages each."""
    producers = [Producer(topic, producer_name=f"bench-thread-{t}-{uuid.uuid4().hex[:6]}",
                          admission_url=url) for t in range(threads)]
    latencies: list[list[float]] = [[] for _ in range(threads)]
    ids: list[list[str]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def run_all(job: Callable[[int], None]) -> None:
        def guarded(t: int) -> None:
            try:
                job(t)
            except BaseException as exc:  # the main thread reports it
                errors.append(exc)

        workers = [threading.Thread(target=guarded, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]

    try:
        run_all(lambda t: sync_sends(producers[t], range(WARM_UP // threads + 1), [], []))
        t0 = time.perf_counter()
        run_all(lambda t: sync_sends(producers[t], range(t, n, threads), latencies[t],
                                     ids[t]))
        elapsed = time.perf_counter() - t0
    finally:
        for p in producers:
            p.close()
    check([i for part in ids for i in part], n, "threads")
    return figures(n, elapsed, [x for part in latencies for x in part])


def check(ids: list[str], n: int, what: str) -> None:
    if len(ids) != n or len(set(ids)) != n:
        raise RuntimeError(f"{what}: {len(set(ids))} distinct ids for {n} sends")


def prepare(policy_url: str, admission_url: str) -> str:
    """A namespace with delayed delivery on; returns its topic once admission takes it."""
    tenant = "bench" + uuid.uuid4().hex[:8]
    with httpx.Client(base_url=policy_url, timeout=10) as c:
        c.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": []}).raise_for_status()
        c.put(f"/admin/v2/namespaces/{tenant}/ns").raise_for_status()
        c.post(f"/admin/v2/namespaces/{tenant}/ns/delayedDelivery",
               json={"active": True, "maxDeliveryDelayInMillis": 2 * DELAY_MS}
               ).raise_for_status()
    path = f"/topics/persistent/{tenant}/ns/sdk"
    with httpx.Client(base_url=admission_url, timeout=10) as c:
        deadline = time.monotonic() + 30
        while c.post(path, json={"messages": [{"payload": "probe",
                                               "deliverAfterMs": DELAY_MS}]}
                     ).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("admission never learnt the bench namespace")
            time.sleep(0.1)
    return f"persistent://{tenant}/ns/sdk"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000, help="N, per part")
    ap.add_argument("--concurrency", type=int, default=64,
                    help="K: sends in flight on the loop of (b), threads of (c)")
    ap.add_argument("--no-threads", action="store_true", help="skip (c)")
    args = ap.parse_args()
    n, k = args.messages, args.concurrency

    stack = devstack.Stack("test")
    logs = stack.state / "bench-logs" / "sdk_producer"
    logs.mkdir(parents=True, exist_ok=True)
    procs = Procs(logs)
    with test_servers(stack):
        try:
            kafka.ensure_dwell_topics(stack.kafka_bootstrap)
            env = stack.service_env() | {"DWELL_LOG_LEVEL": "warning"}
            policy_url = start_service(procs, "policy", env)
            admission_url = start_service(procs, "admission", env)
            topic = prepare(policy_url, admission_url)
            print(f"{n:,} messages per part, {len(PAYLOAD)} B, every other delayed 1 h; "
                  f"{load_avg()}", flush=True)
            print("(a) sync Producer, 1 thread ...", flush=True)
            sync = bench_sync(topic, admission_url, n)
            print(f"(b) AsyncProducer, 1 event loop, {k} sends in flight ...", flush=True)
            asynchronous = bench_async(topic, admission_url, n, k)
            threads = None
            if not args.no_threads:
                print(f"(c) sync Producer, {k} threads ...", flush=True)
                threads = bench_threads(topic, admission_url, n, k)
            procs.check()
        finally:
            procs.stop_all()

    result: dict[str, Any] = {
        "messages": n, "concurrency": k, "payload_bytes": len(PAYLOAD),
        "sync": {key: round(v, 3) for key, v in sync.items()},
        "async": {key: round(v, 3) for key, v in asynchronous.items()},
        "ratio_async_to_sync": round(asynchronous["msgs_per_s"] / sync["msgs_per_s"], 3)}
    rows = [("(a) sync, 1 thread", sync), (f"(b) async, {k} in flight", asynchronous)]
    if threads is not None:
        result["threads"] = {key: round(v, 3) for key, v in threads.items()}
        result["ratio_threads_to_sync"] = round(threads["msgs_per_s"] / sync["msgs_per_s"], 3)
        result["ratio_async_to_threads"] = round(
            asynchronous["msgs_per_s"] / threads["msgs_per_s"], 3)
        rows.append((f"(c) sync, {k} threads", threads))
    print()
    for label, f in rows:
        print(f"{label:<26}{f['msgs_per_s']:>10,.0f} msgs/s   {f['seconds']:6.1f} s   "
              f"p50 {f['p50_ms']:6.1f} ms  p99 {f['p99_ms']:6.1f} ms")
    print(f"async / sync          = {result['ratio_async_to_sync']:.3f}")
    if threads is not None:
        print(f"threads / sync        = {result['ratio_threads_to_sync']:.3f}")
        print(f"async / threads       = {result['ratio_async_to_threads']:.3f}")
    out = ROOT / "bench" / "out" / "sdk_producer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
