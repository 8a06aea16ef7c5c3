"""The fault suite: each scenario runs the mixed-delay workload on the real local stack,
injects one fault, and checks that nothing accepted is lost, nothing arrives earlier than
tickTime before its deliverAt, and the SDK hands nothing over twice. Each prints its row
(accepted, delivered, lost, early, duplicates at the Kafka level and through the SDK, time
to recover); the package prints the whole table at the end.

Short forms by default (100 msg/s, delays 0-10 s, ~24 s of publishing);
DWELL_FAULTS_FULL=1 runs the issue's sizes (200 msg/s, delays 0-60 s)."""

from __future__ import annotations

import os
import shutil
import signal
import time

import httpx
import pytest
import redis

from dwell_dev.testkit import now_ms, wait_for
from dwell_dev.workload import FaultStack

from .conftest import Run, at_fault, rest_of_run

pytestmark = pytest.mark.integration


def _check(row) -> None:
    assert row.accepted > 0
    assert (row.lost, row.early, row.sdk_duplicates) == (0, 0, 0), row


def _kill_and_restart(stack: FaultStack, name: str) -> None:
    stack.kill9(name)
    stack.start(name)


@pytest.mark.parametrize("process", ["policy", "admission", "tracker", "spark"])
def test_kill9_process(workload, process: str) -> None:
    run: Run = workload()
    at_fault(run)
    _kill_and_restart(run.stack, process)
    rest_of_run(run)
    _check(run.finish(f"kill -9 {process}"))


def test_kill9_spark_python_worker(workload) -> None:
    run: Run = workload()
    at_fault(run)
    # The backoff query's micro-batches run in Python workers, started when needed.
    workers = wait_for(run.stack.spark_python_workers, 30, "a Spark Python worker")
    os.kill(workers[0], signal.SIGKILL)
    rest_of_run(run)
    _check(run.finish("kill -9 spark python worker"))


def test_kill9_sdk_consumer(workload) -> None:
    run: Run = workload()
    at_fault(run)
    run.sdk.kill()
    run.sdk.start()
    rest_of_run(run)
    _check(run.finish("kill -9 SDK consumer"))


def test_redis_kill9_and_restart(workload) -> None:
    run: Run = workload()
    at_fault(run)
    _kill_and_restart(run.stack, "redis")
    rest_of_run(run)
    _check(run.finish("redis kill -9, restart"))


def test_redis_restarted_without_its_data(workload) -> None:
    """Redis back empty: its AOF and snapshot gone (a pod on a fresh volume, a failover
    to a replica that had nothing)."""
    run: Run = workload()
    at_fault(run)
    run.stack.kill9("redis")
    data = run.stack.state / "redis"
    shutil.rmtree(data)
    data.mkdir()
    run.stack.start("redis")
    rest_of_run(run)
    _check(run.finish("redis restarted empty"))


def test_redis_flushall(workload) -> None:
    run: Run = workload()
    at_fault(run)
    redis.Redis.from_url(run.stack.redis_url).flushall()
    rest_of_run(run)
    _check(run.finish("redis FLUSHALL"))


def test_kafka_stopped_20s(workload) -> None:
    run: Run = workload()
    at_fault(run)
    run.stack.stop("kafka")
    time.sleep(20)
    run.stack.start("kafka")
    rest_of_run(run)
    row = run.finish("kafka stopped 20 s")
    _check(row)
    pub = run.generator.out
    # Admission said so while Kafka was away: 503 with Retry-After, never a 500.
    assert pub.refused > 0 and pub.refused_without_retry_after == 0, pub


def test_same_tick_burst(workload) -> None:
    from .conftest import FULL
    size = 2_000_000 if FULL else 100_000
    run: Run = workload(start=False)
    due = now_ms() + 20_000
    admission = f"http://127.0.0.1:{run.stack.ports['admission']}"
    with httpx.Client(base_url=admission, timeout=60) as c:
        while run.generator.seq < size:
            run.generator.send(c, run.topics[1], count=1000, deliver_at=due)
    run.fault_ms = due
    _check(run.finish(f"{size:,} messages, one tick", settle_s=300))


def test_spark_restarted_with_backlog(workload) -> None:
    from .conftest import FULL
    size = 500_000 if FULL else 50_000
    run: Run = workload(start=False)
    run.stack.stop("spark")
    due = now_ms() + 5_000
    admission = f"http://127.0.0.1:{run.stack.ports['admission']}"
    with httpx.Client(base_url=admission, timeout=60) as c:
        while run.generator.seq < size:
            run.generator.send(c, run.topics[1], count=1000, deliver_at=due)
    time.sleep(max(0.0, (due - now_ms()) / 1000) + 5)
    run.fault_ms = due
    run.stack.start("spark")
    _check(run.finish(f"spark restarted, {size:,} due", settle_s=300))
