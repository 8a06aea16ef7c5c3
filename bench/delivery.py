"""Delivery benchmark of the drain (issue: delivery, Spark job), against the test profile's
Redis (database 9, flushed; the shared policy service keeps the profile's own database) and
Kafka. Every measured part runs as its own process, so no two share a GIL:

1. Fixed-delay throughput: N messages written to dwell.delayed with one deliverAt and
   indexed in-process, then one drain round timed per copy path (driver, tasks; see
   dwell_spark.drain.choose_path) on an in-process Spark session that runs
   nothing else. Target >= 50,000 msg/s. The session is stopped before section 2.
2. Uniform delays: the stack is started as real processes (`python -m dwell.tracker` with a
   fresh group starting at the end of dwell.delayed, `python -m dwell_spark` with the drain
   and backoff queries, later policy and admission). A publisher process writes 2,000 msg/s
   for --uniform-seconds to dwell.delayed (the records admission would write), deliverAt
   uniform over [now, now + 10 min]; the tracker indexes them and re-files each 20 s chunk
   of buckets 40 s before it is due (dwell.tracker.restage). Measured: drain lag
   (dwell_drain_lag_ms scraped from the Spark app's /metrics every 0.5 s) and lateness of
   the messages that came due during the run. Messages due later are not waited for.
3. Lateness at 5,000 msg/s, deliverAt = now + uniform 1-5 s, tickTime 1 s, for
   --lateness-seconds; target p99 <= tickTime + 1 s. dwell first (publisher process ->
   dwell.delayed -> tracker -> Spark app drain -> ready topics), then, with the same seeded
   workload, a naive baseline: the publisher process ZADDs to a Redis ZSET and a baseline
   process (a Python loop polling the ZSET by score every 10 ms, BullMQ-style) moves due
   members to its own Kafka topic with the same acks=all producer. They run one after the
   other, so they never share the CPU (the Spark app idles, drain trigger 250 ms, during
   the baseline run). Lateness = when a reader process reads the record - deliverAt;
   negative = early (PIP-448 non-strict delivers a bucket up to one tickTime early).
4. Backoff schedule: policy and admission join the stack; an SDK Consumer
   (dwell.client.Consumer, ackTimeout 2 s, ackTimeoutRedeliveryBackoff 1 s..4 s x2) never
   acks one message published through admission and receives it 4 more times; measured
   redelivery times are set against the PIP-130 schedule (gaps 3, 4, 6, 6 s). The Spark
   app shares dwell.acks with anything else running on the profile, as e2e does.
5. A burst (not in the default run; --only 5): --burst-messages records of one topic
   written to dwell.delayed flat out, deliverAt = publish time + uniform 60-120 s, the
   workload issue 30 compares against a Go Kafka scheduler. The tracker indexes and
   re-files it (`--restage-ahead-chunks` sets how many chunks a large round takes after
   the due one); measured: lateness of every message, delivered and lost, the drain lag.
6. The same burst through kms (not in the default run; --only 6), the Go Kafka scheduler
   github.com/etf1/kafka-message-scheduler v0.0.9 as its module ships (scripts/devtools.py
   builds it): the same seeded workload written flat out to its schedules topic, each
   record due at the whole second (`scheduler-epoch`) at or after its deliverAt, against
   which its lateness is measured. With 5, dwell's tracker and Spark app are stopped
   first, so the two never share the CPU; both print the rate Kafka acked the burst at.

    .venv/bin/python bench/delivery.py [--quick]
    .venv/bin/python bench/delivery.py --only 5 --burst-messages 1000000
    .venv/bin/python bench/delivery.py --only 5,6 --burst-messages 1000000   # make bench-peers

Writes bench/out/delivery-lateness.png and bench/out/backoff-schedule.png. Every process
it starts is stopped on exit, failure or Ctrl-C (services run in their own process groups)."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import redis as redislib

from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell.tracker import recovery
from dwell_dev import devstack, devtools
from dwell_dev.benchkit import (
    BENCH_REDIS_DB,
    SPAWN,
    Procs,
    gauge,
    load_avg,
    wait_healthy,
    wait_line,
)
from dwell_dev.testkit import free_port, now_ms, redis_db_url

ROOT = Path(__file__).resolve().parent.parent

TICK = 1000
OUT = ROOT / "bench" / "out"
ACK_TIMEOUT_MS = 2000
BACKOFF = (1000, 4000, 2.0)  # ackTimeoutRedeliveryBackoff min, max, multiplier


def delayed(topic: str, i: int, deliver_at: int) -> kafka.OutRecord:
    """A record as admission writes it to dwell.delayed (docs/internals.md's headers)."""
    return (names.DELAYED, b"x" * 200, topic.encode(),
            [("dwell-topic", topic.encode()), ("dwell-publish-time", str(now_ms()).encode()),
             ("dwell-deliver-at", str(deliver_at).encode()),
             ("dwell-tick-time", str(TICK).encode()), ("dwell-key", f"k{i}".encode()),
             ("dwell-producer", b"bench")], None)


def kms_schedule(schedules: str, target: str, i: int, deliver_at: int) -> kafka.OutRecord:
    """A kms schedule of the same message: due at the whole second at or after
    ``deliver_at`` (kms's `scheduler-epoch` is in seconds), which is what its lateness is
    measured against (kms copies the other headers to the message it triggers)."""
    epoch = -(-deliver_at // 1000)
    key = f"k{i}".encode()
    return (schedules, b"x" * 200, key,
            [("scheduler-epoch", str(epoch).encode()),
             ("scheduler-target-topic", target.encode()), ("scheduler-target-key", key),
             ("dwell-deliver-at", str(epoch * 1000).encode())], None)


def make_topics(bootstrap: str, n: int) -> list[str]:
    run = f"b{uuid.uuid4().hex[:8]}"
    topics = [f"persistent://{run}/ns/t{i}" for i in range(n)]
    for t in topics:
        kafka.ensure_topic(bootstrap, TopicName.parse(t).kafka_topic, 4)
    return topics


def pct(xs: list[int] | np.ndarray) -> str:
    a = np.asarray(xs)
    if not len(a):
        return "no messages"
    return (f"p50 {np.percentile(a, 50):6.0f} ms  p99 {np.percentile(a, 99):6.0f} ms  "
            f"max {a.max():6.0f} ms  (n={len(a)})")


# -- 1. throughput of one drain round (in-process Spark, nothing else running)

def section_throughput(st: devstack.Stack, redis_url: str, sizes: list[int], tmp: Path) -> None:
    from dwell.index.topic import TopicIndex
    from dwell_spark import drain
    from dwell_spark.__main__ import session
    from dwell_spark.drain import Drainer
    from dwell_spark.settings import SparkSettings

    settings = SparkSettings(redis_url=redis_url, kafka_bootstrap=st.kafka_bootstrap,
                             spark_jars=",".join(str(p) for p in devstack.spark_kafka_jars()),
                             spark_checkpoint_dir=str(tmp / "inproc-checkpoints"))
    r = redis_adapter.connect(redis_url)

    def publish(p: kafka.Producer, recs: list[kafka.OutRecord]) -> None:
        pos = p.send_many(recs)
        p.flush()
        rows: dict[str, list[tuple[int, int, int, int]]] = {}
        for (_, _, key, hdrs, _), (part, off) in zip(recs, pos.result(30), strict=True):
            rows.setdefault(key.decode(), []).append((part, off, int(hdrs[2][1]), TICK))
        for t, rs in rows.items():
            TopicIndex(r, t).add(rs)

    def throughput(d: Drainer, n: int, path: str) -> float:
        topics = make_topics(st.kafka_bootstrap, 4)
        at = now_ms() - 1
        p = kafka.Producer(st.kafka_bootstrap, linger_ms=20)
        for a in range(0, n, 20000):
            publish(p, [delayed(topics[i % 4], i, at) for i in range(a, min(n, a + 20000))])
        p.close()
        t0 = time.monotonic()
        written = d.run_once(now_ms(), path=path)
        took = time.monotonic() - t0
        assert written == n, (written, n)
        return n / took

    print("== 1. fixed-delay drain throughput, one round (target >= 50,000 msg/s)", flush=True)
    spark = session(settings)
    # One drainer for every round, as in the app (its Kafka clients live across rounds).
    d = Drainer(spark, settings, r)
    try:
        throughput(d, 2000, "tasks")  # warm-up: JVM, workers, the driver's clients
        throughput(d, 2000, "driver")
        for n in sizes:
            best = ("", 0.0)
            for path in ("driver", "tasks"):
                rate = throughput(d, n, path)
                print(f"  {n:>7} msgs  {path:<13} {rate:>9,.0f} msg/s  "
                      f"{'MET' if rate >= 50000 else 'missed'}", flush=True)
                best = max(best, (path, rate), key=lambda b: b[1])
            chosen = drain.choose_path(settings, [drain.Range("x", names.DELAYED, 0, 0, n - 1)])
            print(f"  {n:>7} msgs  fastest: {best[0]}; choose_path picks: {chosen}  "
                  f"({load_avg()})", flush=True)
    finally:
        d.copier.close()
        spark.stop()
        r.flushdb()


# -- worker processes (spawned; module-level so spawn can import them)

def _quiet_sigint() -> None:
    # Ctrl-C reaches the whole foreground group; the parent stops us in its finally.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def publisher(bootstrap: str, redis_url: str, kind: str, topics: list[str], rate: int,
              seconds: float, delay_ms: tuple[int, int], seed: int, zkey: str,
              start: Any, done: Any, published: Any, due_by_end: Any, acked_rate: Any) -> None:
    """``rate`` msg/s for ``seconds`` in 0.1 s steps, deliverAt = now + uniform(delay_ms),
    seeded so dwell and its peers get the same workload. kind "dwell": records to
    dwell.delayed (the tracker indexes them); kind "kms": schedules to ``topics[0]`` for
    ``topics[1]``; kind "baseline": ZADD member -> deliverAt. ``acked_rate``: messages
    per second from the first send until Kafka acked the last."""
    _quiet_sigint()
    rnd = random.Random(seed)
    p = kafka.Producer(bootstrap, linger_ms=5) if kind != "baseline" else None
    r = redis_adapter.connect(redis_url)
    start.wait()
    step, i, due = 0.1, 0, 0
    t_start = time.monotonic()
    end = now_ms() + int(seconds * 1000)
    futures = []
    # A fixed number of steps on a fixed clock: both kinds publish the same messages even
    # when a step runs long (the next one then starts at once).
    for k in range(int(seconds / step)):
        time.sleep(max(0.0, t_start + k * step - time.monotonic()))
        now = now_ms()
        ats = [now + rnd.randint(*delay_ms) for _ in range(int(rate * step))]
        if kind == "kms":
            futures.append(p.send_many([kms_schedule(topics[0], topics[1], i + j, at)
                                        for j, at in enumerate(ats)]))
        elif p is not None:
            futures.append(p.send_many([delayed(topics[(i + j) % len(topics)], i + j, at)
                                        for j, at in enumerate(ats)]))
        else:
            r.zadd(zkey, {f"m{i + j}": at for j, at in enumerate(ats)})
        due += sum(at <= end for at in ats)
        i += len(ats)
    if p is not None:
        p.flush()
        for f in futures:
            f.result(30)
        p.close()
    acked_rate.value = i / (time.monotonic() - t_start)
    due_by_end.value = due
    published.value = i
    done.set()


def baseline_loop(bootstrap: str, redis_url: str, zkey: str, target: str, stop: Any) -> None:
    """The naive baseline: poll a ZSET for due members every 10 ms, move them to Kafka."""
    _quiet_sigint()
    r = redis_adapter.connect(redis_url)
    p = kafka.Producer(bootstrap, linger_ms=0)
    while not stop.is_set():
        due = r.zrangebyscore(zkey, "-inf", now_ms(), start=0, num=5000, withscores=True)
        if due:
            r.zrem(zkey, *[m for m, _ in due])
            fut = p.send_many([(target, b"x" * 200, m, [("dwell-deliver-at",
                                                        str(int(s)).encode())], None)
                               for m, s in due])
            p.flush()
            fut.result(30)
        else:
            time.sleep(0.01)
    p.close()


def reader(bootstrap: str, topics: list[str], assigned: Any, stop: Any, want: Any,
           out: Any) -> None:
    """Reads ``topics`` from their start; lateness = read time - dwell-deliver-at, one per
    Kafka key (a drain that re-emits a bucket sends a copy twice). Ends when ``stop`` is set
    or ``want`` (> 0) records were read; sends the lateness list and the number of copies
    read twice on ``out``."""
    _quiet_sigint()
    c = kafka.Consumer(bootstrap, f"bench-{uuid.uuid4().hex}", auto_offset_reset="earliest")
    c.subscribe(topics, on_assign=lambda *_: assigned.set())
    seen: set[bytes] = set()
    late: list[int] = []
    dups = 0
    while not stop.is_set() and not (0 < want.value <= len(late)):
        recs = c.poll(5000, 0.2)
        t = now_ms()
        for rec in recs:
            if rec.key in seen:
                dups += 1
                continue
            seen.add(rec.key)
            late.append(t - int(rec.headers["dwell-deliver-at"]))
    c.close()
    out.put((late, dups))


def drain_lag(metrics_url: str) -> int:
    return gauge(metrics_url, "dwell_drain_lag_ms")


def load(procs: Procs, st: devstack.Stack, redis_url: str, kind: str, read_topics: list[str],
         topics: list[str], rate: int, seconds: float, delay_ms: tuple[int, int], seed: int,
         zkey: str = "", wait_all: float = 30,
         on_tick: Any = None, acked: Any = None,
         dups: Any = None) -> tuple[np.ndarray, int, int]:
    """One publisher process and one reader process; returns (lateness, published, due by
    the end). With ``wait_all`` > 0 the reader waits (up to that many seconds after the
    publisher ends) for every message, else it reads for 3 s more. ``acked``: a
    ``SPAWN.Value("d")`` that gets the rate Kafka acked the messages at; ``dups``: a list
    that gets the number of messages read more than once."""
    start, done, assigned, stop = SPAWN.Event(), SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    published, due, want = SPAWN.Value("q", 0), SPAWN.Value("q", 0), SPAWN.Value("q", 0)
    acked = acked if acked is not None else SPAWN.Value("d", 0.0)
    out = SPAWN.Queue()
    rd = procs.worker(reader, st.kafka_bootstrap, read_topics, assigned, stop, want, out)
    pub = procs.worker(publisher, st.kafka_bootstrap, redis_url, kind, topics, rate, seconds,
                       delay_ms, seed, zkey, start, done, published, due, acked)
    if not assigned.wait(30):
        raise RuntimeError("reader got no partitions in 30 s")
    time.sleep(1)  # the publisher process finishes importing meanwhile
    start.set()
    while not done.wait(0.5):
        procs.check()
        if on_tick:
            on_tick()
        if not pub.is_alive():
            raise RuntimeError(f"publisher exited {pub.exitcode}")
    if wait_all:
        want.value = published.value
        deadline = time.monotonic() + wait_all
        while rd.is_alive() and time.monotonic() < deadline and out.empty():
            procs.check()
            if on_tick:
                on_tick()
            time.sleep(0.5)
    else:
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:
            if on_tick:
                on_tick()
            time.sleep(0.5)
    stop.set()
    got, twice = out.get(timeout=30)
    late = np.asarray(got)
    if dups is not None:
        dups.append(twice)
    rd.join(10)
    pub.join(10)
    return late, published.value, due.value


def make_namespace_topic(policy: str, admission: str) -> str:
    """A namespace with delayed delivery (tickTime 1 s) and its topic, once admission has
    the policy from the feed (as tests/e2e/conftest.make_topic)."""
    import httpx
    tenant = "bench" + uuid.uuid4().hex[:8]
    with httpx.Client(base_url=policy, timeout=10) as c:
        for resp in (c.put(f"/admin/v2/tenants/{tenant}",
                           json={"adminRoles": [], "allowedClusters": []}),
                     c.put(f"/admin/v2/namespaces/{tenant}/ns"),
                     c.post(f"/admin/v2/namespaces/{tenant}/ns/delayedDelivery",
                            json={"active": True, "tickTime": TICK,
                                  "maxDeliveryDelayInMillis": 60000})):
            assert resp.status_code < 300, (resp.status_code, resp.text)
    with httpx.Client(base_url=admission, timeout=10) as c:
        deadline = time.monotonic() + 30
        while True:
            resp = c.post(f"/topics/persistent/{tenant}/ns/orders",
                          json={"producerName": "probe",
                                "messages": [{"payload": "x", "deliverAfterMs": 120000}]})
            body = resp.json() if resp.status_code == 200 else {}
            if body.get("messagePublishResults", [{}])[0].get("errorCode") == 2:
                return f"persistent://{tenant}/ns/orders"
            if time.monotonic() > deadline:
                raise RuntimeError(f"policy never reached admission: {resp.text}")
            time.sleep(0.1)


def section_backoff(policy: str, admission: str, tracker: str, bootstrap: str) -> None:
    from dwell.client import Consumer, ExponentialRedeliveryBackoff, Producer

    lo, hi, mult = BACKOFF
    b = ExponentialRedeliveryBackoff(min_delay_ms=lo, max_delay_ms=hi, multiplier=mult)
    want_gaps = [ACK_TIMEOUT_MS + b.next(n) for n in range(4)]
    print(f"\n== 4. ack-timeout redeliveries: ackTimeout {ACK_TIMEOUT_MS} ms, backoff "
          f"{lo}..{hi} ms x{mult:g}, never acked (PIP-130 gaps {want_gaps} ms)", flush=True)
    topic = make_namespace_topic(policy, admission)
    c = Consumer(topic, "slow", ack_timeout_ms=ACK_TIMEOUT_MS,
                 ack_timeout_redelivery_backoff=b, initial_position="earliest",
                 bootstrap=bootstrap, tracker_url=tracker)
    got: list[tuple[int, int]] = []  # (receive time ms, redelivery count)
    try:
        with Producer(topic, admission_url=admission) as p:
            mid = p.send(b"never-acked")
        deadline = time.monotonic() + 20 + sum(want_gaps) / 1000 * 3
        last = None
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.receive(0.05)
            if m is not None:
                assert m.message_id == mid, (m.message_id, mid)
                got.append((now_ms(), m.redelivery_count))
                last = m
        if last is not None:
            c.acknowledge(last)  # done: no timer left behind
    finally:
        c.close()
    if len(got) < 5:
        print(f"  only {len(got)} copies received: {got}")
    gaps = [t1 - t0 for (t0, _), (t1, _) in zip(got, got[1:], strict=False)]
    cum = [t - got[0][0] for t, _ in got[1:]]
    want_cum = list(np.cumsum(want_gaps)[:len(cum)])
    print(f"  redelivery counts {[n for _, n in got]}")
    print(f"  gaps ms:       measured {gaps}  PIP-130 {want_gaps}")
    print(f"  cumulative ms: measured {cum}  PIP-130 {[int(x) for x in want_cum]}")
    print(f"  late vs schedule ms: {[g - w for g, w in zip(gaps, want_gaps, strict=False)]}  "
          f"({load_avg()})")
    plot_backoff(cum, want_gaps)
    print(f"  wrote {OUT / 'backoff-schedule.png'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 20k messages, 10 s uniform, 8 s lateness")
    ap.add_argument("--sizes", default="20000,100000")
    ap.add_argument("--uniform-seconds", type=float, default=60)
    ap.add_argument("--lateness-seconds", type=float, default=30)
    ap.add_argument("--burst-messages", type=int, default=1_000_000)
    ap.add_argument("--restage-ahead-chunks", type=int, default=None,
                    help="the tracker's DWELL_RESTAGE_AHEAD_CHUNKS (default: the setting's)")
    ap.add_argument("--kms-log-level", default="warn",
                    help="kms's LOG_LEVEL in section 6 (its default, info, logs three lines "
                    "per message)")
    ap.add_argument("--only", default="1,2,3,4",
                    help="sections to run, e.g. 3 or 1,4 (default: all)")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep the processes' logs even when the run succeeds")
    args = ap.parse_args()
    only = {int(x) for x in args.only.split(",")}
    if args.quick:
        args.sizes, args.uniform_seconds, args.lateness_seconds = "20000", 10, 8
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    st = devstack.Stack("test")
    redis_url = redis_db_url(st, BENCH_REDIS_DB)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    r = redis_adapter.connect(redis_url)
    try:
        r.flushdb()
    except redislib.ConnectionError as exc:
        sys.exit(f"test profile's Redis not reachable at {redis_url} ({exc}); the bench "
                 "needs the test stack running (scripts/devstack.py)")
    if not kafka.ping(st.kafka_bootstrap):
        sys.exit(f"test profile's Kafka not reachable at {st.kafka_bootstrap}")
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="dwell-bench-"))
    procs = Procs(tmp)
    print(f"   (process logs in {tmp}; removed after a run that succeeds unless "
          "--keep-logs)", flush=True)
    t_bench = time.monotonic()
    ok = False
    try:
        if 1 in only:
            # In a child process: its Spark JVM ends with it instead of idling beside the
            # stack the later sections time.
            child = SPAWN.Process(target=section_throughput, args=(
                st, redis_url, [int(x) for x in args.sizes.split(",")], tmp))
            child.start()
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"section 1 failed (exit {child.exitcode})")
        if not only - {1}:
            ok = True
            return

        bursts: dict[str, dict[str, float]] = {}
        if only & {2, 3, 4, 5}:
            svc, tracker, metrics_url = start_dwell(procs, st, redis_url, tmp,
                                                    args.restage_ahead_chunks)

        if 2 in only:
            section_uniform(procs, st, redis_url, metrics_url, args.uniform_seconds)
        if 3 in only:
            section_lateness(procs, st, redis_url, metrics_url, args.lateness_seconds)
        if 4 in only:
            section_backoff_stack(procs, svc, tracker, st.kafka_bootstrap)
        if 5 in only:
            bursts["dwell"] = section_burst(procs, st, redis_url, metrics_url,
                                            args.burst_messages)
        if 6 in only:
            # dwell's processes end first: kms gets the machine to itself, as dwell had.
            report_spark_log(tmp)
            procs.stop_all()
            procs = Procs(tmp)
            bursts["kms"] = section_kms(procs, st, redis_url, args.burst_messages,
                                        args.kms_log_level)
        if len(bursts) == 2:
            print_peers(bursts)
        ok = True
    finally:
        if 6 not in only or not ok:
            report_spark_log(tmp)
        procs.stop_all()
        r.flushdb()
        print(f"\n   (bench took {time.monotonic() - t_bench:.0f} s)")
        if ok and not args.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"   logs kept in {tmp}")


