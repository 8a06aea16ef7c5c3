"""Delivery benchmark of the drain (issue: delivery, Spark job), against the test profile's
Redis (database 9, flushed) and Kafka:

1. Fixed-delay throughput: N messages written to dwell.delayed with one deliverAt and
   indexed with the tracker's API, then one drain round timed per copy path (driver,
   kafka-source, tasks; see dwell_spark.drain.choose_path). Target >= 50,000 msg/s.
2. Uniform delays: 2,000 msg/s published for --uniform-seconds with deliverAt uniform over
   [now, now + 10 min]; the real drain query (250 ms trigger) runs throughout. Measured:
   drain lag (dwell_drain_lag_ms, sampled every 0.5 s) and lateness of the messages that came
   due during the run, plus how many of those were delivered by the end. Messages due later
   than the run are not waited for (10 minutes would exceed the bench's time box).
3. Lateness at 5,000 msg/s, deliverAt = now + uniform 1-5 s, tickTime 1 s, for
   --lateness-seconds; target p99 <= tickTime + 1 s. In the same run, the same messages also
   go to a naive baseline (a Python loop polling a Redis ZSET by score, BullMQ-style, writing
   to its own Kafka topic with the same acks=all producer). Lateness = the ready record's
   timestamp (set at produce) - deliverAt; negative = early (PIP-448 non-strict delivers a
   bucket up to one tickTime early).

The bench plays admission and the tracker (it writes dwell.delayed and indexes each record as
soon as its write is acked), so the figures are the drain's alone.

    .venv/bin/python bench/delivery.py

Writes bench/out/delivery-lateness.png."""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "spark"))
sys.path.insert(0, str(ROOT / "scripts"))
import devstack  # noqa: E402
from dwell.adapters import kafka  # noqa: E402
from dwell.adapters import redis as redis_adapter  # noqa: E402
from dwell.core import topics as names  # noqa: E402
from dwell.core.topics import TopicName  # noqa: E402
from dwell.tracker.index import TopicIndex  # noqa: E402
from dwell_spark import drain, metrics  # noqa: E402
from dwell_spark.__main__ import session  # noqa: E402
from dwell_spark.drain import Drainer  # noqa: E402
from dwell_spark.settings import SparkSettings  # noqa: E402

TICK = 1000
OUT = ROOT / "bench" / "out"


def delayed(topic: str, i: int, deliver_at: int) -> kafka.OutRecord:
    return (names.DELAYED, b"x" * 200, topic.encode(),
            [("dwell-topic", topic.encode()), ("dwell-deliver-at", str(deliver_at).encode()),
             ("dwell-tick-time", str(TICK).encode()), ("dwell-key", f"k{i}".encode())], None)


def publish(p: kafka.Producer, r, recs: list[kafka.OutRecord]) -> None:  # noqa: ANN001
    """Write to dwell.delayed, then index what was acked (the tracker's part)."""
    pos = p.send_many(recs)
    p.flush()
    by_topic: dict[str, list[tuple[int, int, int, int]]] = {}
    for (_, _, key, hdrs, _), (part, off) in zip(recs, pos.result(30), strict=True):
        by_topic.setdefault(key.decode(), []).append((part, off, int(hdrs[1][1]), TICK))
    for t, rows in by_topic.items():
        TopicIndex(r, t).add(rows)


def make_topics(bootstrap: str, n: int) -> list[str]:
    run = f"b{uuid.uuid4().hex[:8]}"
    topics = [f"persistent://{run}/ns/t{i}" for i in range(n)]
    for t in topics:
        kafka.ensure_topic(bootstrap, TopicName.parse(t).kafka_topic, 4)
    return topics


def throughput(spark, settings: SparkSettings, r, n: int, path: str) -> float:  # noqa: ANN001
    topics = make_topics(settings.kafka_bootstrap, 4)
    now = int(time.time() * 1000)
    p = kafka.Producer(settings.kafka_bootstrap, linger_ms=20)
    for a in range(0, n, 20000):
        publish(p, r, [delayed(topics[i % 4], i, now - 1) for i in range(a, min(n, a + 20000))])
    p.close()
    d = Drainer(spark, settings, r)
    t0 = time.monotonic()
    written = d.run_once(now, path=path)
    took = time.monotonic() - t0
    assert written == n, (written, n)
    return n / took


