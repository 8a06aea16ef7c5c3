"""Cancelling delayed messages against publishing them, in one run, so the ratio compares
like with like: one policy, admission and tracker process; N messages published with
AsyncProducer (K sends in flight, every one delayed 1 h), then the same N cancelled with
AsyncProducer.cancel (K in flight, in a shuffled order), each answer checked. Prints
msgs/s, p50/p99 of each, the ratio of cancels to publishes, and the index's bytes per
pending message before and after the cancels (a cancel keeps a member in the topic's
cancellations until the drain passes its bucket).

Then replacement by schedule key, on a second topic: N messages published with a key
each (delayed 1 h), then N more with the same keys. Prints the publish rate with keys,
the index's bytes per pending message with a schedule key, and how fast the tracker's
ingest applies the replacements (from the first replacement sent to the last applied).

Then the same over Kafka, on a third topic: N messages published on `dwell.publish` in
requests of 100, then cancelled there in requests of 100 ids; each rate from the first
request sent to the last result read on `dwell.publish.results`. An id answered retriable
(the tracker did not answer within the ingress's wait) is sent again, as a client would,
and counted.
Writes bench/out/cancel.json.

Starts the test-profile Redis and Kafka unless running (stopping only what it started,
unless DWELL_TEST_KEEP_SERVERS=1), plus its own processes on free ports (their logs in
.dwell/test/bench-logs/cancel/).

    .venv/bin/python bench/cancel.py [--messages 20000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from dwell.adapters import kafka
from dwell.client import AsyncProducer
from dwell.core import topics as names
from dwell.tracker.recovery import start_group_at_end
from dwell_dev import devstack
from dwell_dev.benchkit import Procs, load_avg, start_service, test_servers
from dwell_dev.testkit import read_results, wait_for, wait_ingress

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = b"x" * 200
DELAY_MS = 3_600_000
PER_REQUEST = 100  # messages or ids in a request on dwell.publish
CANCEL_ROUNDS = 10  # sends of the ids still answered retriable, at most


def figures(n: int, elapsed: float, latencies: list[float]) -> dict[str, float]:
    latencies.sort()
    return {"per_s": n / elapsed, "seconds": elapsed,
            "p50_ms": latencies[len(latencies) // 2] * 1000,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000}


async def run_all(k: int, todo: list[Any], call: Any) -> tuple[float, list[float], list[Any]]:
    """``call(item)`` for every item, K at a time; (seconds, latencies, answers)."""
    latencies: list[float] = []
    answers: list[Any] = [None] * len(todo)
    items = iter(enumerate(todo))

    async def worker() -> None:
        for i, item in items:
            t0 = time.perf_counter()
            answers[i] = await call(item)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(k)))
    return time.perf_counter() - t0, latencies, answers


def prepare(policy_url: str, admission_url: str) -> str:
    """A namespace; returns its topic once admission takes it."""
    tenant = "bench" + uuid.uuid4().hex[:8]
    with httpx.Client(base_url=policy_url, timeout=10) as c:
        c.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": []}).raise_for_status()
        c.put(f"/admin/v2/namespaces/{tenant}/ns").raise_for_status()
    with httpx.Client(base_url=admission_url, timeout=10) as c:
        wait_for(lambda: c.post(f"/topics/persistent/{tenant}/ns/probe", json={
            "messages": [{"payload": "probe"}]}).status_code == 200, 30,
            "admission to learn the bench namespace")
    return f"persistent://{tenant}/ns/cancel"


async def replacements(n: int, k: int, admission_url: str, tracker_url: str,
                       topic: str) -> dict[str, Any]:
    """N messages with a schedule key each, then N replacements of them; their figures."""
    stats_path = "/v1/topics/" + topic.replace("://", "/") + "/stats"
    async with AsyncProducer(topic, admission_url=admission_url,
                             max_pending_messages=0) as p:
        async def send(i: int) -> str:
            return await p.send(PAYLOAD, deliver_after=DELAY_MS, schedule_key=f"key-{i}")

        async def replace(i: int) -> str:
            return await p.send(PAYLOAD, deliver_after=DELAY_MS + 60_000,
                                schedule_key=f"key-{i}")

        secs, lat, _ = await run_all(k, list(range(n)), send)
        published = figures(n, secs, lat)
        with httpx.Client(base_url=tracker_url, timeout=30) as c:
            wait_for(lambda: c.get(stats_path).json()["delayedMessages"] == n, 300,
                     "the tracker to index every keyed message")
            pending = c.get(stats_path).json()
            started = time.perf_counter()
            secs, lat, _ = await run_all(k, list(range(n)), replace)
            replaced = figures(n, secs, lat)
            wait_for(lambda: c.get(stats_path).json()["replacedMessages"] == n, 300,
                     "the tracker to apply every replacement", interval=0.05)
            applied_s = time.perf_counter() - started
            after = c.get(stats_path).json()
    if (after["delayedMessages"], after["cancelledMessages"]) != (n, n):
        raise RuntimeError(f"after the replacements: {after}")
    return {"publish_keyed": {key: round(v, 3) for key, v in published.items()},
            "replace": {key: round(v, 3) for key, v in replaced.items()},
            "applied_per_s": round(n / applied_s, 1),
            "index_bytes_per_pending": round(pending["bufferMemoryBytes"] / n, 1)}


def over_kafka(n: int, bootstrap: str, admission_url: str, tracker_url: str,
               topic: str) -> dict[str, Any]:
    """N messages published on dwell.publish, then cancelled there; their rates."""
    wait_ingress(admission_url)
    name = "bench-" + uuid.uuid4().hex[:8]
    payload = PAYLOAD.decode()
    p = kafka.Producer(bootstrap, linger_ms=5)

    def requests(values: list[dict[str, Any]],
                 answers: int) -> tuple[float, list[dict[str, Any]]]:
        ends = kafka.end_offsets(bootstrap, names.PUBLISH_RESULTS)
        started = time.perf_counter()
        sent = [p.send(names.PUBLISH, orjson.dumps(v), topic) for v in values]
        for f in sent:
            f.result(60)
        got = read_results(bootstrap, ends, name, answers, timeout=600)
        return time.perf_counter() - started, got

    secs, got = requests([
        {"topic": topic, "producerName": name,
         "messages": [{"payload": payload, "deliverAfterMs": DELAY_MS}] * PER_REQUEST}
        for _ in range(n // PER_REQUEST)], n // PER_REQUEST * PER_REQUEST)
    ids = [r["messageId"] for r in got if r["errorCode"] == 0]
    if len(ids) != n // PER_REQUEST * PER_REQUEST:
        raise RuntimeError(f"published over Kafka: {len(ids)} of {n}")
    stats_path = "/v1/topics/" + topic.replace("://", "/") + "/stats"
    with httpx.Client(base_url=tracker_url, timeout=30) as c:
        wait_for(lambda: c.get(stats_path).json()["delayedMessages"] == len(ids), 300,
                 "the tracker to index the messages published over Kafka")
    random.Random(2).shuffle(ids)
    # An id answered retriable (errorCode 1: the tracker did not answer within the
    # ingress's wait) is sent again, as a client does; the rate counts the retries' time.
    cancel_secs, todo, retried = 0.0, ids, 0
    for _ in range(CANCEL_ROUNDS):
        took, answers = requests([
            {"topic": topic, "producerName": name, "cancel": todo[i:i + PER_REQUEST]}
            for i in range(0, len(todo), PER_REQUEST)], len(todo))
        cancel_secs += took
        failed = [a for a in answers if a.get("result") != "cancelled"]
        if any(a["errorCode"] != 1 for a in failed):
            raise RuntimeError(f"cancel answers: {len(failed)} not cancelled, as {failed[:2]}")
        todo = [a["messageId"] for a in failed]
        if not todo:
            break
        retried += len(todo)
    p.close()
    if todo:
        raise RuntimeError(f"{len(todo)} cancels still retriable after {CANCEL_ROUNDS} rounds")
    return {"publish_per_s": round(len(ids) / secs, 1),
            "cancel_per_s": round(len(ids) / cancel_secs, 1),
            "ratio": round(secs / cancel_secs, 3), "retried": retried}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000, help="N")
    ap.add_argument("--concurrency", type=int, default=64, help="K: requests in flight")
    args = ap.parse_args()
    n, k = args.messages, args.concurrency

    stack = devstack.Stack("test")
    logs = stack.state / "bench-logs" / "cancel"
    logs.mkdir(parents=True, exist_ok=True)
    procs = Procs(logs)
    with test_servers(stack):
        try:
            kafka.ensure_dwell_topics(stack.kafka_bootstrap)
            group = "dwell-tracker-bench-" + uuid.uuid4().hex[:6]
            start_group_at_end(stack.kafka_bootstrap, group, [names.DELAYED, names.REFILED])
            env = stack.service_env() | {"DWELL_LOG_LEVEL": "warning"}
            tracker_url = start_service(procs, "tracker",
                                        env | {"DWELL_TRACKER_GROUP_ID": group})
            asks = env | {"DWELL_TRACKER_URL": tracker_url}
            policy_url = start_service(procs, "policy", asks)
            admission_url = start_service(procs, "admission", asks | {
                "DWELL_INGRESS_GROUP": "dwell-admission-bench-" + uuid.uuid4().hex[:6],
                "DWELL_INGRESS_OFFSET_RESET": "latest"})
            topic = prepare(policy_url, admission_url)
            stats_path = "/v1/topics/" + topic.replace("://", "/") + "/stats"
            print(f"{n:,} messages, {len(PAYLOAD)} B, delayed 1 h; {k} requests in flight; "
                  f"{load_avg()}", flush=True)

            async def both() -> tuple[dict[str, float], dict[str, float], dict[str, Any]]:
                async with AsyncProducer(topic, admission_url=admission_url,
                                         max_pending_messages=0) as p:
                    async def send(i: int) -> str:
                        return await p.send(PAYLOAD, deliver_after=DELAY_MS)

                    await run_all(k, list(range(500)), send)  # warm-up, not counted
                    secs, lat, ids = await run_all(k, list(range(n)), send)
                    published = figures(n, secs, lat)
                    print("published; waiting for the tracker to index them ...", flush=True)
                    with httpx.Client(base_url=tracker_url, timeout=30) as c:
                        wait_for(lambda: c.get(stats_path).json()["delayedMessages"]
                                 == n + 500, 300, "the tracker to index every message")
                        before = c.get(stats_path).json()
                    # In another order than published, as cancels come.
                    random.Random(1).shuffle(ids)
                    secs, lat, answers = await run_all(k, ids, p.cancel)
                    cancelled = figures(n, secs, lat)
                    if answers.count("cancelled") != n:
                        counts = {a: answers.count(a) for a in set(answers)}
                        raise RuntimeError(f"answers: {counts}")
                    with httpx.Client(base_url=tracker_url, timeout=30) as c:
                        after = c.get(stats_path).json()
                return published, cancelled, {"before": before, "after": after}

            published, cancelled, stats = asyncio.run(both())
            keyed = asyncio.run(replacements(n, k, admission_url, tracker_url,
                                             topic.replace("/cancel", "/replace")))
            kafka_path = over_kafka(n, stack.kafka_bootstrap, admission_url, tracker_url,
                                    topic.replace("/cancel", "/kafka"))
            procs.check()
        finally:
            procs.stop_all()

    pending = n + 500
    bytes_before = stats["before"]["bufferMemoryBytes"] / pending
    bytes_added = (stats["after"]["bufferMemoryBytes"]
                   - stats["before"]["bufferMemoryBytes"]) / n
    result = {"messages": n, "concurrency": k,
              "publish": {key: round(v, 3) for key, v in published.items()},
              "cancel": {key: round(v, 3) for key, v in cancelled.items()},
              "ratio_cancel_to_publish": round(cancelled["per_s"] / published["per_s"], 3),
              "index_bytes_per_pending": round(bytes_before, 1),
              "index_bytes_per_cancel": round(bytes_added, 1),
              "cancelled_messages": stats["after"]["cancelledMessages"],
              "keyed": keyed, "kafka": kafka_path}
    print()
    for label, f in (("publish", published), ("cancel", cancelled)):
        print(f"{label:<10}{f['per_s']:>10,.0f} /s   {f['seconds']:6.1f} s   "
              f"p50 {f['p50_ms']:6.1f} ms  p99 {f['p99_ms']:6.1f} ms")
    print(f"cancel / publish       = {result['ratio_cancel_to_publish']:.3f}")
    print(f"index bytes per pending message: {bytes_before:.1f}; added per cancel: "
          f"{bytes_added:.1f}")
    for label in ("publish_keyed", "replace"):
        f = keyed[label]
        print(f"{label:<14}{f['per_s']:>7,.0f} /s   {f['seconds']:6.1f} s   "
              f"p50 {f['p50_ms']:6.1f} ms  p99 {f['p99_ms']:6.1f} ms")
    print(f"replacements applied by the ingest: {keyed['applied_per_s']:,.0f} /s; "
          f"index bytes per pending message with a schedule key: "
          f"{keyed['index_bytes_per_pending']:.1f}")
    print(f"over dwell.publish: publish {kafka_path['publish_per_s']:,.0f} /s, cancel "
          f"{kafka_path['cancel_per_s']:,.0f} /s (cancel / publish = {kafka_path['ratio']}); "
          f"{kafka_path['retried']:,} ids answered retriable and sent again")
    out = ROOT / "bench" / "out" / "cancel.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
