"""The backoff's writes outlast a Redis that stops answering: `write_retrying` tries a
micro-batch's writes again while Redis is down (here a redis-server of the test's own,
killed with SIGKILL and started again on its port), and gives up once its timeout has
passed, so that the query fails and the app's restart replays the batch."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redislib

import devinstall
from conftest import free_port
from dwell.adapters import redis as redis_adapter
from dwell.index.redelivery import SubscriptionIndex
from dwell_spark import metrics
from dwell_spark.backoff import write_retrying

TICK_MS = 100


class OwnRedis:
    def __init__(self, port: int, folder: Path) -> None:
        self.port = port
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [devinstall.redis_server_bin(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redislib.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return
            except redislib.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(free_port(), tmp_path)
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.kill()


def retries() -> float:
    return metrics.BACKOFF_WRITE_RETRIES._value.get()


def test_a_batch_is_written_once_redis_answers_again(own_redis: OwnRedis) -> None:
    r = redis_adapter.connect(f"redis://127.0.0.1:{own_redis.port}/0")
    idx = SubscriptionIndex(r, "persistent://t/ns/x", "s")
    due = int(time.time() * 1000) + 60_000
    tries_before = retries()
    own_redis.kill()
    restart = threading.Timer(2.0, own_redis.start)
    restart.start()
    started = time.monotonic()
    tries = write_retrying(lambda: idx.add([("dwell.delayed", 0, 7, due)], TICK_MS), 30, 1)
    restart.join()
    assert tries > 1 and retries() - tries_before == tries - 1
    assert 2.0 <= time.monotonic() - started < 15
    bucket = due - due % TICK_MS
    assert idx.remove_many(bucket, [("dwell.delayed", 0, 7)]) == 1  # the entry is there


def test_a_batch_gives_up_after_its_timeout(own_redis: OwnRedis) -> None:
    r = redis_adapter.connect(f"redis://127.0.0.1:{own_redis.port}/0")
    idx = SubscriptionIndex(r, "persistent://t/ns/x", "s")
    own_redis.kill()
    started = time.monotonic()
    with pytest.raises(redislib.ConnectionError):
        write_retrying(lambda: idx.add([("dwell.delayed", 0, 7, 10_000)], TICK_MS), 1.5, 2)
    assert time.monotonic() - started < 10
