"""The backoff's pass over dwell.acks records against the real Redis (and Kafka, for what it
sets aside), as a Python worker runs it on one Arrow batch of a partition: its fallback
to the tracker's subscription registry (events without settings, from plain Kafka
consumers, get what the subscription registered over HTTP, re-read after the cache's TTL),
its index writes (a scheduled redelivery lands in the subscription's redelivery index at
its due time, an ack takes it out again, and once the drain has claimed the bucket the ack
changes nothing), the pending entries it keeps beside the index, and the applied marker
that makes a replayed batch a no-op and tells a lost Redis."""

from __future__ import annotations

import json
import time
from typing import Any

import orjson

from dwell import headers as hdr
from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import invalid as invalid_core
from dwell.core import topics as names
from dwell.core.backoff import ExponentialRedeliveryBackoff
from dwell.core.positions import format_message_id
from dwell.core.subscriptions import SubscriptionSettings
from dwell.index import subscriptions
from dwell.index.redelivery import SubscriptionIndex, parse_pending
from dwell_spark.backoff import Pass, RegistryLookup
from dwell_spark.drain import claimed_ids
from dwell_spark.settings import SparkSettings

TICK_MS = 100
PARTITION = 3


def work(redis_url: str, bootstrap: str = "127.0.0.1:1") -> Pass:
    return Pass.of(SparkSettings(redis_url=redis_url, kafka_bootstrap=bootstrap,
                                 redelivery_tick_ms=TICK_MS))


def columns(events: list[dict[str, Any]], first_offset: int,
            values: list[bytes] | None = None) -> dict[str, list[Any]]:
    """One partition's records as the pass reads them (SOURCE_COLUMNS), from offset
    ``first_offset`` on."""
    raw = values if values is not None else [orjson.dumps(ev) for ev in events]
    n = len(raw)
    now = int(time.time() * 1000)
    return {"partition": [PARTITION] * n, "offset": list(range(first_offset, first_offset + n)),
            "ts": [now] * n, "tsType": [1] * n, "key": [b"k"] * n, "value": raw,
            "auths": [[] for _ in range(n)]}


def fresh_marker(r: Any, offset: int = 0) -> None:
    """The applied marker as a rebuild leaves it, with this test's partition at ``offset``."""
    r.delete(keys.BACKOFF_APPLIED)
    r.hset(keys.BACKOFF_APPLIED, str(PARTITION), offset)


def live(idx: SubscriptionIndex, bucket: int) -> dict[str, set[int]]:
    return {k: set(v) for k, v in idx.read_bucket(bucket).items()}


def registered(r: Any, topic: str, sub: str = "s",
               settings: SubscriptionSettings | None = None) -> None:
    subscriptions.put(r, topic, sub, settings or SubscriptionSettings(2000))


def subscription_s(redis_url: str, unique: str) -> tuple[Any, str, Pass, SubscriptionIndex]:
    """Redis, a fresh topic with subscription "s" registered, the applied marker as a
    rebuild leaves it, the pass, and the subscription's redelivery index."""
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    registered(r, topic)
    fresh_marker(r)
    return r, topic, work(redis_url), SubscriptionIndex(r, topic, "s")


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
    fresh_marker(r)
    now = int(time.time() * 1000)
    mid = "dwell.delayed:0:1"
    summary = work(redis_url).run(columns([{"event": "delivered", "topic": topic,
                                            "subscription": "sub", "messageId": mid,
                                            "ts": now}], 0))
    assert (summary["decisions"], summary["lost"]) == (1, False)
    due = now + 3000
    bucket = due - due % TICK_MS
    idx = SubscriptionIndex(r, topic, "sub")
    assert live(idx, bucket) == {"dwell.delayed:0": {1}}
    assert idx.pending([mid]) == [(due, bucket, 1)]


