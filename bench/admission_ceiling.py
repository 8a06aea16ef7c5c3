"""The ceiling of bench/admission.py's HTTP / raw ratio on this machine: what admission's
HTTP path would do if reading a request and deciding it cost nothing.

A stand-in server answers the same requests on the same HTTP stack (uvicorn through
`dwell.http.serve` behind admission's `PublishFront`, its GC settings) by writing a batch of
the records admission would write (built once, not per request) through admission's
`Deliveries`, then answering 200 with a pre-encoded answer of the same shape and size.
What it leaves out is all of admission's own work: decoding the body, the topic and
policy lookups, `admit()`, building each record and its headers, the answer and the
metrics.

Its throughput against the raw producer of bench/admission.py (d), in alternating rounds
of one run, bounds the ratio that admission could reach by doing its own work faster:
the rest is the HTTP exchange and the Kafka client's calls.

    .venv/bin/python bench/admission_ceiling.py

Starts the test-profile Redis and Kafka unless running, as bench/admission.py does.
Prints the figures and writes bench/out/admission_ceiling.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any

import admission as bench
import orjson

from dwell_dev.procs import Child

ROOT = bench.ROOT
TOPIC = "persistent://bench/ceiling/load"


def serve() -> None:
    """The stand-in server (run as `admission_ceiling.py serve PORT`)."""
    from fastapi import FastAPI

    from dwell.adapters import kafka
    from dwell.admission.app import PublishFront, add_publish_routes
    from dwell.admission.deliveries import Deliveries
    from dwell.admission.settings import AdmissionSettings
    from dwell.core.topics import TopicName
    from dwell.http import serve as serve_http

    settings = AdmissionSettings()
    producer = kafka.Producer(settings.kafka_bootstrap, linger_ms=settings.producer_linger_ms,
                              poll_in_background=False,
                              **{"message.timeout.ms": settings.publish_timeout_ms})
    deliveries = Deliveries(producer, settings.publish_timeout_ms / 1000 + 1.0)
    ready = TopicName.parse(TOPIC).kafka_topic
    records = bench.raw_batch(0, TOPIC, ready, int(time.time() * 1000))
    now = int(time.time() * 1000)
    answer = orjson.dumps({"messagePublishResults": [
        {"errorCode": 0, "schemaVersion": 0, "deliverAt": now + 3_600_000 * (i % 2),
         "delayed": bool(i % 2),
         "messageId": f"{ready if i % 2 == 0 else 'dwell.delayed'}:{i % 4}:{1_000_000 + i}"}
        for i in range(bench.BATCH)], "schemaVersion": 0})

    async def handle(domain: str, tenant: str, namespace: str, topic: str,
                     body: bytes) -> tuple[int, bytes, dict[str, str] | None]:
        await deliveries.send(records)
        return 200, answer, None

    app = FastAPI()

    @app.get("/readyz")
    async def readyz() -> dict[str, bool]:
        return {"ready": True}

    routes = add_publish_routes(app, handle)
    gc.collect()
    gc.freeze()
    gc.set_threshold(*bench.GC_THRESHOLDS)
    serve_http(PublishFront(app, routes, handle, settings.max_request_bytes), settings)


def main() -> None:
    stack = bench.devstack.Stack("test")
    started = [n for n in ("redis", "kafka") if stack.start_empty(n) is not None]
    log_dir = stack.state / "bench-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    ready = bench.names.TopicName.parse(TOPIC).kafka_topic
    proc: Child | None = None
    try:
        bootstrap = stack.kafka_bootstrap
        bench.kafka.ensure_dwell_topics(bootstrap)
        bench.kafka.ensure_topic(bootstrap, ready,
                                 bench.AdmissionSettings().ready_topic_partitions)
        env = stack.service_env() | {"DWELL_LOG_LEVEL": "warning"}
        proc, url = bench.start_service(
            "ceiling", env, log_dir / "ceiling.log",
            [sys.executable, os.path.abspath(__file__), "serve"])
        path = "/topics/persistent/bench/ceiling/load"
        print("warm-up round (not counted) ...", flush=True)
        bench.run_async(bench.bench_http(url, path))
        bench.bench_raw(bootstrap, TOPIC, ready)
        rounds: list[tuple[dict[str, float], float]] = []
        for n in range(bench.ROUNDS):
            print(f"round {n + 1}/{bench.ROUNDS}: ceiling server, {bench.HTTP_CONCURRENCY} "
                  f"clients x {bench.HTTP_SECONDS:.0f} s; raw producer x "
                  f"{bench.RAW_SECONDS:.0f} s ...", flush=True)
            http_n = bench.run_async(bench.bench_http(url, path))
            raw_n = bench.bench_raw(bootstrap, TOPIC, ready)
            print(f"    ceiling {http_n['msgs_per_s']:,.0f} msgs/s, raw {raw_n:,.0f} msgs/s, "
                  f"ratio {http_n['msgs_per_s'] / raw_n:.3f}", flush=True)
            rounds.append((http_n, raw_n))
    finally:
        if proc is not None:
            proc.stop()
        if os.environ.get("DWELL_TEST_KEEP_SERVERS") != "1":
            stack.down(started)
            for name in started:
                stack.discard(name)

    http = bench.median([h for h, _ in rounds], key=lambda h: h["msgs_per_s"])
    raw = bench.median([r for _, r in rounds], key=float)
    ratio = bench.median([h["msgs_per_s"] / r for h, r in rounds], key=float)
    result: dict[str, Any] = {
        "ceiling": {k: round(v, 2) for k, v in http.items()},
        "raw_msgs_per_s": round(raw),
        "ratio_ceiling_to_raw": round(ratio, 3),
        "rounds": [{"ceiling_msgs_per_s": round(h["msgs_per_s"]), "raw_msgs_per_s": round(r)}
                   for h, r in rounds],
    }
    print()
    print(f"ceiling (HTTP, no checks) {http['msgs_per_s']:>10,.0f} msgs/s   "
          f"p50 {http['p50_ms']:.1f} ms  p99 {http['p99_ms']:.1f} ms")
    print(f"raw Kafka producer        {raw:>10,.0f} msgs/s")
    print(f"ceiling / raw = {ratio:.3f}  (medians of {bench.ROUNDS} alternating rounds): no "
          "admission on this HTTP stack and Kafka client can do better than this ratio")
    out = ROOT / "bench" / "out" / "admission_ceiling.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:  # the stand-in server main() starts
        serve()
    else:
        argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
        main()