class Reader(threading.Thread):
    """Collects (timestamp - deliverAt) of every record on some topics."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        super().__init__(daemon=True)
        self.c = kafka.Consumer(bootstrap, f"bench-{uuid.uuid4().hex}", topics,
                                auto_offset_reset="earliest")
        self.late: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for rec in self.c.poll(5000, 0.2):
                self.late.append(rec.timestamp_ms - int(rec.headers["dwell-deliver-at"]))
        self.c.close()


def baseline_loop(bootstrap: str, r, zkey: str, target: str, stop: threading.Event) -> None:  # noqa: ANN001
    """The naive baseline: poll a ZSET for due members every 10 ms, move them to Kafka."""
    p = kafka.Producer(bootstrap, linger_ms=0)
    while not stop.is_set():
        now = int(time.time() * 1000)
        due = r.zrangebyscore(zkey, "-inf", now, start=0, num=5000, withscores=True)
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


def run_load(settings: SparkSettings, r, rate: int, seconds: float, delay_ms: tuple[int, int],  # noqa: ANN001
             baseline_key: str | None = None) -> tuple[list[str], int, int]:
    """Publish ``rate`` msg/s for ``seconds``; returns (ready topics, messages due by the end,
    messages published)."""
    topics = make_topics(settings.kafka_bootstrap, 4)
    p = kafka.Producer(settings.kafka_bootstrap, linger_ms=5)
    step = 0.1
    t_end = time.monotonic() + seconds
    published = due_by_end = 0
    end_ms = int(time.time() * 1000 + seconds * 1000)
    i = 0
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        now = int(time.time() * 1000)
        batch = []
        for _ in range(int(rate * step)):
            at = now + random.randint(*delay_ms)
            batch.append(delayed(topics[i % 4], i, at))
            due_by_end += at <= end_ms
            i += 1
        publish(p, r, batch)
        if baseline_key:
            r.zadd(baseline_key, {f"m{i - len(batch) + j}": int(b[3][1][1])
                                  for j, b in enumerate(batch)})
        published += len(batch)
        time.sleep(max(0.0, step - (time.monotonic() - t0)))
    p.close()
    return [TopicName.parse(t).kafka_topic for t in topics], due_by_end, published


def pct(xs: list[int]) -> str:
    a = np.asarray(xs)
    return (f"p50 {np.percentile(a, 50):6.0f} ms  p99 {np.percentile(a, 99):6.0f} ms  "
            f"max {a.max():6.0f} ms  (n={len(a)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20000,100000")
    ap.add_argument("--uniform-seconds", type=float, default=60)
    ap.add_argument("--lateness-seconds", type=float, default=30)
    args = ap.parse_args()
    st = devstack.Stack("test")
    redis_url = st.redis_url.rsplit("/", 1)[0] + "/9"
    settings = SparkSettings(redis_url=redis_url, kafka_bootstrap=st.kafka_bootstrap,
                             spark_jars=",".join(str(p) for p in devstack.spark_kafka_jars()),
                             spark_checkpoint_dir=f"/tmp/dwell-bench-{uuid.uuid4().hex[:6]}")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    r = redis_adapter.connect(redis_url)
    r.flushdb()
    spark = session(settings)
    OUT.mkdir(parents=True, exist_ok=True)

    print("== 1. fixed-delay drain throughput, one round (target >= 50,000 msg/s)")
    throughput(spark, settings, r, 2000, "kafka-source")  # warm-up: JVM, workers
    throughput(spark, settings, r, 2000, "tasks")
    best: dict[int, tuple[str, float]] = {}
    for n in (int(x) for x in args.sizes.split(",")):
        for path in ("driver", "kafka-source", "tasks"):
            rate = throughput(spark, settings, r, n, path)
            print(f"  {n:>7} msgs  {path:<13} {rate:>9,.0f} msg/s  "
                  f"{'MET' if rate >= 50000 else 'missed'}")
            if rate > best.get(n, ("", 0))[1]:
                best[n] = (path, rate)
        chosen = drain.choose_path(settings, [drain.Range("x", names.DELAYED, 0, 0, n - 1)])
        print(f"  {n:>7} msgs  fastest: {best[n][0]}; choose_path picks: {chosen}")

    query = drain.start(spark, settings, r)
    lag: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            lag.append(int(metrics.DRAIN_LAG_MS._value.get()))  # noqa: SLF001
            time.sleep(0.5)

    try:
        time.sleep(5)  # the query's first micro-batches
        print(f"\n== 2. uniform delays over 10 min at 2,000 msg/s for {args.uniform_seconds:.0f}s "
              "(target: keeps up, lag bounded)")
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        ready, due, published = run_load(settings, r, 2000, args.uniform_seconds, (0, 600_000))
        reader = Reader(st.kafka_bootstrap, ready)
        reader.start()
        time.sleep(3)
        sampling.set()
        reader.stop.set()
        reader.join()
        print(f"  published {published}, due during the run {due}, delivered "
              f"{len(reader.late)} ({len(reader.late) / max(1, due):.1%})")
        print(f"  drain lag: max {max(lag)} ms, mean {np.mean(lag):.0f} ms over {len(lag)} "
              "samples")
        print(f"  lateness of those: {pct(reader.late)}")

        print(f"\n== 3. lateness at 5,000 msg/s for {args.lateness_seconds:.0f}s, deliverAt = "
              f"now + 1-5 s, tickTime {TICK} ms (target p99 <= {TICK + 1000} ms)")
        zkey = f"bench:baseline:{uuid.uuid4().hex[:6]}"
        btopic = f"bench-baseline-{uuid.uuid4().hex[:6]}"
        kafka.ensure_topic(st.kafka_bootstrap, btopic, 4)
        stop = threading.Event()
        base = threading.Thread(target=baseline_loop,
                                args=(st.kafka_bootstrap, r, zkey, btopic, stop), daemon=True)
        base.start()
        dwell_reader = Reader(st.kafka_bootstrap, [])
        ready, _, published = run_load(settings, r, 5000, args.lateness_seconds, (1000, 5000),
                                       zkey)
        dwell_reader.c.subscribe(ready)
        base_reader = Reader(st.kafka_bootstrap, [btopic])
        dwell_reader.start()
        base_reader.start()
        deadline = time.monotonic() + 30
        while (len(dwell_reader.late) < published or len(base_reader.late) < published) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        stop.set()
        for rd in (dwell_reader, base_reader):
            rd.stop.set()
            rd.join()
        d99 = np.percentile(dwell_reader.late, 99)
        b99 = np.percentile(base_reader.late, 99)
        print(f"  dwell     {pct(dwell_reader.late)}  "
              f"{'MET' if d99 <= TICK + 1000 else 'missed'}")
        print(f"  baseline  {pct(base_reader.late)}  (Python loop polling a Redis ZSET)")
        print(f"  dwell p99 / baseline p99 = {d99 / max(b99, 1):.2f}; delivered dwell "
              f"{len(dwell_reader.late)}/{published}, baseline {len(base_reader.late)}/"
              f"{published}")
        plot(dwell_reader.late, base_reader.late)
        print(f"  wrote {OUT / 'delivery-lateness.png'}")
    finally:
        query.stop()
        r.flushdb()
        spark.stop()


def plot(dwell_late: list[int], base_late: list[int]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lo = min(min(dwell_late), min(base_late))
    hi = max(max(dwell_late), max(base_late))
    bins = np.linspace(lo, hi, 80)
    ax.hist(dwell_late, bins=bins, alpha=0.6, label="dwell drain (tickTime 1 s)")
    ax.hist(base_late, bins=bins, alpha=0.6, label="baseline: Python loop polling a ZSET")
    ax.axvline(TICK + 1000, color="red", linestyle="--", label="target p99 = tickTime + 1 s")
    ax.set_xlabel("lateness = emitted - deliverAt (ms); negative = early")
    ax.set_ylabel("messages")
    ax.set_title("Delivery lateness at 5,000 msg/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "delivery-lateness.png", dpi=110)


if __name__ == "__main__":
    main()