def test_scheduled_redelivery_is_indexed_and_an_ack_cancels_it(redis_url: str,
                                                              unique: str) -> None:
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    registered(r, topic)
    fresh_marker(r, 100)
    w = work(redis_url)
    idx = SubscriptionIndex(r, topic, "s")
    now = int(time.time() * 1000)
    mids = [format_message_id("dwell.delayed", 3, o) for o in (10, 11)]
    base = {"topic": topic, "subscription": "s", "ackTimeoutMs": 2000,
            "ackTimeoutRedeliveryBackoff": {"minDelayMs": 1000}}
    delivered = columns([base | {"event": "delivered", "messageId": m, "ts": now}
                         for m in mids], 100)
    assert w.run(delivered)["decisions"] == 2
    due = now + 3000
    bucket = due - due % TICK_MS
    assert live(idx, bucket) == {"dwell.delayed:3": {10, 11}}
    assert r.hget(keys.sub_counts(topic, "s"), mids[0]) == b"1"
    assert r.hget(keys.BACKOFF_APPLIED, str(PARTITION)) == b"102"

    # The ack of offset 10 takes it out of the live bucket (and forgets its count and its
    # pending entry).
    ack = columns([base | {"event": "ack", "messageId": mids[0], "ts": now + 5}], 102)
    assert w.run(ack)["decisions"] == 2  # cancel, ack
    assert live(idx, bucket) == {"dwell.delayed:3": {11}}
    assert r.hget(keys.sub_counts(topic, "s"), mids[0]) is None
    assert idx.pending(mids) == [None, (due, bucket, 1)]

    # A replay of both batches (a crash before Spark's checkpoint) is skipped whole: the
    # marker is past them.
    assert w.run(delivered)["events"] == 0
    assert w.run(ack)["events"] == 0
    assert live(idx, bucket) == {"dwell.delayed:3": {11}}

    # Once the drain has claimed the bucket, an ack is a no-op: the redelivery happened;
    # completing the claim deletes the pending entry of what it redelivered.
    [claimed] = idx.claim(due + TICK_MS, 10, 30_000, cutoff_ms=due + 1)
    assert {k: set(v) for k, v in claimed.positions.items()} == {"dwell.delayed:3": {11}}
    w.run(columns([base | {"event": "ack", "messageId": mids[1], "ts": now + 6}], 103))
    assert idx.complete(claimed.bucket_start, claimed.lease_id)
    assert idx.buckets() == []
    assert idx.forget_claimed(claimed.bucket_start, claimed_ids(claimed)) == 0  # acked


def test_the_drain_deletes_only_the_pending_entry_it_claimed(redis_url: str,
                                                             unique: str) -> None:
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    idx = SubscriptionIndex(r, topic, "s")
    mids = [format_message_id("dwell.delayed", 0, o) for o in (1, 2)]
    # Message 1 is still in the claimed bucket 1000; message 2 was scheduled again since,
    # into bucket 5000.
    idx.write_pending({mids[0]: (1042, 1000, 1), mids[1]: (5042, 5000, 2)})
    assert idx.forget_claimed(1000, mids) == 1
    assert idx.pending(mids) == [None, (5042, 5000, 2)]
    assert parse_pending(b"5042,5000,-3") == (5042, 5000, -3)


def test_unacked_past_max_is_indexed_as_a_dead_letter(redis_url: str, unique: str) -> None:
    r, topic, w, idx = subscription_s(redis_url, unique)
    now = int(time.time() * 1000)
    mid = format_message_id("dwell.delayed", 2, 40)
    base = {"topic": topic, "subscription": "s", "messageId": mid, "redeliveryCount": 3,
            "ackTimeoutMs": 2000, "maxRedeliverCount": 3}
    w.run(columns([base | {"event": "delivered", "ts": now}], 0))
    bucket = (now + 2000) - (now + 2000) % TICK_MS
    assert live(idx, bucket) == {"dwell.delayed:2": {40}}
    # -(count + 1): the drain reads it as "to the DLQ, redelivery count 3".
    assert r.hget(keys.sub_counts(topic, "s"), mid) == b"-4"
    # An ack before the timeout cancels it like any redelivery.
    w.run(columns([base | {"event": "ack", "ts": now + 5}], 1))
    assert live(idx, bucket) == {"dwell.delayed:2": set()}
    assert r.hget(keys.sub_counts(topic, "s"), mid) is None

    # A nack past the limit is a dead letter due at once.
    nack_at = now + 10
    w.run(columns([base | {"event": "nack", "ts": nack_at}], 2))
    now_bucket = nack_at - nack_at % TICK_MS
    assert live(idx, now_bucket) == {"dwell.delayed:2": {40}}
    assert r.hget(keys.sub_counts(topic, "s"), mid) == b"-4"


