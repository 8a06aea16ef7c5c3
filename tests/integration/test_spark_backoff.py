"""The backoff job's fallback to the tracker's subscription registry, against the real
Redis: events without settings (plain Kafka consumers) get what the subscription
registered over HTTP, re-read after the cache's TTL. The state function runs without a
JVM (GroupState is a plain Python object)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from dwell.adapters import redis as redis_adapter
from dwell.core.backoff import ExponentialRedeliveryBackoff
from dwell.tracker import subscriptions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "spark"))
from dwell_spark.backoff import (  # noqa: E402
    EVENT_SCHEMA,
    REDELIVER,
    STATE_SCHEMA,
    RegistryLookup,
    step,
)


def test_registry_lookup_reads_and_caches(redis_url: str, unique: str) -> None:
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    backoff = ExponentialRedeliveryBackoff(1000, 4000, 2)
    lookup = RegistryLookup(redis_url, ttl_ms=300)
    assert lookup(topic, "sub") is None  # not registered (cached too)
    subscriptions.put(r, topic, "sub", subscriptions.validate(
        {"ackTimeoutMs": 2000, "ackTimeoutRedeliveryBackoff": backoff.to_json()}))
    assert lookup(topic, "sub") is None  # still the cached answer
    deadline = time.monotonic() + 5
    while (found := lookup(topic, "sub")) is None:
        assert time.monotonic() < deadline, "registration never seen"
        time.sleep(0.05)
    assert found["ackTimeoutMs"] == 2000

    # A plain consumer's delivered event (no settings, no count) arms the ack timer with
    # the registered settings; the timer's redelivery follows PIP-130.
    now = int(time.time() * 1000)
    state = GroupState(None, now, -1, GroupStateTimeout.ProcessingTimeTimeout, False, False,
                       False, False, False, -1, b"", STATE_SCHEMA)
    cols = [f.name for f in EVENT_SCHEMA.fields]
    ev = {"event": "delivered", "topic": topic, "subscription": "sub",
          "messageId": "dwell.delayed:0:1", "ts": now}
    frame = pd.DataFrame([{c: ev.get(c) for c in cols}], columns=cols)
    out = pd.concat(list(step((topic, "sub", ev["messageId"]), iter([frame]), state, lookup)))
    assert out.empty and state.exists
    delivered, count, ack_timeout, raw_backoff, max_redeliver = state.get
    assert (delivered, count, ack_timeout, max_redeliver) == (now, 0, 2000, None)
    assert json.loads(raw_backoff) == backoff.to_json()
    fired = GroupState(state.get, now, -1, GroupStateTimeout.ProcessingTimeTimeout, True,
                       False, True, False, False, -1, b"", STATE_SCHEMA)
    [row] = list(pd.concat(list(step((topic, "sub", ev["messageId"]), iter([]), fired,
                                     lookup))).itertuples(index=False))
    assert (row.action, row.at, row.redeliveryCount) == (REDELIVER, now + 3000, 1)
