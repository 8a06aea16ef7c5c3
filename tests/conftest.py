"""Session fixtures: the real Redis and Apache Kafka of the `test` profile
(ports 16379 / 19092, state in .dwell/test), and dwell's services run as real
processes against them. Nothing here mocks a server."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import devstack

# Re-exported: tests take them from conftest.
from testkit import free_port as free_port
from testkit import now_ms as now_ms
from testkit import wait_for as wait_for

ROOT = Path(__file__).resolve().parent.parent


# Tests under these folders run against the real servers: they carry the `integration`
# marker, so `pytest -m "not integration"` is the loop that needs no server.
SERVER_SUITES = ("integration", "e2e", "faults", "compat", "secure", "kube", "hostile")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        suite = Path(str(item.path)).relative_to(ROOT / "tests").parts[0]
        if suite in SERVER_SUITES:
            item.add_marker(pytest.mark.integration)
        elif "stack" in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid} starts the real servers: it belongs in "
                                    f"one of tests/{{{','.join(SERVER_SUITES)}}}/")


@pytest.fixture(scope="session")
def stack() -> Iterator[devstack.Stack]:
    """Redis and Kafka for the whole session, started empty unless already running."""
    s = devstack.Stack("test")
    started = [name for name in ("redis", "kafka") if s.start_empty(name) is not None]
    from dwell.adapters.kafka import ensure_dwell_topics

    ensure_dwell_topics(s.kafka_bootstrap)
    yield s
    if os.environ.get("DWELL_TEST_KEEP_SERVERS") != "1":
        s.down(started)


@pytest.fixture(scope="session")
def redis_url(stack: devstack.Stack) -> str:
    return stack.redis_url


@pytest.fixture(scope="session")
def kafka_bootstrap(stack: devstack.Stack) -> str:
    return stack.kafka_bootstrap


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


@pytest.fixture()
def unique() -> str:
    """A short unique name, so tests never see each other's tenants and topics."""
    return "t" + uuid.uuid4().hex[:10]


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
    proc: subprocess.Popen[bytes] | None = None
    extra_argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Service:
        env = dict(os.environ) | self.env | {"DWELL_HTTP_PORT": str(self.port)}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", f"dwell.{self.name}",
                                          *self.extra_argv], env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n"
                                   + self.log.read_text()[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} not healthy in {timeout}s:\n"
                           + self.log.read_text()[-3000:])

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready in {timeout}s:\n" + self.log.read_text()[-3000:])

    def kill(self) -> None:
        """kill -9, the crash a test wants to survive."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


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


@pytest.fixture(scope="session")
def services(stack: devstack.Stack) -> Iterator[ServiceFactory]:
    log_dir = stack.state / "test-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    factory = ServiceFactory(stack, log_dir)
    yield factory
    factory.stop_all()


@pytest.fixture(autouse=True)
def _stop_the_tests_services(request: pytest.FixtureRequest) -> Iterator[None]:
    """What a test (or its function-scoped fixtures) started stops when it ends: a
    tracker left running would go on indexing and re-filing every later test's delay-log
    records, in its own index, and deliver them a second time through any drain that
    shares it. Services of module- and package-scoped fixtures are set up before this
    one and are left to their fixtures."""
    if "services" not in request.fixturenames:
        yield
        return
    factory: ServiceFactory = request.getfixturevalue("services")
    since = len(factory.started)
    yield
    factory.stop_all(since)


@pytest.fixture(scope="module")
def policy(services: ServiceFactory) -> Iterator[httpx.Client]:
    """A policy service for the module, as an HTTP client. A module that needs one
    started with other settings defines its own ``policy``."""
    svc = services.start("policy")
    with httpx.Client(base_url=svc.url, timeout=10) as c:
        yield c
    svc.stop()


@pytest.fixture(scope="module")
def admission(services: ServiceFactory) -> Iterator[httpx.Client]:
    """An admission service for the module, as an HTTP client (as ``policy``)."""
    svc = services.start("admission")
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        yield c
    svc.stop()