def test_a_batch_of_decisions_is_folded_per_message(redis_url: str, unique: str) -> None:
    """One batch's decisions are folded per subscription: each message's count in their
    order (a cancel of an entry added in the same batch drops the add), whatever the other
    messages do, and 2,000 schedules in one bucket land in one rewrite of it."""
    r, topic, w, idx = subscription_s(redis_url, unique)
    now = int(time.time() * 1000)
    base = {"topic": topic, "subscription": "s", "ackTimeoutMs": 2000}
    # Message 2 had an entry from an earlier batch: the cancel must reach the index.
    earlier = format_message_id("dwell.delayed", 1, 5000)
    w.run(columns([base | {"event": "delivered", "messageId": earlier, "ts": now}], 0))
    mids = [format_message_id("dwell.delayed", 1, o) for o in range(2000)]
    events = [base | {"event": "delivered", "messageId": m, "ts": now} for m in mids]
    # Message 0: delivered again later in the batch (its clock restarts: a cancel of the
    # first entry, then a new one a bucket on); message 1: acked in the batch.
    events += [base | {"event": "delivered", "messageId": mids[0], "ts": now + TICK_MS},
               base | {"event": "ack", "messageId": mids[1], "ts": now + 5},
               base | {"event": "ack", "messageId": earlier, "ts": now + 6}]
    rewrites = []
    real = SubscriptionIndex._rewrite

    def counting(self: SubscriptionIndex, bucket_start: int, change: Any) -> bool:
        rewrites.append(bucket_start)
        return real(self, bucket_start, change)

    SubscriptionIndex._rewrite = counting  # type: ignore[method-assign]
    try:
        w.run(columns(events, 1))
    finally:
        SubscriptionIndex._rewrite = real  # type: ignore[method-assign]
    due = now + 2000
    bucket = due - due % TICK_MS
    later = (due + TICK_MS) - (due + TICK_MS) % TICK_MS
    assert live(idx, bucket) == {"dwell.delayed:1": set(range(2, 2000))}
    assert live(idx, later) == {"dwell.delayed:1": {0}}
    counts = r.hgetall(keys.sub_counts(topic, "s"))
    assert len(counts) == 1999 and mids[1].encode() not in counts
    assert earlier.encode() not in counts
    assert len(r.hkeys(keys.sub_pending(topic, "s"))) == 1999
    # One rewrite per bucket touched: the cancel of the earlier entry, the two buckets added.
    assert sorted(rewrites) == sorted([bucket, bucket, later]), rewrites


def test_a_batch_decided_before_the_one_before_it_is_written_sees_its_entries(
        redis_url: str, unique: str) -> None:
    """mapInArrow's pass decides a batch while the one before it is written: the pending
    entries that one leaves stand in for Redis's, so an ack of a message scheduled there
    cancels its entry, and a message acked there and delivered again starts anew."""
    r, topic, w, idx = subscription_s(redis_url, unique)
    now = int(time.time() * 1000)
    base = {"topic": topic, "subscription": "s", "ackTimeoutMs": 2000}
    a, b = (format_message_id("dwell.delayed", 2, o) for o in (40, 41))
    w.run(columns([base | {"event": "delivered", "messageId": b, "ts": now}], 0))
    first = w.prepare(columns([base | {"event": "delivered", "messageId": a, "ts": now},
                               base | {"event": "ack", "messageId": b, "ts": now + 1}], 1))
    assert first.decided is not None
    # Decided with nothing of `first` in Redis yet.
    second = w.prepare(columns([base | {"event": "ack", "messageId": a, "ts": now + 2},
                                base | {"event": "delivered", "messageId": b,
                                        "ts": now + TICK_MS}], 3), first.decided.pending)
    assert (w.commit(first)["decisions"], w.commit(second)["decisions"]) == (3, 3)
    due = now + TICK_MS + 2000
    # a's entry, added by `first`, went again; b's is the one `second` added.
    assert {bk: got for bk in idx.buckets() if any((got := live(idx, bk)).values())} == {
        due - due % TICK_MS: {"dwell.delayed:2": {41}}}
    assert idx.pending([a, b]) == [None, (due, due - due % TICK_MS, 1)]
    assert r.hget(keys.sub_counts(topic, "s"), a) is None
    assert r.hget(keys.BACKOFF_APPLIED, str(PARTITION)) == b"5"


