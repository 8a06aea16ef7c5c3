"""The tracker on real Redis and Kafka: ingest into the right buckets, crash safety,
claim/complete/lease expiry (with concurrent claimers), stats, subscriptions, and a
message published through the real admission service."""

from __future__ import annotations

import random
import threading
import time
import uuid

import httpx
import pytest
from pyroaring import BitMap64

from dwell import keys, liveness
from dwell.adapters.kafka import (
    Columns,
    Consumer,
    Producer,
    end_offsets,
    ensure_topic,
)
from dwell.adapters.redis import connect
from dwell.core import topics as names
from dwell.core.buckets import bucket_start
from dwell.index.redelivery import SubscriptionIndex
from dwell.index.topic import TopicIndex
from dwell.tracker import recovery
from dwell.tracker.ingest import HEADERS, Ingest
from dwell.tracker.ingest_loop import IngestLoop
from dwell.tracker.stats import HISTOGRAM_BOUNDS_MS
from dwell_dev.testkit import wait_for

pytestmark = pytest.mark.integration
TICK = 1000


def _tracker_env(delayed_topic: str, **extra: str) -> dict[str, str]:
    return {"DWELL_DELAYED_TOPIC": delayed_topic,
            "DWELL_TRACKER_GROUP_ID": "dwell-tracker-" + uuid.uuid4().hex[:8], **extra}


def _produce(bootstrap: str, delayed_topic: str, topic: str, deliver_ats: list[int],
             tick: int = TICK) -> list[tuple[int, int, int]]:
    """Write dwell.delayed-style records; returns (partition, offset, deliverAt)."""
    p = Producer(bootstrap, linger_ms=20)
    futs = [p.send(delayed_topic, b"x", topic,
                   {"dwell-deliver-at": str(d), "dwell-tick-time": str(tick),
                    "dwell-topic": topic})
            for d in deliver_ats]
    p.flush()
    p.close()
    return [(*f.result(), d) for f, d in zip(futs, deliver_ats, strict=True)]


def _expected(rows: list[tuple[int, int, int]], tick: int = TICK) -> dict[int, dict[int, set[int]]]:
    out: dict[int, dict[int, set[int]]] = {}
    for part, off, d in rows:
        out.setdefault(d - d % tick, {}).setdefault(part, set()).add(off)
    return out


def _indexed(r, topic: str) -> dict[int, dict[int, set[int]]]:
    idx = TopicIndex(r, topic)
    out = {}
    for b in idx.buckets():
        out[b] = {p: set(bm) for p, bm in idx.read_bucket(b).items()}
    return out


def _wait(pred, timeout: float, what: str):
    return wait_for(pred, timeout, what, interval=0.1)


@pytest.fixture()
def delayed_topic(kafka_bootstrap: str, unique: str) -> str:
    name = f"test.delayed.{unique}"
    ensure_topic(kafka_bootstrap, name, 4)
    return name


def test_ingest_indexes_positions_in_their_buckets(services, redis_url, kafka_bootstrap,
                                                     delayed_topic, unique):
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    now = int(time.time() * 1000)
    rows = _produce(kafka_bootstrap, delayed_topic, topic,
                    [now + 60_000 + random.randrange(10 * TICK) for _ in range(500)])
    svc = services.start("tracker", env=_tracker_env(delayed_topic))
    try:
        want = _expected(rows)
        got = _wait(lambda: (g := _indexed(r, topic)) == want and g, 30, "index == published")
        assert set(got) == set(want)
        # the compactor folded every delta into Roaring blobs
        _wait(lambda: not TopicIndex(r, topic).dirty_buckets(), 30, "compaction")
        for b in want:
            assert r.exists(keys.topic_index(topic).delta(b)) == 0
            assert r.hlen(keys.bucket(topic, b)) == len(want[b])
    finally:
        svc.stop()


