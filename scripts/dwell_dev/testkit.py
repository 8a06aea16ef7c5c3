"""The helpers the tests and the benches share: the wall clock in dwell's milliseconds, a
free local port, a poll with a deadline; dwell's services started as real processes
(`Service`, `ServiceFactory`, on dwell_dev.procs), stacks of a test's own, Spark sessions
and apps on a Redis database of their own, and the reads, forged records and admin calls
the suites make. Needs the venv (httpx, and dwell's modules where a helper says so);
the fixtures built on them are tests/conftest.py's."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from dwell_dev import devstack
from dwell_dev.procs import Child

T = TypeVar("T")


class TimedOut(AssertionError):
    """`wait_for` gave up; an AssertionError, so a test fails on it as on an assert."""


def now_ms() -> int:
    """The wall clock in epoch milliseconds, as dwell's due times are written."""
    return time.time_ns() // 1_000_000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], T | None], timeout: float, what: str,
             interval: float = 0.05) -> T:
    """Poll ``pred`` (at least once) until it returns something truthy (returned), or
    raise TimedOut after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimedOut(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def read_until(bootstrap: str, topic: str, starts: dict[int, int], done: Callable[[list], bool],
               timeout: float = 60) -> list:
    """The records of ``topic`` from ``starts`` (partition -> offset) once ``done(records)``
    holds, or all there are after ``timeout`` seconds (the caller asserts on them)."""
    from dwell.adapters import kafka

    deadline = time.monotonic() + timeout
    while True:
        got = kafka.read_from(bootstrap, topic, starts)
        if done(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def read_results(bootstrap: str, ends: dict[int, int], producer_name: str,
                 want: int, timeout: float = 30) -> list[dict[str, Any]]:
    """The results on `dwell.publish.results` after `ends` keyed by `producer_name`, until
    `want` of them came (or `timeout` s passed)."""
    import orjson

    from dwell.adapters import kafka
    from dwell.core import topics as names

    got: list[dict[str, Any]] = []
    c = kafka.Consumer(bootstrap, f"test-{uuid.uuid4().hex}")
    c.assign([(names.PUBLISH_RESULTS, part, off) for part, off in ends.items()])
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [orjson.loads(r.value) for r in c.poll(500, 0.5)
                if r.key == producer_name.encode()]
    c.close()
    return got


def wait_ingress(admission_url: str) -> None:
    """Until admission's Kafka ingress has its partitions (its /readyz says so)."""
    url = admission_url.rstrip("/")
    wait_for(lambda: httpx.get(f"{url}/readyz").json().get("ingressAssigned"), 30,
             "the ingress consumer to get partitions")


def read_answers(sock: socket.socket, n: int,
                 timeout: float = 5.0) -> list[tuple[int, dict[str, str], bytes]]:
    """n HTTP/1.1 answers off a raw socket, each with a content-length (tests that speak
    HTTP byte by byte: pipelining, 413 before the body, closed connections)."""
    buf, out = b"", []
    sock.settimeout(timeout)
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} answers"
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        status_line, *lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines)
        length = int(headers["content-length"])
        while len(buf) < length:
            chunk = sock.recv(65536)
            assert chunk
            buf += chunk
        out.append((int(status_line.split()[1]), headers, buf[:length]))
        buf = buf[length:]
    return out


def redis_db_url(stack: devstack.Stack, db: int) -> str:
    """The stack's Redis, database ``db``: a module's own, so tests never share keys."""
    return stack.redis_url.rsplit("/", 1)[0] + f"/{db}"


def spark_jars() -> str:
    """Spark's Kafka connector and its dependencies, as `spark.jars` takes them."""
    return ",".join(str(p) for p in devstack.spark_kafka_jars())


@contextlib.contextmanager
def local_spark(stack: devstack.Stack, db: int, checkpoint_dir: Path,
                **overrides: object) -> Iterator[tuple[Any, Any, Any]]:
    """A Spark session in this process on Redis database ``db`` (emptied before and
    after), with the SparkSettings it was built from: ``(spark, settings, redis)``."""
    from dwell.adapters import redis as redis_adapter
    from dwell_spark.__main__ import session
    from dwell_spark.settings import SparkSettings

    settings = SparkSettings(
        redis_url=redis_db_url(stack, db), kafka_bootstrap=stack.kafka_bootstrap,
        spark_jars=spark_jars(), spark_checkpoint_dir=str(checkpoint_dir), **overrides)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    r = redis_adapter.connect(settings.redis_url)
    r.flushdb()
    spark = session(settings)
    try:
        yield spark, settings, r
    finally:
        spark.stop()
        r.flushdb()


def spark_app_env(stack: devstack.Stack, redis_url: str, checkpoint_dir: Path,
                  tick_ms: int) -> dict[str, str]:
    """The environment of a whole Spark app (drain and backoff) on ``redis_url`` that
    reads only the ack events sent from now on, with quick triggers."""
    return dict(os.environ) | stack.service_env() | {
        "DWELL_REDIS_URL": redis_url, "DWELL_SPARK_JARS": spark_jars(),
        "DWELL_SPARK_CHECKPOINT_DIR": str(checkpoint_dir),
        "DWELL_ACKS_STARTING_OFFSETS": "latest", "PYSPARK_PYTHON": sys.executable,
        "DWELL_DRAIN_TRIGGER_MS": "250", "DWELL_BACKOFF_TRIGGER_MS": "250",
        "DWELL_REDELIVERY_TICK_MS": str(tick_ms), "DWELL_LOG_LEVEL": "info"}