def test_the_pass_over_arrow_batches_writes_what_one_batch_at_a_time_does(
        redis_url: str, unique: str) -> None:
    """mapInArrow's function over many batches (deliveries, acks and redeliveries of the
    same messages spread across them) leaves Redis as running them one after another
    does, with one summary per batch, in order."""
    import pyarrow as pa

    from dwell_spark.backoff import _SUMMARY_ARROW

    now = int(time.time() * 1000)
    sub_of = {"seq": "s", "piped": "p"}
    batches: list[list[dict[str, Any]]] = []
    for k in range(8):
        evs = []
        for o in range(200):
            ev = ("delivered", "ack", "delivered", "nack")[(o + k) % 4]
            evs.append({"event": ev, "messageId": format_message_id("dwell.delayed", 0, o),
                        "ts": now + k * 10 + o % 7, "ackTimeoutMs": 5000,
                        "redeliveryCount": k % 3})
        batches.append(evs)
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    for sub in sub_of.values():
        registered(r, topic, sub)
    fresh_marker(r)
    w = work(redis_url)
    offset = 0
    for evs in batches:
        w.run(columns([ev | {"topic": topic, "subscription": sub_of["seq"]} for ev in evs],
                      offset))
        offset += len(evs)
    fresh_marker(r)
    arrow, offset = [], 0
    for evs in batches:
        arrow.append(pa.RecordBatch.from_pydict(columns(
            [ev | {"topic": topic, "subscription": sub_of["piped"]} for ev in evs], offset)))
        offset += len(evs)
    rows = [row for out in w(iter(arrow)) for row in out.to_pylist()]
    assert [row["next"] for row in rows] == [200 * (k + 1) for k in range(8)]
    assert all(not row["lost"] and row["events"] == 200 for row in rows)
    assert pa.Table.from_batches([pa.RecordBatch.from_pylist(rows, schema=_SUMMARY_ARROW)])

    def state(sub: str) -> tuple[Any, ...]:
        idx = SubscriptionIndex(r, topic, sub)
        return ({bk: live(idx, bk) for bk in idx.buckets()},
                r.hgetall(keys.sub_counts(topic, sub)), r.hgetall(keys.sub_pending(topic, sub)))

    seq, piped = state("s"), state("p")
    assert seq[0] and seq[1] and seq[2]
    assert piped == seq


def test_a_redis_without_the_marker_gets_no_writes(redis_url: str, unique: str) -> None:
    """Redis lost the indexes (no marker): the pass writes nothing and says so, for the
    driver to rebuild; a stale pending entry (past its due time by more than the grace) is
    treated as gone."""
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    registered(r, topic)
    w = work(redis_url)
    idx = SubscriptionIndex(r, topic, "s")
    now = int(time.time() * 1000)
    mid = format_message_id("dwell.delayed", 0, 9)
    ev = {"topic": topic, "subscription": "s", "ackTimeoutMs": 2000, "messageId": mid,
          "event": "delivered", "ts": now}
    r.delete(keys.BACKOFF_APPLIED)
    summary = w.run(columns([ev], 0))
    assert summary["lost"] and summary["decisions"] == 0
    assert idx.buckets() == [] and idx.pending([mid]) == [None]

    fresh_marker(r)
    gone_due = now - w.grace_ms - 1000
    idx.write_pending({mid: (gone_due, gone_due - gone_due % TICK_MS, 1)})
    w.run(columns([ev | {"event": "ack"}], 0))
    # Nothing to cancel: only the ack; the stale entry is deleted.
    assert idx.pending([mid]) == [None]


def test_malformed_records_go_to_dwell_invalid_from_the_pass(redis_url: str,
                                                            kafka_bootstrap: str,
                                                            unique: str) -> None:
    r = redis_adapter.connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    registered(r, topic)
    fresh_marker(r)
    w = work(redis_url, kafka_bootstrap)
    starts = kafka.end_offsets(kafka_bootstrap, names.INVALID)
    good = {"topic": topic, "subscription": "s", "ackTimeoutMs": 2000, "event": "delivered",
            "messageId": format_message_id("dwell.delayed", 0, 1),
            "ts": int(time.time() * 1000)}
    bad = json.dumps(good | {"messageId": f"persistent://{unique}-other/ns/y:0:1"}).encode()
    summary = w.run(columns([], 0, values=[orjson.dumps(good), bad, b"{not json"]))
    assert summary["decisions"] == 1 and summary["events"] == 1
    assert json.loads(summary["invalid"]) == {invalid_core.FIELD: 1,
                                              invalid_core.NOT_JSON: 1}, summary
    got = [rec for rec in kafka.read_from(kafka_bootstrap, names.INVALID, starts)
           if rec.header(hdr.SOURCE_TOPIC) == names.ACKS
           and rec.header(hdr.SOURCE_PARTITION) == str(PARTITION)
           and rec.value in (bad, b"{not json")]
    assert sorted(int(rec.header(hdr.SOURCE_OFFSET) or -1) for rec in got) == [1, 2]