def test_kill_9_mid_ingest_loses_and_duplicates_nothing(services, redis_url, kafka_bootstrap,
                                                        delayed_topic, unique):
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/crash"
    now = int(time.time() * 1000)
    rng = random.Random(7)
    rows = _produce(kafka_bootstrap, delayed_topic, topic,
                    [now + 3_600_000 + rng.randrange(3_600_000) for _ in range(100_000)])
    # Small batches so the kill lands between commits.
    env = _tracker_env(delayed_topic, DWELL_INGEST_BATCH_MAX="2000",
                       DWELL_COMPACTION_INTERVAL_MS="50")
    svc = services.start("tracker", env=env, ready=False)
    idx = TopicIndex(r, topic)
    _wait(lambda: r.zcard(keys.index(topic)) > 0, 30, "first batch indexed")
    svc.kill()
    at_kill = sum(idx.counts().values())
    assert 0 < at_kill < 100_000, f"kill was not mid-ingest ({at_kill} indexed)"
    svc2 = services.start("tracker", env=env, ready=False)
    try:
        want = _expected(rows)
        _wait(lambda: sum(idx.counts().values()) >= 100_000, 45, "100,000 positions indexed")
        _wait(lambda: not idx.dirty_buckets(), 30, "compaction")
        assert sum(idx.counts().values()) == 100_000
        assert _indexed(r, topic) == want
    finally:
        svc2.stop()


def test_poll_columns_reads_the_last_value_of_each_header(kafka_bootstrap, delayed_topic):
    p = Producer(kafka_bootstrap, linger_ms=5)
    p.send_many([
        (delayed_topic, b"a", b"k1", [("dwell-deliver-at", b"1"), ("other", b"x"),
                                      ("dwell-deliver-at", b"2"), ("dwell-tick-time", b"7")], None),
        (delayed_topic, b"b", None, None, None),
        (delayed_topic, b"c", b"k3", [("dwell-tick-time", b"9"),
                                      ("dwell-schedule-key", b"s")], None),
    ]).result(30)
    p.close()
    c = Consumer(kafka_bootstrap, "cols-" + uuid.uuid4().hex[:8], [delayed_topic])
    try:
        got: list[tuple[int, int, bytes | None, bytes | None, bytes | None,
                        bytes | None]] = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            b = c.poll_columns(HEADERS, 100, 0.5)
            got += zip(b.partitions, b.offsets, b.keys, *b.headers, strict=True)
    finally:
        c.close()
    by_key = {k: (da, tick, key) for _, _, k, da, tick, key in got}
    assert by_key == {b"k1": (b"2", b"7", None), None: (None, None, None),
                      b"k3": (None, b"9", b"s")}


def test_index_batch_groups_topics_and_skips_bad_records(redis_url, unique):
    r = connect(redis_url)
    t0 = 1_900_000_000_000
    a, b = f"persistent://{unique}/ns/a", f"persistent://{unique}/ns/b"
    good = [(a, 0, 1, t0 + 10), (b, 1, 2, t0 + 2500), (a, 0, 3, t0 + 10),
            (a, 2, 4, t0 + 1999), (b, 3, 5, t0)]
    rows: list[tuple[bytes | None, int, int, bytes | None, bytes | None]] = [
        (t.encode(), p, o, str(d).encode(), b"1000") for t, p, o, d in good]
    rows += [(None, 0, 6, b"1", b"1000"), (b"", 0, 7, b"1", b"1000"),
             (a.encode(), 0, 8, b"soon", b"1000"), (a.encode(), 0, 9, None, b"1000"),
             (a.encode(), 0, 10, b"1", b"0"), (b.encode(), 0, 11, b"9" * 30, b"1000")]
    random.Random(3).shuffle(rows)
    batch = Columns([p for _, p, _, _, _ in rows], [o for _, _, o, _, _ in rows],
                    [k for k, _, _, _, _ in rows], [[d for *_, d, _ in rows],
                                                    [t for *_, t in rows]])
    ing = Ingest(r)
    assert ing.index_batch(batch) == len(good)
    for topic in (a, b):
        want = _expected([(p, o, d) for t, p, o, d in good if t == topic])
        assert _indexed(r, topic) == want
    assert ing.dirty_topics == {a, b}
    # Fast path (every value parses): same result as row by row.
    c = f"persistent://{unique}/ns/c"
    ok = Columns([0, 1, 0], [1, 1, 2], [c.encode()] * 3, [[b"%d" % t0, b"%d" % (t0 + 1), b"5"],
                                                          [b"1000", b"1000", b"1"]])
    assert ing.index_batch(ok) == 3
    assert _indexed(r, c) == {t0: {0: {1}, 1: {1}}, 5: {0: {2}}}


