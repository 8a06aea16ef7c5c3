"""The backoff job against the real Redis: its fallback to the tracker's subscription
registry (events without settings, from plain Kafka consumers, get what the subscription
registered over HTTP, re-read after the cache's TTL), and its index writes: a scheduled
redelivery lands in the subscription's redelivery index at its due time, an ack takes it
out again, and once the drain has claimed the bucket the ack changes nothing. The state
function runs without a JVM (GroupState is a plain Python object)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.core.backoff import ExponentialRedeliveryBackoff
from dwell.core.positions import format_message_id
from dwell.core.subscriptions import SubscriptionSettings
from dwell.index import subscriptions
from dwell.index.redelivery import SubscriptionIndex
from dwell_spark.backoff import (
    CANCEL,
    DEAD,
    EVENT_SCHEMA,
    SCHEDULE,
    RegistryLookup,
    Scheduler,
    pending_of,
    step,
)
from dwell_spark.settings import SparkSettings
from dwell_spark.state import STATE_SCHEMA

ROOT = Path(__file__).resolve().parents[2]

TICK_MS = 100


def test_registry_lookup_reads_and_caches(redis_url: str, unique: str) -> None:
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    backoff = ExponentialRedeliveryBackoff(1000, 4000, 2)
    lookup = RegistryLookup(redis_url, ttl_ms=300)
    assert lookup(topic, "sub") is None  # not registered (cached too)
    subscriptions.put(r, topic, "sub", SubscriptionSettings(2000, backoff))
    assert lookup(topic, "sub") is None  # still the cached answer
    deadline = time.monotonic() + 5
    while (found := lookup(topic, "sub")) is None:
        assert time.monotonic() < deadline, "registration never seen"
        time.sleep(0.05)
    assert found.ack_timeout_ms == 2000

    # A plain consumer's delivered event (no settings, no count) schedules its redelivery
    # with the registered settings, at once, on the PIP-130 schedule.
    now = int(time.time() * 1000)
    state = new_state(now)
    ev = {"event": "delivered", "topic": topic, "subscription": "sub",
          "messageId": "dwell.delayed:0:1", "ts": now}
    [row] = run_step(topic, ev, state, lookup)
    assert (row.action, row.at, row.redeliveryCount) == (SCHEDULE, now + 3000, 1)
    assert pending_of(state) == {ev["messageId"]: (now + 3000, row.bucket, 1)}
    assert row.bucket == (now + 3000) - (now + 3000) % TICK_MS


def new_state(now: int, value: tuple | None = None) -> GroupState:
    """A backoff shard's state (``value``: a STATE_SCHEMA row)."""
    return GroupState(value, now, -1, GroupStateTimeout.ProcessingTimeTimeout, False, False,
                      value is not None, False, False, -1, b"", STATE_SCHEMA)


def run_step(topic: str, ev: dict, state: GroupState, lookup=None) -> list:
    cols = [f.name for f in EVENT_SCHEMA.fields]
    frame = pd.DataFrame([{c: ev.get(c) for c in cols}], columns=cols)
    out = pd.concat(list(step((topic, ev["subscription"], 0), iter([frame]),
                              state, lookup, TICK_MS)))
    return list(out.itertuples(index=False))


def live(idx: SubscriptionIndex, bucket: int) -> dict[str, set[int]]:
    return {k: set(v) for k, v in idx.read_bucket(bucket).items()}


def scheduler(redis_url: str, unique: str) -> tuple[Any, str, Scheduler, SubscriptionIndex]:
    """Redis, a fresh topic, a driver-side Scheduler (no Spark session: it writes only to
    Redis here) and the topic's redelivery index of subscription "s"."""
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    sched = Scheduler(None, SparkSettings(redis_url=redis_url,  # type: ignore[arg-type]
                                          redelivery_tick_ms=TICK_MS), r)
    return r, topic, sched, SubscriptionIndex(r, topic, "s")


def test_scheduled_redelivery_is_indexed_and_an_ack_cancels_it(redis_url: str,
                                                              unique: str) -> None:
    r, topic, sched, idx = scheduler(redis_url, unique)
    now = int(time.time() * 1000)
    mids = [format_message_id("dwell.delayed", 3, o) for o in (10, 11)]
    base = {"topic": topic, "subscription": "s", "ackTimeoutMs": 2000,
            "ackTimeoutRedeliveryBackoff": json.dumps({"minDelayMs": 1000})}
    states = [new_state(now) for _ in mids]
    for mid, st in zip(mids, states, strict=True):
        rows = run_step(topic, base | {"event": "delivered", "messageId": mid, "ts": now}, st)
        assert [x.action for x in rows] == [SCHEDULE]
        sched.apply(rows)
    due = now + 3000
    bucket = due - due % TICK_MS
    assert live(idx, bucket) == {"dwell.delayed:3": {10, 11}}
    assert r.hget(keys.sub_counts(topic, "s"), mids[0]) == b"1"

    # The ack of offset 10 takes it out of the live bucket (and forgets its count).
    rows = run_step(topic, base | {"event": "ack", "messageId": mids[0], "ts": now + 5},
                    states[0])
    assert [x.action for x in rows] == [CANCEL, "ack"] and not states[0].exists
    sched.apply(rows)
    assert live(idx, bucket) == {"dwell.delayed:3": {11}}
    assert r.hget(keys.sub_counts(topic, "s"), mids[0]) is None
    sched.apply(rows)  # a replay changes nothing
    assert live(idx, bucket) == {"dwell.delayed:3": {11}}

    # Once the drain has claimed the bucket, an ack is a no-op: the redelivery happened.
    [claimed] = idx.claim(due + TICK_MS, 10, 30_000, cutoff_ms=due + 1)
    assert {k: set(v) for k, v in claimed.positions.items()} == {"dwell.delayed:3": {11}}
    assert idx.remove_many(bucket, [("dwell.delayed", 3, 11)]) == 0
    rows = run_step(topic, base | {"event": "ack", "messageId": mids[1], "ts": now + 6},
                    states[1])
    sched.apply(rows)
    assert idx.complete(claimed.bucket_start, claimed.lease_id)
    assert idx.buckets() == []