def report_spark_log(tmp: Path) -> None:
    """The Spark app's errors and failed rounds; read before its stop, which logs errors
    of its own. Failed or lost rounds come back only after drain_lease_ms: a figure that
    far off is one of them."""
    spark_log = tmp / "spark.log"
    if spark_log.exists():
        bad = [ln for ln in spark_log.read_text(errors="replace").splitlines()
               if " ERROR " in ln or "round failed" in ln or "lost before" in ln]
        print(f"\n   Spark app log during the run: {len(bad)} error/failed-round lines"
              + "".join(f"\n     {ln[:160]}" for ln in bad[:5]))


def start_dwell(procs: Procs, st: devstack.Stack, redis_url: str, tmp: Path,
                restage_ahead_chunks: int | None) -> tuple[dict[str, str], str, str]:
    """dwell's tracker and Spark app as processes, on Redis ``redis_url``; returns the
    services' environment, the tracker's URL and the Spark app's metrics URL."""
    # The tracker's fresh group starts where the delay logs end now.
    group = f"dwell-tracker-bench-{uuid.uuid4().hex[:8]}"
    recovery.start_group_at_end(st.kafka_bootstrap, group, [names.DELAYED, names.REFILED])
    svc = st.service_env()
    tracker = f"http://127.0.0.1:{free_port()}"
    procs.start("tracker", ["-m", "dwell.tracker"], svc | {
        "DWELL_REDIS_URL": redis_url, "DWELL_TRACKER_GROUP_ID": group,
        "DWELL_HTTP_PORT": tracker.rsplit(":", 1)[1]} | (
        {} if restage_ahead_chunks is None else
        {"DWELL_RESTAGE_AHEAD_CHUNKS": str(restage_ahead_chunks)}))
    metrics_port = free_port()
    spark_log = procs.start("spark", ["-m", "dwell_spark"], svc | {
        "DWELL_REDIS_URL": redis_url,
        "DWELL_SPARK_JARS": ",".join(str(p) for p in devstack.spark_kafka_jars()),
        "DWELL_SPARK_CHECKPOINT_DIR": str(tmp / "checkpoints"),
        "DWELL_SPARK_METRICS_PORT": str(metrics_port),
        "DWELL_ACKS_STARTING_OFFSETS": "latest", "PYSPARK_PYTHON": sys.executable,
        "DWELL_DRAIN_TRIGGER_MS": "250", "DWELL_BACKOFF_TRIGGER_MS": "250",
        "DWELL_REDELIVERY_TICK_MS": "100", "DWELL_LOG_LEVEL": "info"}, cwd=ROOT / "spark")
    t0 = time.monotonic()
    wait_healthy(procs, tracker)
    wait_line(procs, spark_log, "drain ready")
    wait_line(procs, spark_log, "backoff first batch done")
    print(f"\n   (tracker and Spark app up as processes in {time.monotonic() - t0:.0f} s)")
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    return svc, tracker, metrics_url


