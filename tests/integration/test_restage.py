"""The tracker's restage on real Redis and Kafka: a chunk of future buckets whose records
lie scattered over the delay log is re-filed into one dense run per bucket, carrying the
originals' payloads, headers, message ids and origins; nearer and later chunks and
fixed-delay topics are left alone; a round that fails loses nothing."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import redis as redislib
from prometheus_client import REGISTRY

from dwell.adapters.kafka import BulkProducer, Consumer, Producer, ensure_topic, read_from
from dwell.adapters.redis import connect
from dwell.core.positions import REFILED_FIELD_BASE, format_message_id
from dwell.index.topic import TopicIndex
from dwell.tracker.ingest import FIXED_FIELD
from dwell.tracker.ingest_loop import IngestLoop
from dwell.tracker.restage import PIECE_RECORDS, Restager
from dwell_dev.testkit import redis_db_url, wait_for

pytestmark = pytest.mark.integration
TICK = 1000
LEAD, CHUNK = 40_000, 20_000
# A database of its own: a restager looks at every topic of its Redis.
DB = 11


@pytest.fixture()
def redis_url(stack) -> str:
    url = redis_db_url(stack, DB)
    connect(url).flushdb()
    return url


@pytest.fixture()
def delayed_topic(kafka_bootstrap: str, unique: str) -> str:
    name = f"test.restage.{unique}"
    ensure_topic(kafka_bootstrap, name, 2)
    ensure_topic(kafka_bootstrap, f"{name}.refiled", 2)
    return name


@pytest.fixture()
def ingest(redis_url, kafka_bootstrap, delayed_topic, unique):
    """The tracker's two ingest loops: the delay log, and the re-file log's copies."""
    loops = [IngestLoop(connect(redis_url), kafka_bootstrap, delayed_topic, f"trk-{unique}",
                        poll_timeout_ms=20),
             IngestLoop(connect(redis_url), kafka_bootstrap, f"{delayed_topic}.refiled",
                        f"trk-{unique}", source=delayed_topic,
                        field_base=REFILED_FIELD_BASE, poll_timeout_ms=20)]
    threads = [threading.Thread(target=loop.run, daemon=True) for loop in loops]
    for t in threads:
        t.start()
    yield loops
    for loop in loops:
        loop.stop()
    for t in threads:
        t.join(10)


def restager(r, bootstrap: str, delayed_topic: str, **kw) -> Restager:
    return Restager(r, bootstrap, delayed_topic=delayed_topic,
                    refiled_topic=f"{delayed_topic}.refiled",
                    **{"lead_ms": LEAD, "chunk_ms": CHUNK, **kw})


def _publish(bootstrap: str, delayed_topic: str, topic: str,
             deliver_ats: list[int]) -> list[tuple[int, int, int]]:
    """dwell.delayed records as admission writes them; returns (partition, offset, at)."""
    p = Producer(bootstrap, linger_ms=20)
    futs = [p.send(delayed_topic, b"payload-%d" % i, topic,
                   {"dwell-deliver-at": str(d), "dwell-tick-time": str(TICK),
                    "dwell-topic": topic, "dwell-key": f"k{i}", "colour": "red",
                    # a client's token, which no copy may carry
                    "dwell-authorization": "Bearer token-of-a-client"})
            for i, d in enumerate(deliver_ats)]
    p.flush()
    p.close()
    return [(*f.result(), d) for f, d in zip(futs, deliver_ats, strict=True)]


def _positions(r, topic: str) -> dict[int, dict[int, set[int]]]:
    idx = TopicIndex(r, topic)
    return {b: {p: set(bm) for p, bm in idx.read_bucket(b).items()} for b in idx.buckets()}


def _count(r, topic: str) -> int:
    return sum(len(o) for fields in _positions(r, topic).values() for o in fields.values())




@pytest.mark.parametrize("piece", [PIECE_RECORDS, 7], ids=["one-piece", "pieces-of-7"])
def test_a_chunk_of_scattered_buckets_is_refiled_as_one_dense_run_per_bucket(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest, piece) -> None:
    """``pieces-of-7``: the round reads and writes about 7 records at a time, cut by
    offset (a bucket's 40 go in several pieces, a piece spans buckets): each piece's
    copies go bucket after bucket, so a bucket is one run per piece it spans."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/restage-{unique}"
    now = (int(time.time() * 1000) // CHUNK) * CHUNK + 1000
    k = (now + LEAD) // CHUNK
    first = k * CHUNK
    # Three buckets of the chunk, interleaved record by record with a bucket before it
    # and one after it, so that each bucket is scattered over the log.
    inside = [first + 1500, first + 7200, first + CHUNK - 1]
    before, after = first - 500, first + CHUNK + 300
    ats = [d for _ in range(40) for d in (*inside, before, after)]
    rows = _publish(kafka_bootstrap, delayed_topic, topic, ats)
    wait_for(lambda: _count(r, topic) == len(rows), 20, "the ingest of the originals")
    assert r.hget(f"dwell:stats:{{{topic}}}", FIXED_FIELD) == b"0"

    rs = restager(r, kafka_bootstrap, delayed_topic, piece_records=piece)
    try:
        # The first round only notes the topic (the due chunk may be too near to move).
        assert rs.run_once(now - CHUNK).records == 0
        assert TopicIndex(r, topic).restaged_chunk() == k - 1
        rnd = rs.run_once(now)
        assert (rnd.chunk, rnd.buckets, rnd.records) == (k, 3, 120)
        assert TopicIndex(r, topic).restaged_chunk() == k
        # Done once: the same chunk again, or an earlier round, moves nothing.
        assert rs.run_once(now).records == 0
        assert rs.run_once(now - CHUNK).records == 0
    finally:
        rs.close()

    original = {(p, o): d for p, o, d in rows}
    moved = {b - b % TICK for b in inside}
    got = wait_for(lambda: (lambda x: x if sum(len(o) for f in x.values() for o in f.values())
                         == len(rows) else None)(_positions(r, topic)),
                20, "the ingest of the copies")
    for b, fields in got.items():
        offsets = sorted(o for offs in fields.values() for o in offs)
        assert len(fields) == 1, "a topic's records share one partition"
        [field] = fields
        if b in moved:
            # One dense run each in the re-file log, or one per piece.
            assert field >= REFILED_FIELD_BASE
            runs = 1 + sum(b - a > 1 for a, b in zip(offsets, offsets[1:], strict=False))
            assert len(offsets) == 40 and runs <= -(-120 // piece), b
        else:
            assert {(p, o) for p, offs in fields.items() for o in offs} == {
                (p, o) for (p, o), d in original.items() if d - d % TICK == b}

    copies = read_from(kafka_bootstrap, f"{delayed_topic}.refiled", {})
    assert len(copies) == 120
    # Bucket after bucket (within each piece), each in the order the originals were written.
    if piece == PIECE_RECORDS:
        assert [int(c.header("dwell-deliver-at")) for c in copies] == sorted(
            int(c.header("dwell-deliver-at")) for c in copies)
    for c in copies:
        p, _, o = (c.header("dwell-origin") or "").partition(":")
        src = (int(p), int(o))
        assert src in original and original[src] == int(c.header("dwell-deliver-at") or 0)
        assert c.header("dwell-message-id") == format_message_id(delayed_topic, *src)
        i = int(c.value.split(b"-")[1])
        assert c.key == topic.encode() and c.header("dwell-key") == f"k{i}"
        assert c.header("colour") == "red" and c.header("dwell-tick-time") == str(TICK)
        assert ats[i] == int(c.header("dwell-deliver-at") or 0)


def _assert_left_alone(rs: Restager, topic: str, now: int) -> None:
    """Two rounds of ``rs`` (the first notes topics, the second re-files) move nothing of
    ``topic`` and leave it unmarked."""
    before = _positions(rs.redis, topic)
    try:
        rs.run_once(now - CHUNK)
        assert rs.run_once(now).records == 0
    finally:
        rs.close()
    assert _positions(rs.redis, topic) == before
    assert TopicIndex(rs.redis, topic).restaged_chunk() is None


def test_fixed_delay_topics_are_left_in_place(redis_url, kafka_bootstrap, delayed_topic,
                                              unique, ingest) -> None:
    r = connect(redis_url)
    topic = f"persistent://t/ns/fixed-{unique}"
    now = int(time.time() * 1000)
    k = (now + LEAD) // CHUNK
    rows = _publish(kafka_bootstrap, delayed_topic, topic,
                    [k * CHUNK + 100 + i for i in range(50)])
    wait_for(lambda: _count(r, topic) == len(rows), 20, "the ingest")
    assert r.hget(f"dwell:stats:{{{topic}}}", FIXED_FIELD) == b"1"
    _assert_left_alone(restager(r, kafka_bootstrap, delayed_topic), topic, now)


def test_a_restage_of_another_delayed_topic_leaves_the_topic_alone(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest) -> None:
    r = connect(redis_url)
    topic = f"persistent://t/ns/foreign-{unique}"
    now = int(time.time() * 1000)
    k = (now + LEAD) // CHUNK
    rows = _publish(kafka_bootstrap, delayed_topic, topic,
                    [k * CHUNK + d for _ in range(5) for d in (3000, 1000)])
    wait_for(lambda: _count(r, topic) == len(rows), 20, "the ingest")
    assert r.hget(f"dwell:stats:{{{topic}}}", "delayedTopic") == delayed_topic.encode()
    _assert_left_alone(restager(r, kafka_bootstrap, f"{delayed_topic}.other"), topic, now)


def test_a_failed_round_loses_nothing(redis_url, kafka_bootstrap, delayed_topic, unique,
                                      ingest) -> None:
    """Kafka unreachable mid-round: the claims stay leased, then return to the index with
    every original position, and the chunk is re-filed by the next round."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/fail-{unique}"
    now = (int(time.time() * 1000) // CHUNK) * CHUNK + 1000
    k = (now + LEAD) // CHUNK
    ats = [k * CHUNK + d for _ in range(10) for d in (3000, 1000, 2000)]
    rows = _publish(kafka_bootstrap, delayed_topic, topic, ats)
    wait_for(lambda: _count(r, topic) == len(rows), 20, "the ingest")
    before = _positions(r, topic)
    idx = TopicIndex(r, topic)
    idx.mark_restaged(k - 1)
    dead = restager(r, "127.0.0.1:1", delayed_topic, lease_ms=2000)
    t0 = time.monotonic()
    try:
        with pytest.raises(Exception):  # noqa: B017 - whichever client error comes first
            dead.run_once(now)
    finally:
        dead.close()
    # The round renewed its leases while it tried: they run a lease past its end.
    ended = now + int((time.monotonic() - t0) * 1000)
    assert idx.restaged_chunk() == k - 1
    assert _positions(r, topic) == {}, "claimed while the round ran"
    rs = restager(r, kafka_bootstrap, delayed_topic)
    try:
        # After the lease the claims come back with every position, and are re-filed.
        rnd = rs.run_once(ended + 2000)
        assert rnd.records == len(rows)
    finally:
        rs.close()
    assert idx.restaged_chunk() == k
    got = wait_for(lambda: (lambda x: x if sum(len(o) for f in x.values() for o in f.values())
                         == len(rows) else None)(_positions(r, topic)), 20, "the copies")
    assert set(got) == set(before)


def test_a_chunk_refiled_again_keeps_the_originals_ids(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest) -> None:
    """Copies in the re-file log can be claimed again (a mark that fell behind): they are
    re-filed from there, still naming the original record."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/again-{unique}"
    now = (int(time.time() * 1000) // CHUNK) * CHUNK + 1000
    k = (now + LEAD) // CHUNK
    rows = _publish(kafka_bootstrap, delayed_topic, topic,
                    [k * CHUNK + d for _ in range(10) for d in (4000, 2000)])
    wait_for(lambda: _count(r, topic) == len(rows), 20, "the ingest")
    idx = TopicIndex(r, topic)
    idx.mark_restaged(k - 1)
    rs = restager(r, kafka_bootstrap, delayed_topic)
    try:
        assert rs.run_once(now).records == len(rows)
        wait_for(lambda: _count(r, topic) == len(rows), 20, "the first copies")
        r.set(idx.keys.restaged, k - 1)
        assert rs.run_once(now).records == len(rows)
    finally:
        rs.close()
    got = wait_for(lambda: (lambda x: x if sum(len(o) for f in x.values() for o in f.values())
                         == len(rows) else None)(_positions(r, topic)), 20, "the copies")
    copies = {(rec.partition, rec.offset): rec
              for rec in read_from(kafka_bootstrap, f"{delayed_topic}.refiled", {})}
    indexed = [(f - REFILED_FIELD_BASE, o) for fields in got.values()
               for f, offs in fields.items() for o in offs]
    assert len(copies) == 2 * len(rows) and all(f >= 0 for f, _ in indexed)
    assert all(rec.header("dwell-authorization") is None for rec in copies.values())
    # The index points at the second copies; each names its original.
    originals = {(p, o) for p, o, _ in rows}
    named = set()
    for pos in indexed:
        p, _, o = (copies[pos].header("dwell-origin") or "").partition(":")
        named.add((int(p), int(o)))
        assert copies[pos].header("dwell-message-id") == format_message_id(
            delayed_topic, int(p), int(o))
    assert named == originals
    assert min(o for _, o in indexed) >= len(rows), "the second copies"


def test_kill_9_of_the_tracker_mid_restage_loses_nothing(
        services, redis_url, kafka_bootstrap, delayed_topic, unique) -> None:
    """The tracker killed while a chunk is claimed and being copied: once its lease is
    over, the restarted tracker finds every original again (in place, or re-filed with
    its origin); repeats are allowed (the SDK drops them), losses are not."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/crash-{unique}"
    lead, chunk, lease = 20_000, 10_000, 3_000
    env = {"DWELL_REDIS_URL": redis_url, "DWELL_DELAYED_TOPIC": delayed_topic,
           "DWELL_TRACKER_GROUP_ID": f"dwell-trk-{unique}", "DWELL_RESTAGE_LEAD_MS": str(lead),
           "DWELL_RESTAGE_CHUNK_MS": str(chunk), "DWELL_RESTAGE_LEASE_MS": str(lease),
           "DWELL_RESTAGE_INTERVAL_MS": "20"}
    # A chunk whose turn comes 6-16 s from now: time to publish and index it first.
    target = -(-(int(time.time() * 1000) + 6_000 + lead) // chunk)
    n = 40_000
    ats = [target * chunk + (i * 37) % chunk if i % 2 else (target + 3) * chunk + i % chunk
           for i in range(n)]
    p = Producer(kafka_bootstrap, linger_ms=20)
    futs = [p.send(delayed_topic, b"%d:" % i + b"x" * 1000, topic,
                   {"dwell-deliver-at": str(d), "dwell-tick-time": str(TICK)})
            for i, d in enumerate(ats)]
    p.flush()
    p.close()
    in_chunk = {f.result() for i, f in enumerate(futs) if i % 2}
    idx = TopicIndex(r, topic)
    idx.mark_restaged(target - 1)
    tracker = services.start("tracker", env=env, ready=False)
    try:
        wait_for(lambda: r.zcard(idx.keys.claims) > 0, 30, "the restage round", 0.002)
    finally:
        tracker.kill()
    assert r.zcard(idx.keys.claims) > 0, "the kill did not land mid-round"
    assert idx.restaged_chunk() == target - 1
    again = services.start("tracker", env=env, ready=False)
    try:
        wait_for(lambda: idx.restaged_chunk() == target and not r.zcard(idx.keys.claims)
                 and _count(r, topic) >= n, 120, "the chunk re-filed after the lease")
        got = _positions(r, topic)
    finally:
        again.stop()
    copies = {(rec.partition, rec.offset): rec.header("dwell-origin")
              for rec in read_from(kafka_bootstrap, f"{delayed_topic}.refiled", {})}
    found = set()
    for fields in got.values():
        for f, offs in fields.items():
            for o in offs:
                if f >= REFILED_FIELD_BASE:
                    part, _, off = (copies[(f - REFILED_FIELD_BASE, o)] or "").partition(":")
                    found.add((int(part), int(off)))
                else:
                    found.add((f, o))
    assert in_chunk <= found, f"{len(in_chunk - found)} of the chunk's messages lost"
    assert {f.result() for f in futs} == found
    print(f"kill -9 mid-restage: {len(in_chunk)} messages in the chunk, "
          f"{sum(len(o) for fs in got.values() for o in fs.values()) - n} indexed twice")


SLOW_SEND_S = 0.25


@pytest.fixture()
def slow_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow Kafka: every batch the restage hands its producer waits SLOW_SEND_S before
    it goes (to the real broker)."""
    send = BulkProducer.send_unreported

    def slow(self, out, *args, **kw):
        time.sleep(SLOW_SEND_S)
        return send(self, out, *args, **kw)

    monkeypatch.setattr(BulkProducer, "send_unreported", slow)


def test_a_round_longer_than_its_lease_refiles_each_record_once(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest, slow_kafka) -> None:
    """A restage round slowed down by a slow Kafka (every batch it hands its producer
    waits 0.25 s before it goes) runs for several of its 1 s leases while another
    tracker's restage tries the same chunk every 50 ms: the round's leases are renewed,
    so the other never claims the chunk, and each original is re-filed once. Without
    renewal the other claims the buckets once the lease is over and re-files them again."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/slow-{unique}"
    base = (int(time.time() * 1000) // CHUNK) * CHUNK + 1000
    started = time.monotonic()

    def now() -> int:  # the test's clock: base, plus the time since
        return base + int((time.monotonic() - started) * 1000)

    k, n, rows, idx = _three_buckets(r, kafka_bootstrap, delayed_topic, topic, base)
    renewed = _metric("dwell_tracker_restage_lease_renewals_total")
    rs = restager(r, kafka_bootstrap, delayed_topic, lease_ms=1000, piece_records=200)
    other = restager(r, kafka_bootstrap, delayed_topic, lease_ms=1000, piece_records=200)
    stop, moved = threading.Event(), []

    def rival() -> None:
        while not r.zcard(idx.keys.claims) and not stop.wait(0.005):
            pass
        while not stop.is_set():
            moved.append(other.run_once(now()).records)
            stop.wait(0.05)

    t = threading.Thread(target=rival, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        rnd = rs.run_once(now())
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join(60)
        rs.close()
        other.close()
    assert rnd.records == n and rnd.chunk == k
    assert took > 3, f"the round took only {took:.1f}s"
    assert sum(moved) == 0
    assert idx.restaged_chunk() == k
    origins = Counter(c.header("dwell-origin")
                      for c in read_from(kafka_bootstrap, f"{delayed_topic}.refiled", {}))
    assert set(origins) == {f"{p}:{o}" for p, o, _ in rows}
    assert {o: c for o, c in origins.items() if c != 1} == {}
    assert _metric("dwell_tracker_restage_lease_renewals_total") - renewed >= 3
    print(f"restage round of {n} records over {took:.1f}s with a 1 s lease: each re-filed once")


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _three_buckets(r: redislib.Redis, kafka_bootstrap: str, delayed_topic: str, topic: str,
                   now_ms: int) -> tuple[int, int, list[tuple[int, int, int]], TopicIndex]:
    """3,000 records in three buckets of the chunk the restage takes next at ``now_ms``,
    indexed, with the chunk before marked restaged: (chunk, records, what _publish
    wrote, the topic's index)."""
    k = (now_ms + LEAD) // CHUNK
    n = 3000
    rows = _publish(kafka_bootstrap, delayed_topic, topic,
                    [k * CHUNK + d for _ in range(n // 3) for d in (3000, 1000, 2000)])
    wait_for(lambda: _count(r, topic) == n, 20, "the ingest")
    idx = TopicIndex(r, topic)
    idx.mark_restaged(k - 1)
    return k, n, rows, idx


def test_a_round_that_lost_a_lease_leaves_that_bucket_to_its_new_holder(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest, slow_kafka) -> None:
    """Another round holds one of the round's buckets now (its lease id replaced ours, as
    claim-6.lua leaves it after a lease ran out): the round's next renewal finds out, and
    the round re-files no more of that bucket's records (pieces cut by offset hold part of
    every bucket: those copied before are Kafka-level repeats the SDK drops), and neither
    marks nor completes it; the other buckets are re-filed as usual."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/lost-{unique}"
    now = (int(time.time() * 1000) // CHUNK) * CHUNK + 1000
    k, n, rows, idx = _three_buckets(r, kafka_bootstrap, delayed_topic, topic, now)
    # 200 records a piece, fifteen pieces: most come after the next renewal.
    taken = k * CHUNK + 3000
    lost = _metric("dwell_tracker_restage_leases_lost_total")

    def take_over() -> None:
        wait_for(lambda: r.hexists(idx.keys.leases, taken), 10, "the claim", 0.005)
        time.sleep(0.2)
        r.hset(idx.keys.leases, taken, "another-round")

    t = threading.Thread(target=take_over, daemon=True)
    t.start()
    rs = restager(r, kafka_bootstrap, delayed_topic, lease_ms=1000, piece_records=200)
    try:
        rnd = rs.run_once(now)
    finally:
        t.join(10)
        rs.close()
    origins = [c.header("dwell-origin")
               for c in read_from(kafka_bootstrap, f"{delayed_topic}.refiled", {})]
    others = {f"{p}:{o}" for p, o, at in rows if at - at % TICK != taken}
    assert rnd.records == len(origins) == len(set(origins))
    assert others <= set(origins)
    print(f"copies of the lost bucket: {len(set(origins) - others)} of {n // 3}")
    assert len(set(origins) - others) < n // 3
    assert _metric("dwell_tracker_restage_leases_lost_total") - lost == 1
    assert r.hget(idx.keys.leases, taken) == b"another-round"
    assert [int(b) for b in r.zrange(idx.keys.claims, 0, -1)] == [taken]


def _sixty_a_chunk(r, bootstrap: str, delayed_topic: str, topic: str,
                   chunks: int) -> tuple[int, int, list[tuple[int, int, int]]]:
    """60 records of ``topic`` in one bucket of each of ``chunks`` chunks from the one due
    now, interleaved, and indexed; returns (now, the due chunk, the records)."""
    now = (int(time.time() * 1000) // CHUNK) * CHUNK + 1000
    k = (now + LEAD) // CHUNK
    ats = [(k + c) * CHUNK + 2500 for _ in range(60) for c in range(chunks)]
    rows = _publish(bootstrap, delayed_topic, topic, ats)
    wait_for(lambda: _count(r, topic) == len(rows), 20, "the ingest of the originals")
    return now, k, rows


@pytest.mark.parametrize(("max_records", "ahead"), [(10_000, 2), (150, 1)],
                         ids=["two-ahead", "held-by-max-records"])
def test_a_large_chunk_takes_the_next_chunks_in_the_same_round(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest, max_records, ahead) -> None:
    """A due chunk of at least ``ahead_records`` takes up to ``ahead_chunks`` more
    chunks with it, while the round would stay within ``max_records``; the chunks taken
    are marked done and the rounds they were due in move nothing; the chunk after them
    is re-filed in its own round."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/ahead-{unique}"
    now, k, rows = _sixty_a_chunk(r, kafka_bootstrap, delayed_topic, topic, 4)

    rs = restager(r, kafka_bootstrap, delayed_topic, ahead_records=50, ahead_chunks=2,
                  max_records=max_records)
    try:
        rs.run_once(now - CHUNK)
        rs.copy_rate = 1e9  # as measured by a fast copier's last round
        rnd = rs.run_once(now)
        assert (rnd.chunk, rnd.ahead, rnd.records) == (k, ahead, 60 * (1 + ahead))
        assert TopicIndex(r, topic).restaged_chunk() == k + ahead
        for c in range(1, ahead + 1):
            assert rs.run_once(now + c * CHUNK).records == 0
        rs.copy_rate = 1e9
        # The chunk after those taken holds 60: its own round, which takes nothing ahead
        # (the chunks after it are empty).
        later = rs.run_once(now + (ahead + 1) * CHUNK)
        assert (later.records, later.ahead) == (60 * (3 - ahead), 0 if ahead == 2 else 1)
    finally:
        rs.close()
    got = wait_for(lambda: (lambda x: x if sum(len(o) for f in x.values() for o in f.values())
                            == len(rows) else None)(_positions(r, topic)),
                   20, "the ingest of the copies")
    assert all(f >= REFILED_FIELD_BASE for fields in got.values() for f in fields)
    copies = read_from(kafka_bootstrap, f"{delayed_topic}.refiled", {})
    assert sorted(c.header("dwell-origin") for c in copies) == sorted(
        f"{p}:{o}" for p, o, _ in rows)


def test_a_chunk_another_claim_holds_is_not_taken_ahead(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest) -> None:
    """A bucket of the next chunk held by another claim (another replica's round, or a
    dead tracker's) stops the round from going ahead: that chunk stays not done."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/held-{unique}"
    now, k, _ = _sixty_a_chunk(r, kafka_bootstrap, delayed_topic, topic, 2)
    idx = TopicIndex(r, topic)
    [held] = idx.claim_between((k + 1) * CHUNK, (k + 2) * CHUNK - 1, now, 10, 600_000)

    rs = restager(r, kafka_bootstrap, delayed_topic, ahead_records=50)
    try:
        rs.run_once(now - CHUNK)
        rs.copy_rate = 1e9
        rnd = rs.run_once(now)
        assert (rnd.ahead, rnd.records) == (0, 60)
        assert idx.restaged_chunk() == k
        assert idx.complete(held.bucket_start, held.lease_id)
    finally:
        rs.close()


@pytest.mark.parametrize("rate", [None, 4.0], ids=["no-rate-yet", "too-slow"])
def test_a_large_chunk_goes_alone_when_the_round_might_not_end_before_it_is_due(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest, rate) -> None:
    """The due chunk's claims complete with the whole round: with no copy rate measured
    yet, or one at which the due and the next chunk's 120 records would take 30 s of the
    39 s left (more than half), the due chunk goes alone."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/alone-{unique}"
    now, k, _ = _sixty_a_chunk(r, kafka_bootstrap, delayed_topic, topic, 2)
    rs = restager(r, kafka_bootstrap, delayed_topic, ahead_records=50)
    try:
        rs.run_once(now - CHUNK)
        rs.copy_rate = rate
        rnd = rs.run_once(now)
        assert (rnd.ahead, rnd.records) == (0, 60)
        assert TopicIndex(r, topic).restaged_chunk() == k
        # A round of fewer than RATE_RECORDS does not measure the rate; the next chunk
        # is re-filed in its own round.
        assert rs.copy_rate == rate
        assert rs.run_once(now + CHUNK).records == 60
    finally:
        rs.close()


def test_an_original_that_claims_an_id_or_origin_is_copied_with_its_own(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest) -> None:
    """A record on the delay log carrying `dwell-message-id` or `dwell-origin` (admission
    refuses `dwell-*` properties; only a direct writer to Kafka can set them) is copied
    with the id and origin of where it lies, once each: the drain trusts a copy's."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/forged-{unique}"
    now = (int(time.time() * 1000) // CHUNK) * CHUNK + 1000
    at = (now + LEAD) // CHUNK * CHUNK + 2500
    # First a record due a chunk later: delivery times out of order, the delays vary.
    _publish(kafka_bootstrap, delayed_topic, topic, [at + CHUNK])
    p = Producer(kafka_bootstrap, linger_ms=0)
    f = p.send(delayed_topic, b"forged", topic,
               {"dwell-deliver-at": str(at), "dwell-tick-time": str(TICK),
                "dwell-topic": topic, "dwell-key": "k0",
                "dwell-message-id": "persistent://other/ns/t:0:7", "dwell-origin": "0:7"})
    p.flush()
    p.close()
    partition, offset = f.result()
    wait_for(lambda: _count(r, topic) == 2, 20, "the ingest of the originals")
    assert r.hget(f"dwell:stats:{{{topic}}}", FIXED_FIELD) == b"0"
    rs = restager(r, kafka_bootstrap, delayed_topic)
    try:
        rs.run_once(now - CHUNK)
        assert rs.run_once(now).records == 1
    finally:
        rs.close()
    # Every header as written (Record.headers keeps one value a name).
    c = Consumer(kafka_bootstrap, f"forged-{unique}")
    c.assign([(f"{delayed_topic}.refiled", p, 0) for p in (0, 1)])
    got = []
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        got = c.poll_messages(10, 0.5)
    c.close()
    [copy] = got
    headers = copy.headers() or []
    assert [v for k, v in headers if k == "dwell-message-id"] == [
        format_message_id(delayed_topic, partition, offset).encode()]
    assert [v for k, v in headers if k == "dwell-origin"] == [b"%d:%d" % (partition, offset)]


def test_a_chunk_that_would_be_refiled_after_it_is_due_is_left_in_place(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest) -> None:
    """At a copy rate of one record a second, the due chunk's 60 records would take 60 s
    of the 39 s left: the chunk is marked done, nothing is claimed or copied, and the
    metric counts what was left."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/left-{unique}"
    now, k, _ = _sixty_a_chunk(r, kafka_bootstrap, delayed_topic, topic, 2)
    before = _positions(r, topic)
    left = REGISTRY.get_sample_value("dwell_tracker_restage_left_total") or 0.0
    rs = restager(r, kafka_bootstrap, delayed_topic)
    try:
        rs.run_once(now - CHUNK)
        rs.copy_rate = 1.0
        rnd = rs.run_once(now)
        assert (rnd.records, rnd.buckets) == (0, 0)
        assert TopicIndex(r, topic).restaged_chunk() == k
        assert REGISTRY.get_sample_value("dwell_tracker_restage_left_total") == left + 60
        assert _positions(r, topic) == before
        # At a rate that fits, the next chunk is re-filed.
        rs.copy_rate = 1000.0
        assert rs.run_once(now + CHUNK).records == 60
    finally:
        rs.close()


def test_chunks_whose_lead_passed_are_counted_and_left_in_place(
        redis_url, kafka_bootstrap, delayed_topic, unique, ingest) -> None:
    """A round that ran long (or a tracker that was down) leaves chunks behind whose lead
    passed: their records are counted in the metric once, and left where they lie for the
    drain; the round goes on with the chunk due now."""
    r = connect(redis_url)
    topic = f"persistent://t/ns/passed-{unique}"
    now, k, _ = _sixty_a_chunk(r, kafka_bootstrap, delayed_topic, topic, 3)
    before = _positions(r, topic)
    rs = restager(r, kafka_bootstrap, delayed_topic)
    try:
        rs.run_once(now - CHUNK)
        assert TopicIndex(r, topic).restaged_chunk() == k - 1
        left = _metric("dwell_tracker_restage_left_total")
        # Two chunks later: chunks k and k + 1 passed; k + 2 is due.
        rnd = rs.run_once(now + 2 * CHUNK)
        assert _metric("dwell_tracker_restage_left_total") == left + 120
        assert rnd.records == 60
        assert TopicIndex(r, topic).restaged_chunk() == k + 2
        passed = {b: v for b, v in before.items() if b < (k + 2) * CHUNK}
        assert len(passed) == 2
        assert {b: v for b, v in _positions(r, topic).items() if b in passed} == passed
        rs.run_once(now + 2 * CHUNK)
        assert _metric("dwell_tracker_restage_left_total") == left + 120  # counted once
    finally:
        rs.close()
