"""The processes a bench (and a test timing one) starts, and the small helpers the benches
share: each measured part runs as its own process (no two share a GIL), and
``Procs.stop_all`` ends them all on exit, failure or Ctrl-C (dwell_dev.procs children)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell_dev import devstack
from dwell_dev.procs import Child
from dwell_dev.testkit import free_port, now_ms

# The benches' Redis database on the test profile (flushed by them; the shared policy
# service keeps the profile's own database).
BENCH_REDIS_DB = 9
SPAWN = mp.get_context("spawn")  # no fork after librdkafka started its threads


class Procs:
    """Processes the bench started (dwell_dev.procs children); ``stop_all`` ends each."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[Child] = []
        self.workers: list[Any] = []

    def start(self, name: str, argv: list[str], env: dict[str, str],
              cwd: Path | None = None, program: str = sys.executable) -> Path:
        """Runs ``program argv`` (Python by default), its output in ``<logs>/<name>.log``."""
        child = Child.spawn(name, [program, *argv], self.logs / f"{name}.log", env, cwd=cwd)
        self.children.append(child)
        return child.log

    def worker(self, target: Any, *args: Any) -> Any:
        w = SPAWN.Process(target=target, args=args, daemon=True)
        w.start()
        self.workers.append(w)
        return w

    def check(self) -> None:
        for child in self.children:
            if not child.running():
                raise RuntimeError(f"{child.name} exited {child.returncode}:\n{child.tail()}")

    def peak_rss_mib(self, name: str) -> float:
        """The peak resident memory of process ``name`` so far (Linux's VmHWM)."""
        pid = self._child(name).pid
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmHWM for {name} (pid {pid})")

    def kill(self, name: str) -> None:
        """``kill -9`` of process ``name`` and everything of its session (the Spark app's
        JVM and Python workers too); returns once none runs."""
        child = self._child(name)
        child.kill()
        self.children.remove(child)

    def _child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def stop_all(self) -> None:
        for w in self.workers:
            if w.is_alive():
                w.terminate()
            w.join(5)
        # All asked at once, then each waited for: they stop side by side.
        for child in self.children:
            if child.running():
                child.signal(signal.SIGTERM)
        for child in self.children:
            child.stop()


@contextlib.contextmanager
def test_servers(stack: devstack.Stack) -> Iterator[None]:
    """The test profile's Redis and Kafka for a bench: started empty unless they run, and
    stopped (their data discarded) after it, unless DWELL_TEST_KEEP_SERVERS=1: others may
    be using servers a run had to start."""
    started = [name for name in ("redis", "kafka") if stack.start_empty(name) is not None]
    try:
        yield
    finally:
        if os.environ.get("DWELL_TEST_KEEP_SERVERS") != "1":
            stack.down(started)
            for name in started:
                stack.discard(name)


def spark_env(stack: devstack.Stack, redis_url: str, checkpoints: Path) -> dict[str, str]:
    """The environment of a Spark app run as its own process (``python -m dwell_spark``,
    cwd ``spark/``): the stack's settings with Redis at ``redis_url``, its checkpoints in
    ``checkpoints``, a free metrics port and `dwell.acks` read from its end."""
    return stack.service_env() | {
        "DWELL_REDIS_URL": redis_url, "PYSPARK_PYTHON": sys.executable,
        "DWELL_SPARK_JARS": ",".join(str(p) for p in devstack.spark_kafka_jars()),
        "DWELL_SPARK_CHECKPOINT_DIR": str(checkpoints),
        "DWELL_SPARK_METRICS_PORT": str(free_port()),
        "DWELL_ACKS_STARTING_OFFSETS": "latest", "DWELL_LOG_LEVEL": "info"}


def send_ack_events(bootstrap: str, kind: str, topic: str, ids: list[str],
                    ack_timeout_ms: int, subscription: str = "s") -> None:
    """One `dwell.acks` event of ``kind`` per message id, for ``subscription`` of
    ``topic``, as the SDK writes them; returns once Kafka has them all."""
    p = kafka.Producer(bootstrap, linger_ms=20)
    key = f"{topic}/{subscription}".encode()
    try:
        # One batch, no future per record: the events reach Kafka at its pace, not this
        # loop's.
        p.send_many([(names.ACKS, orjson.dumps({
            "event": kind, "topic": topic, "subscription": subscription, "messageId": mid,
            "redeliveryCount": 0, "ts": now_ms(), "ackTimeoutMs": ack_timeout_ms}), key,
            None, None) for mid in ids]).result(120)
    finally:
        p.close()


def wait_healthy(procs: Procs, url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check()
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not healthy in {timeout}s")


def start_service(procs: Procs, name: str, env: dict[str, str]) -> str:
    """``python -m dwell.<name>`` on a free port, once healthy; its URL."""
    port = free_port()
    procs.start(name, ["-m", f"dwell.{name}"], env | {"DWELL_HTTP_PORT": str(port)})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(procs, url)
    return url


def wait_line(procs: Procs, log: Path, line: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while line not in log.read_text(errors="replace"):
        procs.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"no '{line}' in {log} after {timeout}s")
        time.sleep(0.2)


def gauge(metrics_url: str, name: str) -> int:
    """The value of the unlabelled gauge ``name`` on a /metrics page."""
    with urllib.request.urlopen(metrics_url, timeout=2) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
    raise RuntimeError(f"no {name} on {metrics_url}")


def load_avg() -> str:
    """The machine's 1-minute load (2 cores, shared with other engineers' runs)."""
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