def test_rebalance_between_two_ingest_loops_indexes_and_commits_everything(
        redis_url, kafka_bootstrap, delayed_topic, unique):
    r = connect(redis_url)
    now = int(time.time() * 1000)
    rng = random.Random(11)
    # Several Pulsar topics (record keys), so the records spread over the partitions.
    topics = [f"persistent://{unique}/ns/rebalance-{i}" for i in range(8)]
    rows = {t: _produce(kafka_bootstrap, delayed_topic, t,
                        [now + 3_600_000 + rng.randrange(600_000) for _ in range(6000)])
            for t in topics}
    group = "tracker-" + uuid.uuid4().hex[:8]
    loops: list[IngestLoop] = []
    threads: list[threading.Thread] = []

    def start() -> None:
        # A loop's consumer joins the group as it is built: build it where it runs.
        loops.append(IngestLoop(connect(redis_url), kafka_bootstrap, delayed_topic, group,
                                batch_max=100, compaction_interval_ms=50))
        threads.append(threading.Thread(target=loops[-1].run, daemon=True))
        threads[-1].start()

    start()
    _wait(lambda: loops[0].indexed > 0, 30, "first loop indexing")
    start()  # joins the group mid-ingest: partitions move under load
    beats = [hb for lp in loops for hb in (lp.polling, lp.writing)]

    def indexed_all() -> bool:
        # Through the rebalance (a revoke waits for the writer), every loop goes round.
        assert liveness.stalled(beats, 5.0) == []
        return sum(lp.indexed for lp in loops) >= 48_000

    try:
        _wait(indexed_all, 90, "48,000 records indexed")
        for t in topics:
            assert _indexed(r, t) == _expected(rows[t])
        ends = end_offsets(kafka_bootstrap, delayed_topic)
        probe = Consumer(kafka_bootstrap, group)

        def committed() -> bool:
            got = probe.committed([(delayed_topic, p) for p in ends])
            return all(got[(delayed_topic, p)] == end for p, end in ends.items() if end > 0)

        try:
            _wait(committed, 30, "offsets committed up to the end")
        finally:
            probe.close()
    finally:
        for lp in loops:
            lp.stop()
        for t in threads:
            t.join(30)
    assert all(lp.error is None for lp in loops)
    assert all(not t.is_alive() for t in threads)
    assert all(hb.age() == 0.0 for hb in beats)  # stopped on purpose: resting, not stale
    # Nothing read twice: the revoked loop committed every batch it had handed over.
    assert sum(lp.indexed for lp in loops) == 48_000


