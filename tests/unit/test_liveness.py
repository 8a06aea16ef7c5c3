"""dwell.liveness: a loop stuck inside one call is named, its stack logged once, and the
process's /healthz answers 503 while it is stuck."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from fastapi.testclient import TestClient

from dwell import liveness
from dwell.http import create_app


def _wait_in_a_call_that_never_returns(hb: liveness.Heartbeat, release: threading.Event) -> None:
    hb.beat()
    release.wait(30)


def test_a_loop_stuck_in_a_call_is_named_and_its_stack_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    hb = liveness.Heartbeat("dwell.delayed ingest")
    release = threading.Event()
    t = threading.Thread(target=_wait_in_a_call_that_never_returns, args=(hb, release))
    t.start()
    try:
        time.sleep(0.1)
        assert liveness.stalled([hb], 5.0) == []
        time.sleep(0.3)
        with caplog.at_level(logging.ERROR, logger="dwell.liveness"):
            first = liveness.stalled([hb], 0.2)
            again = liveness.stalled([hb], 0.2)
        assert len(first) == 1 and first[0].startswith("dwell.delayed ingest: no round for")
        assert len(again) == 1
        logged = [r.getMessage() for r in caplog.records]
        assert len(logged) == 1, logged  # once, not at every probe
        assert "_wait_in_a_call_that_never_returns" in logged[0]
        assert "release.wait(30)" in logged[0]
    finally:
        release.set()
        t.join()


def test_a_beat_or_a_rest_ends_the_stall() -> None:
    hb = liveness.Heartbeat("loop")
    hb.beat()
    time.sleep(0.3)
    assert liveness.stalled([hb], 0.2)
    hb.beat()
    assert liveness.stalled([hb], 0.2) == []
    time.sleep(0.3)
    hb.rest()  # ended on purpose: never stale
    assert hb.age() == 0.0 and liveness.stalled([hb], 0.2) == []


def test_a_loop_whose_thread_ended_without_resting_stays_stale(
        caplog: pytest.LogCaptureFixture) -> None:
    hb = liveness.Heartbeat("writer")
    t = threading.Thread(target=hb.beat)
    t.start()
    t.join()
    time.sleep(0.3)
    with caplog.at_level(logging.ERROR, logger="dwell.liveness"):
        assert liveness.stalled([hb], 0.2)
    assert "its thread has ended" in caplog.records[0].getMessage()


def test_healthz_answers_503_naming_what_is_stuck() -> None:
    stuck: list[str] = []

    async def ready() -> dict[str, bool]:
        return {"ready": True}

    app = create_app("t", "t", ready, lambda: list(stuck))
    with TestClient(app) as c:
        assert (c.get("/healthz").status_code, c.get("/healthz").json()) == (
            200, {"status": "ok"})
        stuck.append("dwell.delayed ingest: no round for 130 s")
        got = c.get("/healthz")
        assert got.status_code == 503
        assert got.json() == {"status": "stalled",
                              "stalled": ["dwell.delayed ingest: no round for 130 s"]}
