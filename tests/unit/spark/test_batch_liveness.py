"""The Spark app's /healthz (dwell_spark.metrics): 503 naming a query whose micro-batch has
run past the stall timeout, 200 again once it ends; the batch's age is a metric."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from dwell_spark import metrics


@pytest.fixture()
def server() -> Iterator[str]:
    srv = metrics.serve("127.0.0.1", 0)
    metrics.set_stall_timeout(0.3)
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        metrics.set_stall_timeout(float("inf"))
        srv.shutdown()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_micro_batch_running_past_the_stall_timeout_fails_healthz(server: str) -> None:
    release, started = threading.Event(), threading.Event()

    def batch() -> None:
        with metrics.batch_running("drain"):
            started.set()
            release.wait(30)

    t = threading.Thread(target=batch)
    t.start()
    try:
        started.wait(5)
        assert _get(server + "/healthz")[0] == 200  # running, not yet past the limit
        time.sleep(0.5)
        status, body = _get(server + "/healthz")
        assert status == 503
        got = json.loads(body)
        assert got["status"] == "stalled"
        assert got["stalled"][0].startswith("drain micro-batch: no round for")
        ages = [line for line in _get(server + "/metrics")[1].decode().splitlines()
                if line.startswith('dwell_spark_batch_running_seconds{query="drain"}')]
        assert ages and float(ages[0].split()[-1]) >= 0.3
    finally:
        release.set()
        t.join()
    assert _get(server + "/healthz") == (200, b'{"status": "ok"}')