def section_uniform(procs: Procs, st: devstack.Stack, redis_url: str, metrics_url: str,
                    seconds: float) -> None:
    print(f"\n== 2. uniform delays over 10 min at 2,000 msg/s for {seconds:.0f}s "
          "(target: keeps up, lag bounded)", flush=True)
    lag: list[int] = []
    at: list[float] = []
    topics = make_topics(st.kafka_bootstrap, 4)
    ready = [TopicName.parse(t).kafka_topic for t in topics]

    def sample() -> None:
        lag.append(drain_lag(metrics_url))
        at.append(time.monotonic())

    late, published, due = load(procs, st, redis_url, "dwell", ready, topics, 2000,
                                seconds, (0, 600_000), 1, wait_all=0, on_tick=sample)
    print(f"  published {published}, due during the run {due}, delivered {len(late)} "
          f"({len(late) / max(1, due):.1%})")
    print(f"  drain lag: max {max(lag)} ms, mean {np.mean(lag):.0f} ms over {len(lag)} "
          "samples")
    # Per minute: bounded lag means the drain keeps up (the due rate grows for the first
    # 10 minutes, as more of what was published comes due).
    t0 = at[0]
    for m in range(int((at[-1] - t0) // 60) + 1):
        xs = [x for x, t in zip(lag, at, strict=True) if m * 60 <= t - t0 < (m + 1) * 60]
        if xs:
            print(f"    minute {m + 1}: lag max {max(xs)} ms, mean {np.mean(xs):.0f} ms")
    print(f"  lateness of those: {pct(late)}  ({load_avg()})")


BURST_SPREAD = (60_000, 120_000)  # deliverAt = publish time + uniform, ms


def section_burst(procs: Procs, st: devstack.Stack, redis_url: str, metrics_url: str,
                  messages: int) -> dict[str, float]:
    spread = BURST_SPREAD
    print(f"\n== 5. a burst of {messages:,} to one topic, published flat out, deliverAt = "
          f"publish time + {spread[0] // 1000}-{spread[1] // 1000} s", flush=True)
    topics = make_topics(st.kafka_bootstrap, 1)
    ready = [TopicName.parse(t).kafka_topic for t in topics]
    lag: list[int] = []
    dups: list[int] = []
    acked = SPAWN.Value("d", 0.0)
    t0 = time.monotonic()
    # Ten steps of a tenth each on a 0.1 s clock: each starts as soon as the last is sent.
    late, published, _ = load(procs, st, redis_url, "dwell", ready, topics, messages, 1.0,
                              spread, 5, wait_all=spread[1] / 1000 + 180,
                              on_tick=lambda: lag.append(drain_lag(metrics_url)),
                              acked=acked, dups=dups)
    print(f"  published {published:,} (Kafka acked {acked.value:,.0f} msg/s); delivered "
          f"{len(late):,}, lost {published - len(late):,}, read twice {dups[0]:,} "
          "(read until all came or "
          f"{spread[1] // 1000 + 180} s after the last was sent; "
          f"{time.monotonic() - t0:.0f} s in all)")
    print(f"  drain lag: max {max(lag)} ms, mean {np.mean(lag):.0f} ms over {len(lag)} samples")
    print(f"  lateness: {pct(late)}  ({load_avg()})", flush=True)
    return burst_figures(late, published, acked.value, dups[0])


def burst_figures(late: np.ndarray, published: int, acked_rate: float,
                  dups: int) -> dict[str, float]:
    return {"acked": acked_rate, "published": published, "delivered": len(late), "dups": dups,
            "p50": float(np.percentile(late, 50)) if len(late) else float("nan"),
            "p99": float(np.percentile(late, 99)) if len(late) else float("nan"),
            "max": float(late.max()) if len(late) else float("nan")}


def section_kms(procs: Procs, st: devstack.Stack, redis_url: str, messages: int,
                log_level: str) -> dict[str, float]:
    """The burst of section 5 (same seed) through kms: its schedules topic and the target
    topic get 4 partitions, as dwell's delay log and ready topic have; kms runs with its
    defaults but for ``log_level`` and the addresses of its HTTP and metrics servers (its
    pprof server keeps :6060)."""
    spread = BURST_SPREAD
    kms = devtools.build(devtools.KMS)
    print(f"\n== 6. the same burst of {messages:,} through kms ({devtools.KMS.module} "
          f"{devtools.KMS.version}, LOG_LEVEL={log_level}), delivered at the whole second "
          "at or after deliverAt", flush=True)
    run = f"kms-{uuid.uuid4().hex[:8]}"
    schedules, target, history, probe = (f"{run}-{x}" for x in
                                         ("schedules", "target", "history", "probe"))
    for t in (schedules, target, history, probe):
        kafka.ensure_topic(st.kafka_bootstrap, t, 4)
    procs.start("kms", [], {
        "BOOTSTRAP_SERVERS": st.kafka_bootstrap, "GROUP_ID": f"{run}-scheduler",
        "SCHEDULES_TOPICS": schedules, "HISTORY_TOPIC": history, "LOG_LEVEL": log_level,
        "SERVER_ADDR": f"127.0.0.1:{free_port()}", "METRICS_ADDR": f"127.0.0.1:{free_port()}"},
        program=str(kms))
    t0 = time.monotonic()
    kms_ready(procs, st.kafka_bootstrap, schedules, probe)
    print(f"   (kms up, a schedule due in 2 s delivered, in {time.monotonic() - t0:.0f} s)")
    acked = SPAWN.Value("d", 0.0)
    dups: list[int] = []
    t0 = time.monotonic()
    late, published, _ = load(procs, st, redis_url, "kms", [target], [schedules, target],
                              messages, 1.0, spread, 5, wait_all=spread[1] / 1000 + 180,
                              acked=acked, dups=dups)
    print(f"  published {published:,} (Kafka acked {acked.value:,.0f} msg/s); delivered "
          f"{len(late):,}, lost {published - len(late):,}, read twice {dups[0]:,} "
          f"({time.monotonic() - t0:.0f} s in all)")
    print(f"  lateness: {pct(late)}  ({load_avg()})", flush=True)
    print(f"  kms's peak RSS: {procs.peak_rss_mib('kms'):,.0f} MiB (it holds the day's "
          "schedules in memory)", flush=True)
    return burst_figures(late, published, acked.value, dups[0])


def kms_ready(procs: Procs, bootstrap: str, schedules: str, probe: str) -> None:
    """Returns once kms has delivered a schedule due 2 s from now to ``probe``."""
    c = kafka.Consumer(bootstrap, f"bench-{uuid.uuid4().hex}", auto_offset_reset="earliest")
    p = kafka.Producer(bootstrap)
    try:
        c.subscribe([probe])
        p.send_many([kms_schedule(schedules, probe, -1, now_ms() + 2000)]).result(30)
        deadline = time.monotonic() + 60
        while not c.poll(100, 0.5):
            procs.check()
            if time.monotonic() > deadline:
                raise RuntimeError("kms delivered no probe schedule in 60 s")
    finally:
        c.close()
        p.close()


def print_peers(bursts: dict[str, dict[str, float]]) -> None:
    print("\n  side by side (same workload, one after the other):")
    print(f"  {'':6} {'acked msg/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'delivered':>10} {'lost':>6} {'twice':>6}")
    for name, f in bursts.items():
        print(f"  {name:6} {f['acked']:12,.0f} {f['p50']:8,.0f} {f['p99']:8,.0f} "
              f"{f['max']:8,.0f} {f['delivered']:10,.0f} "
              f"{f['published'] - f['delivered']:6,.0f} {f['dups']:6,.0f}")
    d, k = bursts["dwell"]["p99"], bursts["kms"]["p99"]
    print(f"  dwell / kms: lateness p99 {d / max(k, 1):.2f}x "
          f"({'at or below' if d <= k else 'above'} kms's)", flush=True)


def section_lateness(procs: Procs, st: devstack.Stack, redis_url: str, metrics_url: str,
                     seconds: float) -> None:
    print(f"\n== 3. lateness at 5,000 msg/s for {seconds:.0f}s, deliverAt = "
          f"now + 1-5 s, tickTime {TICK} ms (target p99 <= {TICK + 1000} ms); "
          "dwell, then the baseline, same seeded workload", flush=True)
    topics = make_topics(st.kafka_bootstrap, 4)
    ready = [TopicName.parse(t).kafka_topic for t in topics]
    lag = []
    d_late, d_pub, _ = load(procs, st, redis_url, "dwell", ready, topics, 5000,
                            seconds, (1000, 5000), 2,
                            on_tick=lambda: lag.append(drain_lag(metrics_url)))
    print(f"  (dwell run: drain lag max {max(lag)} ms, mean {np.mean(lag):.0f} ms; "
          f"{load_avg()})", flush=True)
    zkey = f"bench:baseline:{uuid.uuid4().hex[:6]}"
    btopic = f"bench-baseline-{uuid.uuid4().hex[:6]}"
    kafka.ensure_topic(st.kafka_bootstrap, btopic, 4)
    stop = SPAWN.Event()
    base = procs.worker(baseline_loop, st.kafka_bootstrap, redis_url, zkey, btopic, stop)
    b_late, b_pub, _ = load(procs, st, redis_url, "baseline", [btopic], [], 5000,
                            seconds, (1000, 5000), 2, zkey=zkey)
    stop.set()
    base.join(10)
    print(f"  (baseline run: {load_avg()})")
    d99, b99 = np.percentile(d_late, 99), np.percentile(b_late, 99)
    print(f"  dwell     {pct(d_late)}  {'MET' if d99 <= TICK + 1000 else 'missed'}  "
          f"delivered {len(d_late)}/{d_pub}")
    print(f"  baseline  {pct(b_late)}  delivered {len(b_late)}/{b_pub}  "
          "(Python loop polling a Redis ZSET)")
    print(f"  dwell / baseline: p99 {d99 / max(b99, 1):.2f}x, "
          f"max {d_late.max() / max(1, b_late.max()):.2f}x")
    plot_lateness(d_late, b_late)
    print(f"  wrote {OUT / 'delivery-lateness.png'}")


def section_backoff_stack(procs: Procs, svc: dict[str, str], tracker: str,
                          bootstrap: str) -> None:
    policy = f"http://127.0.0.1:{free_port()}"
    admission = f"http://127.0.0.1:{free_port()}"
    # Policy and admission on the profile's own Redis, as in e2e: the feed's versions
    # come from its counter.
    procs.start("policy", ["-m", "dwell.policy"],
                svc | {"DWELL_HTTP_PORT": policy.rsplit(":", 1)[1]})
    procs.start("admission", ["-m", "dwell.admission"],
                svc | {"DWELL_HTTP_PORT": admission.rsplit(":", 1)[1],
                       "DWELL_POLICY_URL": policy, "DWELL_INGRESS_ENABLED": "false"})
    wait_healthy(procs, policy)
    wait_healthy(procs, admission)
    section_backoff(policy, admission, tracker, bootstrap)


def plot_lateness(dwell_late: np.ndarray, base_late: np.ndarray) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (h, cdf) = plt.subplots(1, 2, figsize=(12, 4.5))
    lo = min(dwell_late.min(), base_late.min())
    hi = max(dwell_late.max(), base_late.max())
    bins = np.linspace(lo, hi, 80)
    for data, label in ((dwell_late, "dwell (tracker + Spark drain, tickTime 1 s)"),
                        (base_late, "baseline: Python loop polling a ZSET")):
        h.hist(data, bins=bins, alpha=0.6, label=label)
        xs = np.sort(data)
        cdf.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label)
    for ax in (h, cdf):
        ax.axvline(TICK + 1000, color="red", linestyle="--", label="target p99 = tickTime + 1 s")
        ax.set_xlabel("lateness = read - deliverAt (ms); negative = early")
    h.set_ylabel("messages")
    cdf.set_ylabel("fraction delivered")
    cdf.axhline(0.99, color="grey", linewidth=0.5)
    h.set_title("Delivery lateness at 5,000 msg/s, separate processes, run one after the other")
    cdf.set_title("CDF")
    h.legend(fontsize=8)
    cdf.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(OUT / "delivery-lateness.png", dpi=110)
    plt.close(fig)


def plot_backoff(cum: list[int], want_gaps: list[int]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    want_cum = np.concatenate(([0], np.cumsum(want_gaps))) / 1000
    got = np.asarray([0, *cum]) / 1000
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(range(len(want_cum)), want_cum, "o--", label="PIP-130 schedule (3, 7, 13, 19 s)")
    ax.plot(range(len(got)), got, "s-", label="measured (SDK Consumer receive)")
    for n, (w, g) in enumerate(zip(want_cum[1:], got[1:], strict=False), start=1):
        ax.annotate(f"+{(g - w):.1f} s", (n, g), textcoords="offset points", xytext=(6, -12))
    ax.set_xlabel("redelivery count")
    ax.set_ylabel("seconds since first delivery")
    ax.set_xticks(range(len(want_cum)))
    ax.set_title(f"Ack-timeout redeliveries: ackTimeout {ACK_TIMEOUT_MS / 1000:g} s, "
                 f"backoff {BACKOFF[0] / 1000:g}-{BACKOFF[1] / 1000:g} s x{BACKOFF[2]:g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "backoff-schedule.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
