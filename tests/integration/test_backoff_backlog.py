"""The Spark app restarted with a backlog of dwell.acks events (it was down while
consumers went on delivering and acking): the backoff reads the backlog
`acks_max_events_per_batch` events at a time and the app is ready after its first
micro-batch, then decides every event. Before, the first micro-batch took the whole
backlog, and the app's readiness waited for its warm-up event behind it: minutes for a
large one (a Spark restart in the soak stayed unready for 251 s).

The app runs as its own process (`python -m dwell_spark`) on the test profile's Kafka and
a Redis database of its own, started twice on one checkpoint. The first start also deletes
the checkpoint an earlier version left (its state per shard, under `backoff-shards`)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.core import topics as names
from dwell_dev import devstack
from dwell_dev.benchkit import Procs, send_ack_events, spark_env, wait_line
from dwell_dev.testkit import redis_db_url, wait_for
from dwell_spark.backoff import CHECKPOINT

ROOT = Path(__file__).resolve().parents[2]
REDIS_DB = 10
EVENTS = 3000
PER_BATCH = 300
FAR_MS = 600_000  # an ack timeout nothing in the test reaches
DECISIONS = re.compile(r"backoff: (\d+) decisions")
OLD_CHECKPOINT = "backoff-shards"


def test_a_backlog_is_read_in_bounded_batches_and_the_app_is_ready_after_the_first(
        stack: devstack.Stack, tmp_path: Path) -> None:
    redis_url = redis_db_url(stack, REDIS_DB)
    r = redis_adapter.connect(redis_url)
    r.flushdb()
    first, again = Procs(tmp_path), Procs(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    limit = {"DWELL_ACKS_MAX_EVENTS_PER_BATCH": str(PER_BATCH)}
    topic = f"persistent://backlog{uuid.uuid4().hex[:8]}/ns/t"
    counts = keys.sub_counts(topic, "s")
    old = checkpoints / OLD_CHECKPOINT
    (old / "state" / "0" / "0").mkdir(parents=True)
    (old / "state" / "0" / "0" / "1.delta").write_bytes(b"\0" * 4096)
    (old / "offsets").mkdir()
    (old / "offsets" / "0").write_text("v1\n")
    try:
        log = first.start("spark-1", ["-m", "dwell_spark"],
                          spark_env(stack, redis_url, checkpoints) | limit, cwd=ROOT / "spark")
        wait_line(first, log, "backoff ready", 600)
        first.stop_all()
        assert not old.exists()
        assert (f"backoff: deleted {checkpoints}/{OLD_CHECKPOINT}, the checkpoint of an "
                "earlier version" in log.read_text(errors="replace"))
        assert (checkpoints / CHECKPOINT).is_dir()

        send_ack_events(stack.kafka_bootstrap, "delivered", topic,
                        [f"{names.DELAYED}:0:{i}" for i in range(EVENTS)], FAR_MS)
        log = again.start("spark-2", ["-m", "dwell_spark"],
                          spark_env(stack, redis_url, checkpoints) | limit, cwd=ROOT / "spark")
        wait_line(again, log, "backoff ready", 600)
        # Ready with most of the backlog still to decide (one batch of everything made
        # the app ready only once all of it was decided).
        decided_at_ready = r.hlen(counts)
        assert decided_at_ready < EVENTS, decided_at_ready
        wait_for(lambda: again.check() or r.hlen(counts) >= EVENTS, 600,
                 f"{EVENTS} scheduled redeliveries")

        def logged() -> list[int]:
            return [int(n) for n in DECISIONS.findall(log.read_text(errors="replace"))]

        # A batch logs its decisions once they are written: the last line comes after.
        wait_for(lambda: sum(logged()) >= EVENTS, 60, "the last batch's log line")
        batches = logged()
        print(f"\nready with {decided_at_ready} of {EVENTS} decided; {len(batches)} batches "
              f"with decisions, at most {max(batches)} each (limit {PER_BATCH})")
        # (Other tests' events on the shared dwell.acks may add a few decisions.)
        assert sum(batches) >= EVENTS
        assert max(batches) <= PER_BATCH and len(batches) >= EVENTS // PER_BATCH
    finally:
        first.stop_all()
        again.stop_all()
        r.flushdb()
