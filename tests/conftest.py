"""Session fixtures: the real Redis and Apache Kafka of the `test` profile
(ports 16379 / 19092, state in .dwell/test), and dwell's services run as real
processes against them. Nothing here mocks a server."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dwell_dev import devstack
from dwell_dev.testkit import OwnRedis, ServiceFactory, free_port

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


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A redis-server of the test's own (dwell_dev.testkit.OwnRedis), started."""
    server = OwnRedis(free_port(), tmp_path)
    server.start()
    yield server
    if server.child is not None and server.child.running():
        server.kill()


@pytest.fixture()
def unique() -> str:
    """A short unique name, so tests never see each other's tenants and topics."""
    return "t" + uuid.uuid4().hex[:10]


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