def test_unacked_past_max_is_indexed_as_a_dead_letter(redis_url: str, unique: str) -> None:
    r, topic, sched, idx = scheduler(redis_url, unique)
    now = int(time.time() * 1000)
    mid = format_message_id("dwell.delayed", 2, 40)
    state = new_state(now)
    rows = run_step(topic, {"event": "delivered", "topic": topic, "subscription": "s",
                            "messageId": mid, "ts": now, "redeliveryCount": 3,
                            "ackTimeoutMs": 2000, "maxRedeliverCount": 3}, state)
    assert [(x.action, x.at, x.redeliveryCount) for x in rows] == [(DEAD, now + 2000, 3)]
    sched.apply(rows)
    bucket = (now + 2000) - (now + 2000) % TICK_MS
    assert live(idx, bucket) == {"dwell.delayed:2": {40}}
    # -(count + 1): the drain reads it as "to the DLQ, redelivery count 3".
    assert r.hget(keys.sub_counts(topic, "s"), mid) == b"-4"
    # An ack before the timeout cancels it like any redelivery.
    rows = run_step(topic, {"event": "ack", "topic": topic, "subscription": "s",
                            "messageId": mid, "ts": now + 5, "redeliveryCount": 3}, state)
    sched.apply(rows)
    assert live(idx, bucket) == {"dwell.delayed:2": set()}
    assert r.hget(keys.sub_counts(topic, "s"), mid) is None


def test_a_batch_of_decisions_is_folded_per_message(redis_url: str, unique: str) -> None:
    """One apply() of a whole batch, as the backoff's micro-batch hands it over: each
    message's decisions count in their order (a cancel of an entry added in the same batch
    drops the add), whatever the other messages do, and 2,000 schedules in one bucket land
    in one rewrite of it."""
    r, topic, sched, idx = scheduler(redis_url, unique)
    now = int(time.time() * 1000)
    base = {"topic": topic, "subscription": "s", "ackTimeoutMs": 2000}
    mids = [format_message_id("dwell.delayed", 1, o) for o in range(2000)]
    rows: list[Any] = []
    states = {mid: new_state(now) for mid in mids}
    for mid in mids:
        rows += run_step(topic, base | {"event": "delivered", "messageId": mid, "ts": now},
                         states[mid])
    # Message 0: delivered again later in the batch (its clock restarts: a cancel of the
    # first entry, then a new one a bucket on); message 1: acked in the batch.
    rows += run_step(topic, base | {"event": "delivered", "messageId": mids[0],
                                    "ts": now + TICK_MS}, states[mids[0]])
    rows += run_step(topic, base | {"event": "ack", "messageId": mids[1], "ts": now + 5},
                     states[mids[1]])
    # Message 2 had an entry from an earlier batch: the cancel must reach the index.
    earlier = format_message_id("dwell.delayed", 1, 5000)
    st = new_state(now)
    sched.apply(run_step(topic, base | {"event": "delivered", "messageId": earlier,
                                        "ts": now}, st))
    rows += run_step(topic, base | {"event": "ack", "messageId": earlier, "ts": now + 6}, st)

    rewrites = []
    real = idx.__class__._rewrite

    def counting(self: SubscriptionIndex, bucket_start: int, change: Any) -> bool:
        rewrites.append(bucket_start)
        return real(self, bucket_start, change)

    idx.__class__._rewrite = counting  # type: ignore[method-assign]
    try:
        sched.apply(rows)
    finally:
        idx.__class__._rewrite = real  # type: ignore[method-assign]
    due = now + 2000
    bucket = due - due % TICK_MS
    later = (due + TICK_MS) - (due + TICK_MS) % TICK_MS
    assert live(idx, bucket) == {"dwell.delayed:1": set(range(2, 2000))}
    assert live(idx, later) == {"dwell.delayed:1": {0}}
    counts = r.hgetall(keys.sub_counts(topic, "s"))
    assert len(counts) == 1999 and mids[1].encode() not in counts
    assert earlier.encode() not in counts
    # One rewrite per bucket touched: the cancel of the earlier entry, the two buckets added.
    assert sorted(rewrites) == sorted([bucket, bucket, later]), rewrites
