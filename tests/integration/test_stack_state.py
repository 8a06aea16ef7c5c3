"""The disposable stacks of tests and benchmarks keep no data from one run to the next
(a benchmark writes gigabytes to Kafka): `Stack.start_empty` starts a server without what
a previous run left, while `Stack.start` keeps it, as a restart in a fault scenario needs.
Against a real Redis of this test's own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from dwell_dev import devstack
from dwell_dev.testkit import private_stack


@pytest.fixture()
def own() -> Iterator[devstack.Stack]:
    with private_stack("state") as s:
        yield s


def _client(s: devstack.Stack) -> redis.Redis:
    return redis.Redis.from_url(s.redis_url)


def test_start_keeps_data_start_empty_discards_it(own: devstack.Stack) -> None:
    s = own
    assert s.start_empty("redis") is not None
    _client(s).set("left-by-an-earlier-run", "1")
    s.stop("redis")  # a clean shutdown writes the append-only file out

    s.start("redis")
    assert _client(s).get("left-by-an-earlier-run") == b"1"
    # Already running: used as it is, nothing discarded.
    assert s.start_empty("redis") is None
    assert _client(s).get("left-by-an-earlier-run") == b"1"

    s.stop("redis")
    s.start_empty("redis")
    assert _client(s).get("left-by-an-earlier-run") is None
    data = s.data_dir("redis")
    assert data is not None and data.is_dir()


def test_discard_refuses_a_running_server(own: devstack.Stack) -> None:
    s = own
    s.start("redis")
    with pytest.raises(RuntimeError, match="redis runs"):
        s.discard("redis")
    s.stop("redis")
    s.discard("redis")
    data = s.data_dir("redis")
    assert data is not None and not data.exists()
    assert s.data_dir("policy") is None
