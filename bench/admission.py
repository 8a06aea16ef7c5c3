"""Admission throughput, measured in one run so the ratios compare like with like:

(a) `admit()` decisions per second (pure function, in this process);
(b) HTTP publish, 100-message batches against one admission process: msgs/s, p50/p99,
    from 16 keep-alive connections of a lean client (raw HTTP/1.1, pre-encoded bodies:
    the client shares the 2 cores with admission and Kafka, so it must cost little);
    and once from 64 connections;
(c) the same requests through the Kafka ingress (`dwell.publish` → results);
(d) the raw Kafka client producing the same messages (same topics, headers, acks=all, linger,
    same `send_many_then` call, delivery reports served on the sending thread and the
    garbage collector tuned as admission does) with no checks, so admission's overhead is
    a ratio. (b) and (d) alternate for BENCH_ROUNDS rounds of BENCH_HTTP_SECONDS each
    so both see the same background load;
(e) two more admission processes that differ only in token authentication and
    authorization (HS256, a role holding `produce` on the namespace; both without the
    ingress), each loaded alone by the clients of (b) for BENCH_HTTP_SECONDS, one after
    the other, in BENCH_AUTH_ROUNDS pairs whose order alternates (off then on, on then
    off) so that a drift in the machine's load weighs on both sides alike: the median of
    the per-pair on / off ratios is what checking the token and the role costs; and that
    check's own cost per request, timed in this process.

Starts the test-profile Redis and Kafka unless running (and stops only what it started,
unless DWELL_TEST_KEEP_SERVERS=1),
plus its own policy and admission processes on free ports. Prints the figures and writes
bench/out/admission.json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import random
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from dwell.adapters import kafka
from dwell.admission.__main__ import GC_THRESHOLDS
from dwell.admission.settings import AdmissionSettings
from dwell.auth.tokens import create_secret_key, create_token
from dwell.core import topics as names
from dwell.core.admit import admit
from dwell.core.policy import EffectivePolicy
from dwell_dev import devstack
from dwell_dev.procs import Child
from dwell_dev.testkit import free_port

try:  # the client side of (b) on the same event loop as the server's
    from uvloop import run as run_async
except ImportError:  # pragma: no cover - uvicorn[standard] brings it
    from asyncio import run as run_async

ROOT = Path(__file__).resolve().parent.parent

BATCH = 100
PAYLOAD = "x" * 200
HTTP_SECONDS = float(os.environ.get("BENCH_HTTP_SECONDS", "4"))  # per round
# (b) and (d) alternate, so that both see the same background load on a shared machine;
# the ratio reported is the median of the per-round ratios.
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
# Enough requests in flight to keep admission busy while each waits ~4 ms for Kafka's
# acks: at 8, the clients' round trips bound the figure (~185k against ~200k at 16).
HTTP_CONCURRENCY = int(os.environ.get("BENCH_HTTP_CONCURRENCY", "16"))
# (e)'s pairs: on a shared 2-core machine one pair's ratio swings by +-15%, its median
# over 15 pairs by a few percent.
AUTH_ROUNDS = int(os.environ.get("BENCH_AUTH_ROUNDS", "15"))
INGRESS_REQUESTS = int(os.environ.get("BENCH_INGRESS_REQUESTS", "1000"))
# The raw producer sends for as long as a HTTP round lasts, cycling through this many
# prepared records: a run of 200,000 records (~0.4 s) swung between 263k and 510k msg/s
# from one round to the next on this shared machine.
RAW_SECONDS = float(os.environ.get("BENCH_RAW_SECONDS", str(HTTP_SECONDS)))
RAW_MESSAGES = int(os.environ.get("BENCH_RAW_MESSAGES", "100000"))
# A second HTTP figure with many more clients: what admission keeps when the requests in
# flight (and the memory they hold) grow.
MANY_CLIENTS = int(os.environ.get("BENCH_HTTP_MANY_CLIENTS", "64"))
ADMIT_CALLS = int(os.environ.get("BENCH_ADMIT_CALLS", "1000000"))
TARGETS = {"admit_per_s": 500_000, "http_msgs_per_s": 20_000, "ratio_http_to_raw": 0.7}


def start_service(name: str, env: dict[str, str], log: Path,
                  argv: list[str] | None = None) -> tuple[Child, str]:
    """`python -m dwell.<name>` (or `argv`) on a free port, once its /readyz answers 200."""
    port = free_port()
    child = Child.spawn(name, argv or [sys.executable, "-m", f"dwell.{name}"], log,
                        env | {"DWELL_HTTP_PORT": str(port)})
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False
    child.wait_until(ready, 60, "ready")
    return child, url


def messages(batch_no: int) -> list[dict[str, Any]]:
    """Half immediate, half delayed by 1 h (so both routes are measured)."""
    return [{"payload": PAYLOAD, "key": f"k{i}", "sequenceId": batch_no * BATCH + i,
             "properties": {"app": "bench"},
             **({"deliverAfterMs": 3_600_000} if i % 2 else {})} for i in range(BATCH)]


# ---------------------------------------------------------------- (a)


def bench_admit() -> float:
    policy = EffectivePolicy(active=True, tick_time_ms=1000, max_delay_ms=3_600_000,
                             fixed_delay_ms=0)
    now = int(time.time() * 1000)
    rnd = random.Random(1)
    asks = [now + rnd.randrange(-1000, 4_000_000) if i % 3 else None for i in range(1000)]
    t0 = time.perf_counter()
    for n in range(ADMIT_CALLS // 1000):
        for d in asks:
            admit(deliver_at=d, deliver_after_ms=None, policy=policy, persistent=True,
                  publish_time=now, now=now + n)
    return ADMIT_CALLS / (time.perf_counter() - t0)


def bench_guard(secret: bytes, token: str, role: str) -> float:
    """Microseconds one publish's token and permission check takes once the token is
    cached (`Guard.check`, the call admission's publish front makes): a figure the load
    on a shared machine does not swing as it swings (e)'s ratio."""
    from dwell.auth.guard import Guard
    from dwell.core.authz import Grants, Operation
    from dwell.settings import CommonSettings

    grants = Grants.of((), {role: ["produce"]})

    async def lookup(_tenant: str, _namespace: str | None) -> Grants:
        return grants

    guard = Guard(CommonSettings(
        authentication_enabled=True, authorization_enabled=True,
        token_secret_key="data:;base64," + base64.b64encode(secret).decode()), lookup)
    header = f"Bearer {token}"

    async def run(n: int) -> float:
        await guard.check(header, Operation.PRODUCE, "t", "ns")
        t0 = time.perf_counter()
        for _ in range(n):
            await guard.check(header, Operation.PRODUCE, "t", "ns")
        return (time.perf_counter() - t0) / n * 1e6

    return asyncio.run(run(100_000))


# ---------------------------------------------------------------- (b)


BODIES_PER_CLIENT = 32


async def _client(host: str, port: int, path: str, bodies: list[bytes], stop_at: float,
                  latencies: list[float], limit: int = 1 << 62, token: str = "") -> int:
    """One keep-alive HTTP/1.1 connection posting pre-encoded requests back to back.

    A deliberately cheap load generator (no HTTP library, nothing encoded in the loop) so
    that the 2 cores go to admission and Kafka rather than to the client; every answer is
    still checked: status 200 and one messageId per message.
    """
    reader, writer = await asyncio.open_connection(host, port)
    auth = f"authorization: Bearer {token}\r\n" if token else ""
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\n{auth}"
            "content-type: application/json\r\ncontent-length: ").encode()
    requests = [head + b"%d\r\n\r\n" % len(body) + body for body in bodies]
    sent = n = 0
    try:
        while n < limit and time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            writer.write(requests[n % len(requests)])
            status, _, rest = (await reader.readuntil(b"\r\n\r\n")).partition(b"\r\n")
            length = 0
            for line in rest.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            answer = await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if status.split(b" ", 2)[1] != b"200" or answer.count(b'"messageId"') != BATCH:
                raise RuntimeError(f"{status.decode()}: {answer[:300]!r}")
            sent += BATCH
            n += 1
    finally:
        writer.close()
    return sent