def _fill(r, topic: str, buckets: list[int], per_bucket: int = 3) -> TopicIndex:
    idx = TopicIndex(r, topic)
    idx.add([(b % 4, i * 1000 + b // TICK % 1000, b + i, TICK)
             for b in buckets for i in range(per_bucket)])
    return idx


def test_claim_complete_and_lease_expiry(redis_url, unique):
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/claim"
    t0 = 1_900_000_000_000
    idx = _fill(r, topic, [t0, t0 + TICK, t0 + 5 * TICK])
    idx.compact()
    # Non-strict: due once bucketStart <= now + 1; strict: once its last ms has passed.
    assert idx.claim(t0 - 2, 10, 1000, strict=False) == []
    assert idx.claim(t0 + TICK - 2, 10, 1000, strict=True) == []
    [first] = idx.claim(t0 + TICK - 1, 1, 1000, strict=True)
    assert first.bucket_start == t0 and first.count() == 3
    # Lease not expired: the next claimer gets the next bucket, not t0.
    [second] = idx.claim(t0 + TICK, 10, 1000, strict=False)
    assert second.bucket_start == t0 + TICK
    assert idx.complete(second.bucket_start, second.lease_id)
    # After expiry the claimed bucket is handed out again, under a new lease.
    [back] = idx.claim(first.lease_expires_at, 10, 1000, strict=False)
    assert back.bucket_start == t0 and back.lease_id != first.lease_id
    assert back.positions == first.positions
    assert idx.complete(t0, first.lease_id) is False  # stale lease
    assert idx.complete(t0, back.lease_id) is True
    assert idx.complete(t0, back.lease_id) is False  # already completed
    [rest] = idx.claim(t0 + 10 * TICK, 10, 1000, strict=False)
    assert rest.bucket_start == t0 + 5 * TICK
    assert r.zscore(keys.DUE, topic) == t0 + 5 * TICK
    assert idx.complete(rest.bucket_start, rest.lease_id)
    assert idx.counts() == {}
    assert r.zscore(keys.DUE, topic) is None


def test_claim_returns_uncompacted_deltas_and_late_adds_survive(redis_url, unique):
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/late"
    t0 = 1_900_000_000_000
    idx = TopicIndex(r, topic)
    idx.add([(1, 5, t0, TICK)])
    idx.compact()
    idx.add([(1, 6, t0, TICK), (2, 7, t0 + 1, TICK), (1, 5, t0, TICK)])  # not compacted
    [c] = idx.claim(t0 + 5, 10, 60_000, strict=False)
    assert c.positions == {1: BitMap64([5, 6]), 2: BitMap64([7])}
    idx.add([(3, 8, t0 + 2, TICK)])  # arrives while t0 is claimed
    # Counted: the claimed positions (one of them a delta) and the live one beside them.
    assert idx.counts() == {t0: 4}
    assert idx.complete(t0, c.lease_id)
    assert idx.counts() == {t0: 1}
    [late] = idx.claim(t0 + 5, 10, 60_000, strict=False)
    assert late.bucket_start == t0 and late.positions == {3: BitMap64([8])}


def test_busy_compaction_takes_large_deltas_first_and_leaves_small_ones(redis_url, unique):
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/busy"
    t0 = 1_900_000_000_000
    idx = TopicIndex(r, topic)
    idx.add([(0, off, t0, TICK) for off in range(400)])  # 4,800 delta bytes
    idx.add([(0, off, t0 + TICK, TICK) for off in range(10)])  # 120
    idx.add([(0, off, t0 + 2 * TICK, TICK) for off in range(100)])  # 1,200
    assert idx.dirty_buckets() == [t0, t0 + 2 * TICK, t0 + TICK]
    assert idx.dirty_buckets(min_delta_bytes=1000) == [t0, t0 + 2 * TICK]
    assert idx.compact(min_delta_bytes=4096) == 1
    assert idx.dirty_buckets() == [t0 + 2 * TICK, t0 + TICK]
    assert r.get(idx.keys.delta(t0)) is None
    assert idx.compact() == 2
    assert idx.dirty_buckets() == []
    assert {b: len(idx.read_bucket(b)[0]) for b in idx.buckets()} == {
        t0: 400, t0 + TICK: 10, t0 + 2 * TICK: 100}
    idx.add([(0, 7, t0, TICK)])  # a repeat: the delta is back, the count is not
    assert r.zscore(idx.keys.dirty, str(t0)) == 12
    assert len(idx.read_bucket(t0)[0]) == 400


def test_concurrent_claimers_never_share_a_bucket(redis_url, unique):
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/race"
    t0 = 1_900_000_000_000
    all_buckets = [t0 + i * TICK for i in range(300)]
    _fill(r, topic, all_buckets, per_bucket=1)
    got: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        idx = TopicIndex(connect(redis_url), topic)
        while True:
            claimed = idx.claim(t0 + 1000 * TICK, 3, 600_000, strict=False)
            if not claimed:
                return
            with lock:
                got.extend(c.bucket_start for c in claimed)

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(set(got)) == 300
    assert sorted(got) == all_buckets


def _published_stats_topic(r, unique):
    topic = f"persistent://{unique}/ns/stats"
    now = int(time.time() * 1000)
    offsets = [(p, o, now + 120_000 + (o % 7) * TICK, TICK) for p in range(3) for o in range(40)]
    TopicIndex(r, topic).add(offsets)
    return topic, now, offsets


def test_stats_match_what_was_published(services, redis_url, unique, delayed_topic):
    r = connect(redis_url)
    topic, now, rows = _published_stats_topic(r, unique)
    svc = services.start("tracker", env=_tracker_env(delayed_topic))
    http = httpx.Client(base_url=svc.url, timeout=10)
    try:
        assert http.put(f"/v1/topics/persistent/{unique}/ns/stats/subscriptions/s1",
                        json={"ackTimeoutMs": 10000}).status_code == 200
        s = http.get(f"/v1/topics/persistent/{unique}/ns/stats/stats").json()
        starts = {d - d % TICK for _, _, d, _ in rows}
        assert s["delayedMessages"] == 120
        assert s["buckets"] == len(starts)
        assert s["nextDueAt"] == min(starts)
        assert s["drainLagMs"] == 0
        assert s["dueHistogram"][-1] == {"le": "+Inf", "count": 120}
        le_1h = HISTOGRAM_BOUNDS_MS.index(3600000)
        assert s["dueHistogram"][le_1h]["count"] == 120
        assert s["dueHistogram"][HISTOGRAM_BOUNDS_MS.index(60000)]["count"] == 0
        measured = sum(r.memory_usage(k, samples=0) or 0
                       for k in r.scan_iter(match=f"dwell:*{{{topic}}}*", count=1000)
                       if not k.startswith(b"dwell:subs:") and not k.startswith(b"dwell:sub:"))
        assert s["bufferMemoryBytes"] == measured > 0
        assert s["subscriptions"] == {"s1": {"pendingRedeliveries": 0, "redeliveryIndexBytes": 0}}
        assert http.put(f"/v1/topics/persistent/{unique}/ns/stats/subscriptions/s2",
                        json={}).status_code == 200
        p = http.get(f"/admin/v2/persistent/{unique}/ns/stats/stats").json()
        # Each subscription reads the shared index; the topic sums them, as Pulsar does.
        assert p == {"delayedMessageIndexSizeInBytes": 2 * measured, "subscriptions": {
            sub: {"msgDelayed": 120, "delayedMessageIndexSizeInBytes": measured}
            for sub in ("s1", "s2")}}
        nope = http.get(f"/admin/v2/persistent/{unique}/ns/nope/stats")
        assert (nope.status_code, nope.json()) == (
            404, {"reason": f"Topic persistent://{unique}/ns/nope not found"})
        series = (f'pulsar_subscription_delayed_message_index_size_bytes{{cluster="standalone",'
                  f'namespace="{unique}/ns",subscription="s2",topic="{topic}"}} ')

        def exported() -> float | None:
            for row in http.get("/metrics").text.splitlines():
                if row.startswith(series):
                    return float(row.removeprefix(series))
            return None

        assert wait_for(exported, 60, "the subscription's metric", interval=0.5) == measured
        # Every topic of the suite's shared database: slower than one topic's stats.
        listed = http.get("/v1/stats", timeout=60).json()["topics"]
        assert any(t["topic"] == topic and t["delayedMessages"] == 120 for t in listed)
    finally:
        http.close()
        svc.stop()


BAD_SUBSCRIPTIONS = [
    ({"ackTimeoutMs": 500}, "ackTimeoutMs: Ack timeout should be 0 (off) or at least 1000 ms"),
    ({"ackTimeoutMs": -1}, "ackTimeoutMs: must be a non-negative integer"),
    ({"ackTimeoutMs": "10s"}, "ackTimeoutMs: must be a non-negative integer"),
    ({"ackTimeoutRedeliveryBackoff": {"minDelayMs": -1}},
     "ackTimeoutRedeliveryBackoff: min delay time must be >= 0"),
    ({"negativeAckRedeliveryBackoff": {"minDelayMs": 2000, "maxDelayMs": 1000}},
     "negativeAckRedeliveryBackoff: maxDelayMs must be >= minDelayMs"),
    ({"negativeAckRedeliveryBackoff": {"multiplier": 1}},
     "negativeAckRedeliveryBackoff: multiplier must be > 1"),
    ({"maxRedeliverCount": 0}, "maxRedeliverCount: MaxRedeliverCount must be > 0."),
    ({"bogus": 1}, "bogus: unknown field"),
]


def test_subscription_registration_and_validation(services, redis_url, unique, delayed_topic):
    r = connect(redis_url)
    svc = services.start("tracker", env=_tracker_env(delayed_topic))
    base = f"/v1/topics/persistent/{unique}/ns/x/subscriptions"
    topic = f"persistent://{unique}/ns/x"
    with httpx.Client(base_url=svc.url, timeout=10) as http:
        for body, reason in BAD_SUBSCRIPTIONS:
            resp = http.put(f"{base}/sub", json=body)
            assert resp.status_code == 400, body
            assert resp.json()["reason"].startswith(reason), resp.json()
        assert http.put(f"{base}/sub", content=b"{nope").status_code == 400
        assert http.put(f"/v1/topics/wrong/{unique}/ns/x/subscriptions/s",
                        json={}).status_code == 400
        good = {"ackTimeoutMs": 10000, "maxRedeliverCount": 3,
                "negativeAckRedeliveryBackoff": {"minDelayMs": 1000, "maxDelayMs": 60000}}
        resp = http.put(f"{base}/sub", json=good)
        assert resp.status_code == 200
        assert resp.json()["negativeAckRedeliveryBackoff"] == {
            "minDelayMs": 1000, "maxDelayMs": 60000, "multiplier": 2.0}
        assert http.get(f"{base}/sub").json()["maxRedeliverCount"] == 3
        sidx = SubscriptionIndex(r, topic, "sub")
        assert sidx.add([("t.ns.x", 0, 42, 1_900_000_000_000)], TICK) == 1
        sidx.store_count("t.ns.x:0:42", 1)
        stats = http.get(f"/v1/topics/persistent/{unique}/ns/x/stats").json()
        assert stats["subscriptions"]["sub"]["pendingRedeliveries"] == 1
        assert http.delete(f"{base}/sub").status_code == 204
        assert http.get(f"{base}/sub").status_code == 404
        assert http.delete(f"{base}/sub").status_code == 404
        assert list(r.scan_iter(match=f"dwell:sub:{{{topic}}}:sub:*")) == []
    svc.stop()


def test_publish_through_admission_is_indexed(services, redis_url, kafka_bootstrap, unique):
    r = connect(redis_url)
    policy = services.start("policy")
    with httpx.Client(base_url=policy.url, timeout=10) as http:
        assert http.put(f"/admin/v2/tenants/{unique}", json={}).status_code in (200, 204)
        assert http.put(f"/admin/v2/namespaces/{unique}/ns", json={}).status_code in (200, 204)
    admission = services.start("admission")
    env = _tracker_env(names.DELAYED)
    # dwell.delayed is shared with every other test and bench (millions of records): start
    # this tracker's group at its current end rather than re-reading all of it.
    recovery.start_group_at_end(kafka_bootstrap, env["DWELL_TRACKER_GROUP_ID"],
                                [names.DELAYED, names.REFILED])
    tracker = services.start("tracker", env=env)
    topic = f"persistent://{unique}/ns/x"
    with httpx.Client(base_url=admission.url, timeout=30) as http:
        before = int(time.time() * 1000)
        resp = http.post(f"/topics/persistent/{unique}/ns/x",
                         json={"messages": [{"payload": f"m{i}", "deliverAfterMs": 5000}
                                            for i in range(20)]})
        after = int(time.time() * 1000)
    assert resp.status_code == 200, resp.text
    results = resp.json()["messagePublishResults"]
    assert all(x["errorCode"] == 0 for x in results), results
    want: dict[int, set[int]] = {}
    for x in results:
        kt, part, off = x["messageId"].rsplit(":", 2)
        assert kt == names.DELAYED
        want.setdefault(int(part), set()).add(int(off))
    idx = TopicIndex(r, topic)

    def indexed():
        got: dict[int, set[int]] = {}
        for b in idx.buckets():
            for p, bm in idx.read_bucket(b).items():
                got.setdefault(p, set()).update(bm)
        return got == want and got

    _wait(indexed, 60, "admission's messages indexed")
    # deliverAt = publishTime + 5000, so the buckets lie within the 1 s tick of that window
    lo, hi = bucket_start(before + 5000, TICK), bucket_start(after + 5000, TICK)
    assert all(lo <= b <= hi for b in idx.buckets())
    # Started at the end, the tracker re-read nothing of what the delay log held before:
    # its check finds no index entries for the group's offsets and rebuilds from the low
    # watermarks, which start at the end too, so at most this test's own records.
    metrics = httpx.get(f"{tracker.url}/metrics", timeout=10).text
    reread = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith("dwell_tracker_rebuild_positions_total{")]
    assert sum(reread) <= len(results), reread
    tracker.stop()
    admission.stop()
    policy.stop()