def publish_delayed(bootstrap: str, log: str, topic: str, deliver_at: list[int]) -> None:
    """One forged delay-log record of ``topic`` per due time, as admission writes them
    (tick time 1 s), acknowledged before this returns."""
    from dwell.adapters import kafka

    p = kafka.Producer(bootstrap)
    try:
        futs = [p.send(log, b"m", key=topic, headers={
            "dwell-topic": topic, "dwell-deliver-at": str(at), "dwell-tick-time": "1000"})
            for at in deliver_at]
        for f in futs:
            f.result(30)
    finally:
        p.close()


def configure_topic(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    """Set ``topic``'s ``config`` entries, as an operator would (max.message.bytes to make
    Kafka refuse its records, for one); acknowledged before this returns."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    from dwell.adapters import kafka

    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in config.items()])
    admin = kafka.admin(bootstrap)  # held until the future is done
    admin.incremental_alter_configs([res])[res].result(15)


def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    """``topic``'s configuration, every entry, as the broker describes it."""
    from confluent_kafka.admin import ConfigResource

    from dwell.adapters import kafka

    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = kafka.admin(bootstrap)
    return {k: e.value for k, e in admin.describe_configs([res])[res].result(15).items()}


def ok(r: httpx.Response) -> httpx.Response:
    """``r``, asserted a success: the test stops with the status and body otherwise."""
    assert r.status_code < 300, (r.status_code, r.text)
    return r


def make_tenant(policy: httpx.Client, tenant: str) -> None:
    ok(policy.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": [],
                                                        "allowedClusters": []}))


def make_namespace(policy: httpx.Client, tenant: str, ns: str = "ns",
                   ns_policy: dict[str, Any] | None = None) -> None:
    """The tenant and its namespace ``ns``, with ``ns_policy`` as its delayed-delivery
    policy when given, through the policy service's client ``policy``."""
    make_tenant(policy, tenant)
    ok(policy.put(f"/admin/v2/namespaces/{tenant}/{ns}"))
    if ns_policy is not None:
        ok(policy.post(f"/admin/v2/namespaces/{tenant}/{ns}/delayedDelivery", json=ns_policy))


@contextlib.contextmanager
def private_stack(name: str) -> Iterator[devstack.Stack]:
    """A stack of a test's own, for a test that stops its servers: free ports, state in
    `.dwell/<name>-<random>`; what it runs is stopped and its state removed at the end,
    whatever happens."""
    profile = f"{name}-{uuid.uuid4().hex[:8]}"
    devstack.PROFILES[profile] = {n: free_port() for n in (
        "redis", "kafka", "kafka_controller", "policy", "admission", "tracker")}
    stack = devstack.Stack(profile)
    assert stack.state.name == profile  # the one directory removed at the end
    try:
        yield stack
    finally:
        try:
            stack.down(["redis", "kafka"])
        finally:
            del devstack.PROFILES[profile]
            shutil.rmtree(stack.state, ignore_errors=True)


@dataclass
class Service:
    """One dwell process (`python -m dwell.<name>`) started by a test."""

    name: str
    port: int
    env: dict[str, str]
    log: Path
    child: Child | None = None
    extra_argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Service:
        self.child = Child.spawn(self.name, [sys.executable, "-m", f"dwell.{self.name}",
                                             *self.extra_argv], self.log,
                                 self.env | {"DWELL_HTTP_PORT": str(self.port)})
        self.child.wait_until(lambda: _answers(self.url + "/healthz"), timeout, "healthy",
                              poll_s=0.1)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.child is not None
        self.child.wait_until(lambda: _answers(self.url + "/readyz"), timeout, "ready",
                              poll_s=0.1)

    def kill(self) -> None:
        """kill -9, the crash a test wants to survive."""
        if self.child is not None:
            self.child.kill()

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(timeout=15)


def _answers(url: str) -> bool:
    """Whether ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class ServiceFactory:
    def __init__(self, stack: devstack.Stack, log_dir: Path) -> None:
        self.stack = stack
        self.log_dir = log_dir
        self.started: list[Service] = []

    def start(self, name: str, env: dict[str, str] | None = None, *, ready: bool = True,
              port: int | None = None) -> Service:
        svc = Service(name, port or free_port(), self.stack.service_env() | (env or {}),
                      self.log_dir / f"{name}-{len(self.started)}.log")
        self.started.append(svc)
        svc.start()
        if ready:
            svc.wait_ready()
        return svc

    def stop_all(self, since: int = 0) -> None:
        """Stop what was started, newest first; ``since``: only what came after the
        first ``since`` starts."""
        for svc in reversed(self.started[since:]):
            svc.stop()


class OwnRedis:
    """A redis-server of a test's own on ``port``, keeping nothing on disk: killed and
    started again, it comes back empty (a Redis that lost its data)."""

    def __init__(self, port: int, folder: Path) -> None:
        self.port = port
        self.folder = folder
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis as redislib

        from dwell_dev import devinstall

        self.child = Child.spawn(
            "redis", [devinstall.redis_server_bin(), "--port", str(self.port), "--bind",
                      "127.0.0.1", "--save", "", "--appendonly", "no",
                      "--dir", str(self.folder)], self.folder / "redis.log")

        def answers() -> bool:
            try:
                return bool(redislib.Redis(port=self.port, socket_connect_timeout=0.2).ping())
            except redislib.ConnectionError:
                return False
        self.child.wait_until(answers, 10, "answering", poll_s=0.05)

    def kill(self) -> None:
        assert self.child is not None
        self.child.kill()
