"""The disposable stacks of tests and benchmarks keep no data from one run to the next:
`Stack.start_empty` starts a server without what an earlier run left (their Kafka once
kept tens of gigabytes of benchmark records), while `Stack.start` keeps it, as a restart
in a fault scenario needs. Against a real Redis of this test's own."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest
import redis

import devstack
from conftest import free_port


@pytest.fixture()
def private_stack() -> Iterator[devstack.Stack]:
    profile = f"state-{uuid.uuid4().hex[:8]}"
    devstack.PROFILES[profile] = {"redis": free_port(), "kafka": free_port(),
                                  "kafka_controller": free_port()}
    stack = devstack.Stack(profile)
    assert stack.state.name == profile  # the one directory the finalizer removes
    try:
        yield stack
    finally:
        try:
            stack.stop("redis")
        finally:
            del devstack.PROFILES[profile]
            shutil.rmtree(stack.state, ignore_errors=True)


def _client(stack: devstack.Stack) -> redis.Redis:
    return redis.Redis.from_url(stack.redis_url)


def test_start_keeps_data_start_empty_discards_it(private_stack: devstack.Stack) -> None:
    s = private_stack
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


def test_discard_refuses_a_running_server(private_stack: devstack.Stack) -> None:
    s = private_stack
    s.start("redis")
    with pytest.raises(RuntimeError, match="redis runs"):
        s.discard("redis")
    s.stop("redis")
    s.discard("redis")
    data = s.data_dir("redis")
    assert data is not None and not data.exists()
    assert s.data_dir("policy") is None