async def bench_http(url: str, topic_path: str, clients: int = HTTP_CONCURRENCY,
                     token: str = "") -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    bodies = [[orjson.dumps({"producerName": f"bench-{w}", "messages": messages(n)})
               for n in range(w * BODIES_PER_CLIENT, (w + 1) * BODIES_PER_CLIENT)]
              for w in range(clients)]
    # Warm-up: creates the ready topic, fills caches.
    await _client(host, int(port), topic_path, bodies[0][:1], float("inf"), [], limit=1,
                  token=token)
    t0 = time.perf_counter()
    sent = await asyncio.gather(*(_client(host, int(port), topic_path, bodies[w],
                                          t0 + HTTP_SECONDS, latencies, token=token)
                                  for w in range(clients)))
    elapsed = time.perf_counter() - t0
    latencies.sort()
    return {"msgs_per_s": sum(sent) / elapsed, "requests": len(latencies),
            "p50_ms": latencies[len(latencies) // 2] * 1000,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000}


async def bench_auth_pair(off_url: str, on_url: str, topic_path: str, token: str,
                          on_first: bool) -> tuple[dict[str, float], dict[str, float]]:
    """(e): the auth-off and the auth-on admission loaded alone, one after the other."""
    if on_first:
        on = await bench_http(on_url, topic_path, token=token)
        return await bench_http(off_url, topic_path), on
    off = await bench_http(off_url, topic_path)
    return off, await bench_http(on_url, topic_path, token=token)


# ---------------------------------------------------------------- (c)


def bench_ingress(bootstrap: str, topic: str) -> dict[str, float]:
    producer_name = f"bench-ingress-{uuid.uuid4().hex[:8]}"
    ends = kafka.end_offsets(bootstrap, names.PUBLISH_RESULTS)
    consumer = kafka.Consumer(bootstrap, f"bench-{uuid.uuid4().hex}")
    consumer.assign([(names.PUBLISH_RESULTS, p, o) for p, o in ends.items()])
    p = kafka.Producer(bootstrap, linger_ms=5)
    want = INGRESS_REQUESTS * BATCH
    t0 = time.perf_counter()
    for n in range(INGRESS_REQUESTS):
        p.send(names.PUBLISH, orjson.dumps({"topic": topic, "producerName": producer_name,
                                            "messages": messages(n)}), topic)
    p.flush()
    got = errors = 0
    key = producer_name.encode()
    deadline = time.monotonic() + 300
    while got < want and time.monotonic() < deadline:
        for r in consumer.poll(5000, 0.5):
            if r.key == key:
                got += 1
                errors += b'"errorCode":0' not in (r.value or b"")
    elapsed = time.perf_counter() - t0
    consumer.close()
    p.close()
    if got < want:
        raise RuntimeError(f"ingress: only {got} of {want} results in 300 s")
    return {"msgs_per_s": want / elapsed, "requests": INGRESS_REQUESTS, "errors": errors}


# ---------------------------------------------------------------- (d)


def raw_batch(first_seq: int, topic: str, ready: str, now: int) -> list[kafka.OutRecord]:
    """The records admission writes for one request of `messages()`, as plan() builds
    them (half to the ready topic, half to the delay log)."""
    value = PAYLOAD.encode()
    topic_b = topic.encode()
    batch: list[kafka.OutRecord] = []
    for i in range(BATCH):
        headers = [("app", b"bench"), ("dwell-topic", topic_b),
                   ("dwell-publish-time", b"%d" % now), ("dwell-producer", b"raw"),
                   ("dwell-sequence-id", b"%d" % (first_seq + i))]
        if i % 2:
            headers += [("dwell-deliver-at", b"%d" % (now + 3_600_000)),
                        ("dwell-tick-time", b"1000"), ("dwell-key", b"k%d" % i)]
            batch.append((names.DELAYED, value, topic_b, headers, now))
        else:
            batch.append((ready, value, b"k%d" % i, headers, now))
    return batch


def bench_raw(bootstrap: str, topic: str, ready: str) -> float:
    """The same records admission writes, through the same client calls, without checks:
    `send_many_then` per batch of 100 and delivery reports served on the sending thread,
    as admission serves them on its event loop (a thread polling for them instead made
    this baseline ~20% slower: 228-278k against 273-327k msg/s). Sends for RAW_SECONDS,
    then waits for every acknowledgement; the time includes that wait."""
    settings = AdmissionSettings()
    p = kafka.Producer(bootstrap, linger_ms=settings.producer_linger_ms,
                       poll_in_background=False,
                       compression_type=settings.kafka_compression_type)
    now = int(time.time() * 1000)
    batches = [raw_batch(n, topic, ready, now) for n in range(0, RAW_MESSAGES, BATCH)]
    failures: list[Exception] = []
    left = 0

    def settle(_: object, exc: Exception | None) -> None:
        nonlocal left
        left -= 1
        if exc is not None:
            failures.append(exc)

    # The collector as admission runs it (dwell.admission.__main__): with Python's
    # defaults this baseline was ~5% slower, collecting among the prepared batches.
    gc.collect()
    gc.freeze()
    defaults = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    sent = 0
    try:
        t0 = time.perf_counter()
        stop_at = t0 + RAW_SECONDS
        while time.perf_counter() < stop_at:
            for batch in batches:
                p.send_many_then(batch, settle)
                left += 1
                p.poll(0)
            sent += len(batches)
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            p.poll(0.05)
        elapsed = time.perf_counter() - t0
    finally:
        gc.set_threshold(*defaults)
        gc.unfreeze()
    p.close()
    if left or failures:
        raise RuntimeError(f"raw: {left} batches unacknowledged, failures {failures[:1]}")
    return sent * BATCH / elapsed


# ---------------------------------------------------------------- main


def median(items: list[Any], key: Any) -> Any:
    return sorted(items, key=key)[len(items) // 2]


def main() -> None:
    stack = devstack.Stack("test")
    started = [n for n in ("redis", "kafka") if stack.start_empty(n) is not None]
    procs: list[Child] = []
    log_dir = stack.state / "bench-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        kafka.ensure_dwell_topics(stack.kafka_bootstrap)
        env = stack.service_env() | {"DWELL_LOG_LEVEL": "warning"}
        proc, policy_url = start_service("policy", env, log_dir / "policy.log")
        procs.append(proc)
        proc, adm_url = start_service("admission", env, log_dir / "admission.log")
        procs.append(proc)
        # (e): the same service without and with authentication and authorization; the
        # ingress stays with the first one.
        no_ingress = env | {"DWELL_INGRESS_ENABLED": "false"}
        proc, off_url = start_service("admission", no_ingress,
                                      log_dir / "admission-auth-off.log")
        procs.append(proc)
        secret = create_secret_key()
        role = "bench-producer"
        token = create_token(secret, "HS256", role)
        proc, auth_url = start_service("admission", no_ingress | {
            "DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
            "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode()},
            log_dir / "admission-auth.log")
        procs.append(proc)

        tenant = "bench" + uuid.uuid4().hex[:8]
        with httpx.Client(base_url=policy_url, timeout=10) as c:
            c.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": []}).raise_for_status()
            c.put(f"/admin/v2/namespaces/{tenant}/ns").raise_for_status()
            c.post(f"/admin/v2/namespaces/{tenant}/ns/delayedDelivery",
                   json={"active": True, "maxDeliveryDelayInMillis": 7_200_000}
                   ).raise_for_status()
            c.post(f"/admin/v2/namespaces/{tenant}/ns/permissions/{role}",
                   json=["produce"]).raise_for_status()
        topic = f"persistent://{tenant}/ns/load"
        path = f"/topics/persistent/{tenant}/ns/load"
        with httpx.Client(base_url=adm_url, timeout=10) as c:
            deadline = time.monotonic() + 30
            while c.post(path, json={"messages": [{"payload": "probe"}]}).status_code == 404:
                if time.monotonic() > deadline:
                    raise RuntimeError("admission never learnt the bench namespace")
                time.sleep(0.1)
            while not c.get("/readyz").json().get("ingressAssigned"):
                if time.monotonic() > deadline:
                    raise RuntimeError("admission ingress never got partitions")
                time.sleep(0.1)
        with httpx.Client(base_url=off_url, timeout=10) as c:
            while c.post(path, json={"messages": [{"payload": "probe"}]}).status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("admission (auth off) never learnt the bench namespace")
                time.sleep(0.1)
        with httpx.Client(base_url=auth_url, timeout=10,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            while c.post(path, json={"messages": [{"payload": "probe"}]}).status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("admission (auth on) never learnt the permission")
                time.sleep(0.1)

        print(f"admit(): {ADMIT_CALLS} decisions ...", flush=True)
        admit_rate = bench_admit()
        guard_us = bench_guard(secret, token, role)
        # A round not counted: freshly started servers (Kafka's JIT above all) made the
        # first round ~40% slower than the next, for HTTP and raw alike.
        print("warm-up round (not counted) ...", flush=True)
        run_async(bench_http(adm_url, path))
        run_async(bench_auth_pair(off_url, auth_url, path, token, on_first=False))
        bench_raw(stack.kafka_bootstrap, topic, names.TopicName.parse(topic).kafka_topic)
        rounds: list[tuple[dict[str, float], float]] = []
        authed: list[tuple[dict[str, float], dict[str, float]]] = []
        for n in range(ROUNDS):
            print(f"round {n + 1}/{ROUNDS}: HTTP, {HTTP_CONCURRENCY} concurrent clients x "
                  f"{HTTP_SECONDS:.0f} s; raw producer x {RAW_SECONDS:.0f} s ...", flush=True)
            http_n = run_async(bench_http(adm_url, path))
            raw_n = bench_raw(stack.kafka_bootstrap, topic,
                              names.TopicName.parse(topic).kafka_topic)
            print(f"    HTTP {http_n['msgs_per_s']:,.0f} msgs/s, raw {raw_n:,.0f} msgs/s, "
                  f"ratio {http_n['msgs_per_s'] / raw_n:.3f}", flush=True)
            rounds.append((http_n, raw_n))
        for n in range(AUTH_ROUNDS):
            on_first = n % 2 == 1
            order = "on, then off" if on_first else "off, then on"
            print(f"auth pair {n + 1}/{AUTH_ROUNDS}: {order}, "
                  f"{HTTP_CONCURRENCY} clients x {HTTP_SECONDS:.0f} s each ...", flush=True)
            off_n, auth_n = run_async(bench_auth_pair(off_url, auth_url, path, token, on_first))
            print(f"    auth off {off_n['msgs_per_s']:,.0f}, on {auth_n['msgs_per_s']:,.0f} "
                  f"msgs/s, on/off {auth_n['msgs_per_s'] / off_n['msgs_per_s']:.3f}",
                  flush=True)
            authed.append((off_n, auth_n))
        print(f"HTTP, {MANY_CLIENTS} concurrent clients x {HTTP_SECONDS:.0f} s ...", flush=True)
        many = run_async(bench_http(adm_url, path, MANY_CLIENTS))
        print(f"Kafka ingress: {INGRESS_REQUESTS} requests ...", flush=True)
        ingress = bench_ingress(stack.kafka_bootstrap, topic)
    finally:
        for proc in procs:
            proc.stop()
        # Others may be using servers this run had to start: keep them when asked to.
        if os.environ.get("DWELL_TEST_KEEP_SERVERS") != "1":
            stack.down(started)
            for name in started:
                stack.discard(name)

    http = median([h for h, _ in rounds], key=lambda h: h["msgs_per_s"])
    raw = median([r for _, r in rounds], key=float)
    ratio = median([h["msgs_per_s"] / r for h, r in rounds], key=float)
    off_http = median([o for o, _ in authed], key=lambda h: h["msgs_per_s"])
    auth_http = median([a for _, a in authed], key=lambda h: h["msgs_per_s"])
    auth_ratio = median([a["msgs_per_s"] / o["msgs_per_s"] for o, a in authed], key=float)
    result = {
        "admit_per_s": round(admit_rate),
        "http": {k: round(v, 2) for k, v in http.items()},
        "http_many_clients": {"clients": MANY_CLIENTS} | {k: round(v, 2)
                                                          for k, v in many.items()},
        "ingress": {k: round(v, 2) for k, v in ingress.items()},
        "raw_msgs_per_s": round(raw),
        "ratio_http_to_raw": round(ratio, 3),
        "rounds": [{"http_msgs_per_s": round(h["msgs_per_s"]), "raw_msgs_per_s": round(r)}
                   for h, r in rounds],
        "ratio_ingress_to_raw": round(ingress["msgs_per_s"] / raw, 3),
        "http_auth_off": {k: round(v, 2) for k, v in off_http.items()},
        "http_auth_on": {k: round(v, 2) for k, v in auth_http.items()},
        "ratio_auth_on_to_off": round(auth_ratio, 3),
        "auth_rounds": [{"off_msgs_per_s": round(o["msgs_per_s"]),
                         "on_msgs_per_s": round(a["msgs_per_s"])} for o, a in authed],
        "auth_check_us_per_request": round(guard_us, 2),
        "batch": BATCH, "payload_bytes": len(PAYLOAD), "targets": TARGETS,
    }
    mark = lambda ok: "ok" if ok else "MISS"  # noqa: E731
    print()
    print(f"(a) admit()            {result['admit_per_s']:>12,} decisions/s   "
          f"target >= 500,000  {mark(admit_rate >= 500_000)}")
    print(f"(b) HTTP publish       {http['msgs_per_s']:>12,.0f} msgs/s        "
          f"target >= 20,000   {mark(http['msgs_per_s'] >= 20_000)}   "
          f"p50 {http['p50_ms']:.1f} ms  p99 {http['p99_ms']:.1f} ms  "
          f"({http['requests']:.0f} requests of {BATCH})")
    print(f"    at {MANY_CLIENTS} clients      {many['msgs_per_s']:>12,.0f} msgs/s        "
          f"                        p50 {many['p50_ms']:.1f} ms  p99 {many['p99_ms']:.1f} ms")
    print(f"(c) Kafka ingress      {ingress['msgs_per_s']:>12,.0f} msgs/s")
    print(f"(d) raw Kafka producer {raw:>12,.0f} msgs/s")
    print(f"    (b) and (d): medians of {ROUNDS} alternating rounds; the ratio is the median "
          f"of the per-round ratios")
    print(f"    HTTP / raw    = {result['ratio_http_to_raw']:.3f}   target >= 0.7  "
          f"{mark(result['ratio_http_to_raw'] >= 0.7)}")
    print(f"    ingress / raw = {result['ratio_ingress_to_raw']:.3f}")
    print(f"(e) HTTP, auth off     {off_http['msgs_per_s']:>12,.0f} msgs/s        "
          f"                        p50 {off_http['p50_ms']:.1f} ms  "
          f"p99 {off_http['p99_ms']:.1f} ms")
    print(f"    HTTP, auth on      {auth_http['msgs_per_s']:>12,.0f} msgs/s        "
          f"                        p50 {auth_http['p50_ms']:.1f} ms  "
          f"p99 {auth_http['p99_ms']:.1f} ms")
    print(f"    medians of {AUTH_ROUNDS} pairs, each side loaded alone by {HTTP_CONCURRENCY} "
          f"clients, the order alternating; the ratio is the median of the per-pair ratios")
    print(f"    auth on / off = {auth_ratio:.3f}   (drop {(1 - auth_ratio) * 100:.1f}%, "
          f"target < 10%)  {mark(auth_ratio > 0.9)}")
    print(f"    the check itself: {guard_us:.2f} us per request (cached token, produce "
          f"permission), {guard_us / 1e6 * http['requests'] / HTTP_SECONDS * 100:.3f}% of "
          f"a core at (b)'s request rate")
    out = ROOT / "bench" / "out" / "admission.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    # Its knobs are the BENCH_* environment variables above; --help only describes them.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
