"""The backoff state function without a JVM: Spark's GroupState is a plain Python object,
so step() runs here on hand-made event frames. Checks the PIP-130 ack-timeout schedule,
PIP-106 nack backoff, the dead-letter decision and the registry fallback for events
that carry no settings (plain Kafka consumers)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from dwell.core.backoff import ExponentialRedeliveryBackoff

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "spark"))
from dwell_spark.backoff import (  # noqa: E402
    ACK,
    DLQ,
    EVENT_SCHEMA,
    REDELIVER,
    STATE_SCHEMA,
    fill_settings,
    step,
)

KEY = ("persistent://t/ns/x", "sub", "dwell.delayed:0:7")
BACKOFF = ExponentialRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=4000, multiplier=2)


def group_state(value: tuple | None = None, timed_out: bool = False) -> GroupState:
    now = int(time.time() * 1000)
    return GroupState(value, now, -1, GroupStateTimeout.ProcessingTimeTimeout, timed_out,
                      False, value is not None, False, False, -1, b"", STATE_SCHEMA)


def events(*rows: dict[str, Any]) -> pd.DataFrame:
    cols = [f.name for f in EVENT_SCHEMA.fields]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)


def run(state: GroupState, frame: pd.DataFrame | None = None, lookup=None) -> list[tuple]:  # noqa: ANN001
    batches = iter([] if frame is None else [frame])
    out = pd.concat(list(step(KEY, batches, state, lookup)))
    return [tuple(r) for r in out.itertuples(index=False)]


def sdk_event(event: str, ts: int, count: int = 0, **kw: Any) -> dict[str, Any]:
    return {"event": event, "topic": KEY[0], "subscription": KEY[1], "messageId": KEY[2],
            "redeliveryCount": count, "ts": ts, "ackTimeoutMs": 0, **kw}


def test_ack_timeout_follows_pip130_schedule() -> None:
    """ackTimeout 2 s, min 1 s, max 4 s, ×2: redeliveries 3, 4, 6, 6 s after the delivery
    before each."""
    gaps = []
    for count in range(4):
        s = group_state()
        delivered = 1_000_000 + count * 10_000
        assert run(s, events(sdk_event("delivered", delivered, count, ackTimeoutMs=2000,
                                       ackTimeoutRedeliveryBackoff=json.dumps(
                                           BACKOFF.to_json())))) == []
        assert s.exists and s.get[0] == delivered
        # The timer fires; the redelivery is scheduled at delivered + ackTimeout + next(n).
        fired = group_state(s.get, timed_out=True)
        [(_, _, _, action, at, n)] = run(fired)
        assert (action, n) == (REDELIVER, count + 1)
        gaps.append(at - delivered)
        assert not fired.exists
    assert gaps == [3000, 4000, 6000, 6000]


def test_nack_backoff_then_dead_letter() -> None:
    raw = json.dumps(BACKOFF.to_json())
    out = [run(group_state(), events(sdk_event("nack", 5000, c, maxRedeliverCount=2,
                                               negativeAckRedeliveryBackoff=raw)))[0]
           for c in range(3)]
    assert [(a, at - 5000, n) for _, _, _, a, at, n in out] == [
        (REDELIVER, 1000, 1), (REDELIVER, 2000, 2), (DLQ, 4000, 2)]


def test_ack_clears_the_timer() -> None:
    s = group_state()
    rows = run(s, events(sdk_event("delivered", 10, ackTimeoutMs=2000),
                         sdk_event("ack", 20)))
    assert [r[3] for r in rows] == [ACK] and not s.exists


def test_events_without_settings_take_the_registry() -> None:
    registered = {"ackTimeoutMs": 2000, "ackTimeoutRedeliveryBackoff": BACKOFF.to_json(),
                  "negativeAckRedeliveryBackoff": None, "maxRedeliverCount": 3}
    asked = []

    def lookup(topic: str, sub: str) -> dict[str, Any]:
        asked.append((topic, sub))
        return registered

    # A plain Kafka consumer's event: no settings, no redelivery count.
    bare = {"event": "delivered", "topic": KEY[0], "subscription": KEY[1],
            "messageId": KEY[2], "ts": 7000}
    s = group_state()
    assert run(s, events(bare), lookup) == []
    assert asked == [KEY[:2]]
    assert s.get == (7000, 0, 2000, json.dumps(BACKOFF.to_json()), 3)
    [(_, _, _, action, at, n)] = run(group_state(s.get, timed_out=True))
    assert (action, at, n) == (REDELIVER, 7000 + 2000 + 1000, 1)


def test_sdk_events_keep_their_own_settings() -> None:
    frame = events(sdk_event("delivered", 1, ackTimeoutMs=0),
                   {"event": "nack", "topic": KEY[0], "subscription": KEY[1],
                    "messageId": KEY[2], "ts": 2})
    filled = fill_settings(frame, {"ackTimeoutMs": 5000, "maxRedeliverCount": 1,
                                   "ackTimeoutRedeliveryBackoff": None,
                                   "negativeAckRedeliveryBackoff": {"minDelayMs": 100}})
    assert filled["ackTimeoutMs"].tolist() == [0, 5000]
    assert filled["negativeAckRedeliveryBackoff"].tolist()[1] == '{"minDelayMs": 100}'
    # Unregistered subscription: nothing to fill, Pulsar's defaults apply (no ack
    # timeout; a nack comes back after the fixed 60 s delay).
    s = group_state()
    rows = run(s, events({"event": "nack", "topic": KEY[0], "subscription": KEY[1],
                          "messageId": KEY[2], "ts": 100}), lambda t, sub: None)
    assert [(r[3], r[4], r[5]) for r in rows] == [(REDELIVER, 60_100, 1)]
