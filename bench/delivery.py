"""Drain throughput: index N delayed messages (written to dwell.delayed, indexed with the
tracker's API), then time one drain round on the driver path and on the Spark-job path.

    .venv/bin/python bench/delivery.py --messages 20000 --topics 4

Runs against the test profile's Redis (database 9, flushed) and Kafka."""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "spark"))
sys.path.insert(0, str(ROOT / "scripts"))
import devstack  # noqa: E402
from dwell.adapters import kafka  # noqa: E402
from dwell.adapters import redis as redis_adapter  # noqa: E402
from dwell.core import topics as names  # noqa: E402
from dwell.core.topics import TopicName  # noqa: E402
from dwell.tracker.index import TopicIndex  # noqa: E402
from dwell_spark.__main__ import session  # noqa: E402
from dwell_spark.drain import Drainer  # noqa: E402
from dwell_spark.settings import SparkSettings  # noqa: E402


def fill(bootstrap: str, r, topics: list[str], n: int, deliver_at: int) -> None:  # noqa: ANN001
    p = kafka.Producer(bootstrap, linger_ms=20)
    futs = []
    for i in range(n):
        t = topics[i % len(topics)]
        futs.append((t, p.send(names.DELAYED, b"x" * 200, key=t, headers={
            "dwell-topic": t, "dwell-deliver-at": str(deliver_at), "dwell-tick-time": "1000",
            "dwell-key": f"k{i}"})))
    p.flush()
    by_topic: dict[str, list[tuple[int, int, int, int]]] = {}
    for t, f in futs:
        part, off = f.result()
        by_topic.setdefault(t, []).append((part, off, deliver_at, 1000))
    p.close()
    for t, rows in by_topic.items():
        kafka.ensure_topic(bootstrap, TopicName.parse(t).kafka_topic, 4)
        TopicIndex(r, t).add(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--topics", type=int, default=4)
    args = ap.parse_args()
    st = devstack.Stack("test")
    redis_url = st.redis_url.rsplit("/", 1)[0] + "/9"
    base = SparkSettings(redis_url=redis_url, kafka_bootstrap=st.kafka_bootstrap,
                         spark_jars=",".join(str(p) for p in devstack.spark_kafka_jars()),
                         spark_checkpoint_dir=f"/tmp/dwell-bench-{uuid.uuid4().hex[:6]}")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    r = redis_adapter.connect(redis_url)
    r.flushdb()
    spark = session(base)
    n = args.messages
    for label, local_max in (("warm-up (spark job)", 0), ("driver", n), ("spark job", 0)):
        run = f"b{uuid.uuid4().hex[:8]}"
        topics = [f"persistent://{run}/ns/t{i}" for i in range(args.topics)]
        now = int(time.time() * 1000)
        fill(st.kafka_bootstrap, r, topics, n if "warm" not in label else 100, now - 1)
        drainer = Drainer(spark, base.model_copy(update={"drain_local_max_records": local_max}),
                          r)
        t0 = time.monotonic()
        written = drainer.run_once(now)
        took = time.monotonic() - t0
        print(f"{label:<20} {written:>7} records in {took:6.2f}s = {written / took:>9,.0f} msg/s")
    r.flushdb()
    spark.stop()


if __name__ == "__main__":
    main()
