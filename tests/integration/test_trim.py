"""Disk given back as messages are delivered (real Redis, Kafka and tracker process): the
tracker's trim deletes the delay log's records below the committed low watermarks and
the `dwell.delivered` marks no rebuild needs, and a Redis that loses everything after a
trim still rebuilds every pending message, without what was delivered. The test plays
the drain through the index's own API, as tests/integration/test_index_rebuild.py does."""

from __future__ import annotations

import base64
import time

import httpx
import orjson
import pytest
import redis as redislib
from pyroaring import BitMap64

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics as names
from dwell.index.marks import mark_record, write_marks
from dwell.index.roaring import decode
from dwell.index.topic import TopicIndex
from dwell.tracker.recovery import committed_lowmarks
from dwell.tracker.trim import Trimmer
from dwell_dev.testkit import free_port, publish_delayed, redis_db_url, wait_for

pytestmark = pytest.mark.integration

DB = 5


# How long the second test's tracker keeps delivered records.
KEEP_MS = 10000


def _tracker(services, stack, unique: str, keep_ms: int):  # type: ignore[no-untyped-def]
    env = {"DWELL_REDIS_URL": redis_db_url(stack, DB),
           "DWELL_DELAYED_TOPIC": f"dwell.delayed.{unique}",
           "DWELL_TRACKER_GROUP_ID": f"dwell-trk-{unique}", "DWELL_RESTAGE_ENABLED": "false",
           "DWELL_LOWMARK_INTERVAL_MS": "300", "DWELL_REDIS_CHECK_INTERVAL_MS": "200",
           "DWELL_TRIM_INTERVAL_MS": "500", "DWELL_TRIM_KEEP_DELIVERED_MS": str(keep_ms)}
    r = redis_adapter.connect(env["DWELL_REDIS_URL"])
    r.flushdb()
    svc = services.start("tracker", env=env)
    yield svc, r, env["DWELL_DELAYED_TOPIC"], env["DWELL_TRACKER_GROUP_ID"]
    svc.stop()


@pytest.fixture()
def tracker(services, stack, unique: str):  # type: ignore[no-untyped-def]
    yield from _tracker(services, stack, unique, 0)


@pytest.fixture()
def keeping_tracker(services, stack, unique: str):  # type: ignore[no-untyped-def]
    yield from _tracker(services, stack, unique, KEEP_MS)


def _positions(r, topic: str) -> set[tuple[int, int]]:  # type: ignore[no-untyped-def]
    idx = TopicIndex(r, topic)
    return {(int(f), int(o)) for b in idx.buckets()
            for f, bm in idx.read_bucket(b).items() for o in bm}


def _drain_due(r, bootstrap: str, log: str, topic: str) -> set[tuple[int, int]]:  # type: ignore[no-untyped-def]
    idx = TopicIndex(r, topic)
    claims = idx.claim(int(time.time() * 1000), 1000, 30_000, strict=False)
    marks = kafka.BulkProducer(bootstrap)
    try:
        write_marks(marks, [mark_record(log, topic, b.bucket_start, b.positions)
                            for b in claims])
    finally:
        marks.close()
    for b in claims:
        assert idx.complete(b.bucket_start, b.lease_id)
    return {(int(f), int(o)) for b in claims for f, bm in b.positions.items() for o in bm}


def _starts(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's first offset (its low watermark: the first record timestamped
    at or after 0)."""
    return kafka.offsets_at(bootstrap, topic, 0)


def _marks_of(bootstrap: str, log: str) -> list[tuple[int, int, bool]]:
    """(lowest, highest offset named, trimmable) of each dwell.delivered record of ``log``;
    trimmable when no record of another log comes before it in its partition (those
    after one are not this tracker's to trim)."""
    out, blocked = [], set()
    for rec in kafka.iter_from(bootstrap, names.DELIVERED, {}):
        body = orjson.loads(rec.value)
        if body["log"] != log:
            blocked.add(rec.partition)
            continue
        bms = [decode(base64.b64decode(b)) for b in body["fields"].values()]
        out.append((min(bm.min() for bm in bms), max(bm.max() for bm in bms),
                    rec.partition not in blocked))
    return out


def test_trim_gives_disk_back_and_a_flush_still_rebuilds(tracker, kafka_bootstrap: str,
                                                         unique: str) -> None:
    svc, r, log, group = tracker
    topic = f"persistent://{unique}/ns/x"
    now = int(time.time() * 1000)
    # One partition (the records share their key): offsets 0..499 due now and delivered.
    publish_delayed(kafka_bootstrap, log, topic, [now - 5000] * 500)
    wait_for(lambda: len(_positions(r, topic)) == 500, 30, "500 positions indexed")
    first = _drain_due(r, kafka_bootstrap, log, topic)
    # 500..1999 pending for ten minutes, then 2000..2199 due now and delivered: their mark
    # names positions above the low watermark, which a rebuild needs.
    publish_delayed(kafka_bootstrap, log, topic,
             [now + 600_000 + i * 40 for i in range(1500)] + [now - 3000] * 200)
    wait_for(lambda: len(_positions(r, topic)) == 1700, 30, "1,700 positions indexed")
    second = _drain_due(r, kafka_bootstrap, log, topic)
    assert len(first) == 500 and len(second) == 200
    pending = _positions(r, topic)
    (part,) = {f for f, _ in pending}
    assert len(pending) == 1500 and min(o for _, o in pending) == 500

    wait_for(lambda: _starts(kafka_bootstrap, log)[part] == 500, 60,
             "the delay log's records below the low watermark deleted")
    print(f"\n{log} start offsets after the trim: {_starts(kafka_bootstrap, log)}")
    lows = committed_lowmarks(kafka_bootstrap, group, [(log, p) for p in range(4)])
    assert lows[(log, part)] == 500  # never past what is pending
    wait_for(lambda: not [m for m in _marks_of(kafka_bootstrap, log) if m[2] and m[1] < 500],
             60, "the delivered mark of offsets 0..499 deleted")
    assert any(lo >= 2000 for lo, _, _ in _marks_of(kafka_bootstrap, log)), \
        "the mark a rebuild needs is kept"

    # Redis loses everything: the rebuild reads the log from its low watermark (its new
    # start) and skips what the kept mark says was delivered.
    r.flushdb()
    wait_for(lambda: _positions(r, topic) == pending, 120,
             "the index rebuilt with exactly the pending positions")
    assert not (_positions(r, topic) & (first | second))
    assert f'dwell_tracker_trimmed_records_total{{topic="{log}"}} 500.0' in (
        httpx.get(svc.url + "/metrics").text)


def test_delivered_records_stay_for_their_redeliveries(keeping_tracker, kafka_bootstrap: str,
                                                       unique: str) -> None:
    """A delivered message may be nacked or time out, and its redelivery is copied from
    its record: the trim keeps it DWELL_TRIM_KEEP_DELIVERED_MS after the low watermark
    passed it, then deletes it."""
    svc, r, log, group = keeping_tracker
    topic = f"persistent://{unique}/ns/x"
    publish_delayed(kafka_bootstrap, log, topic, [int(time.time() * 1000) - 5000] * 100)
    wait_for(lambda: len(_positions(r, topic)) == 100, 30, "100 positions indexed")
    delivered = time.monotonic()
    assert len(_drain_due(r, kafka_bootstrap, log, topic)) == 100
    (part,) = {p for p, n in kafka.end_offsets(kafka_bootstrap, log).items() if n}
    wait_for(lambda: committed_lowmarks(kafka_bootstrap, group, [(log, part)]).get((log, part))
             == 100, 30, "the low watermark committed past the delivered records")
    # The mark moved after the delivery, so no trim may cut below it before KEEP_MS.
    kept_until = delivered + KEEP_MS / 1000
    checks = 0
    while time.monotonic() < kept_until:
        start = _starts(kafka_bootstrap, log)[part]
        if time.monotonic() < kept_until:
            assert start == 0, f"deleted {time.monotonic() - delivered:.1f} s after delivery"
            checks += 1
        time.sleep(0.2)
    assert checks >= 5
    wait_for(lambda: _starts(kafka_bootstrap, log)[part] == 100, 30,
             "the delivered records deleted once kept")
    print(f"\ndeleted {time.monotonic() - delivered:.1f} s after delivery (keep {KEEP_MS} ms)")


def test_a_restarted_trim_goes_on_from_the_rounds_it_kept(stack, unique: str) -> None:
    """The rounds' marks live in Redis: a tracker started again cuts where the one before
    would have, instead of holding the trim back a whole keep; a Redis that lost them
    holds it back (nothing is cut that may still be needed)."""
    r = redis_adapter.connect(redis_db_url(stack, DB))
    tp, group = ("dwell.delayed", 0), f"dwell-trk-{unique}"

    def trimmer() -> Trimmer:
        return Trimmer("127.0.0.1:1", group, delayed_topic="dwell.delayed",
                       refiled_topic="dwell.delayed.refiled", interval_s=1,
                       keep_delivered_s=10, redis=r)

    first = trimmer()
    assert first.kept_lows({tp: 5}, 1000.0) == {}
    assert first.kept_lows({tp: 8}, 1006.0) == {}
    again = trimmer()
    assert again.kept_lows({tp: 9}, 1012.0) == {tp: 5}
    assert again.kept_lows({tp: 9}, 1016.0) == {tp: 8}
    # Only what a later cut can use is kept: the round of 1006 and those after it.
    assert [s for _, s in r.zrange(keys.trim_rounds(group), 0, -1, withscores=True)] == [
        1006000, 1012000, 1016000]
    r.delete(keys.trim_rounds(group))
    assert trimmer().kept_lows({tp: 9}, 1020.0) == {}
    # A member no round wrote (not JSON, no lows, an offset that is no number) is passed
    # over; the good round beside it still counts.
    r.zadd(keys.trim_rounds(group), {b"not json": 1020000, b'{"lows": 5}': 1020001,
                                     b'{"at": 1, "lows": {"dwell.delayed:0": "x"}}': 1020002})
    assert trimmer().kept_lows({tp: 9}, 1031.0) == {tp: 9}


def test_a_trim_round_without_redis_cuts_nothing(unique: str) -> None:
    """Redis gone mid-way: the round fails before any DeleteRecords (the run loop logs it
    and tries again next interval); nothing is cut on marks it could not keep."""
    dead = redis_adapter.connect(f"redis://127.0.0.1:{free_port()}/0")
    t = Trimmer("127.0.0.1:1", f"dwell-trk-{unique}", delayed_topic="dwell.delayed",
                refiled_topic="dwell.delayed.refiled", interval_s=1, keep_delivered_s=10,
                redis=dead)
    with pytest.raises(redislib.ConnectionError):
        t.kept_lows({("dwell.delayed", 0): 5}, 1000.0)


def test_a_cancel_mark_is_kept_while_its_bucket_may_be_pending(unique: str) -> None:
    """A cancel mark names the original's position, which may lie below the low
    watermark while a re-filed copy of the message is pending: the trim keeps it while
    its bucket is newer than CANCEL_KEEP_MS, like the sweep keeps its cancellation."""
    from dwell.index.marks import cancel_mark_record
    from dwell.index.topic import CANCEL_KEEP_MS
    t = Trimmer("127.0.0.1:1", f"dwell-trk-{unique}", delayed_topic="dwell.delayed",
                refiled_topic="dwell.delayed.refiled", interval_s=1)
    lows = {("dwell.delayed", 0): 100, ("dwell.delayed.refiled", 0): 100}
    now = int(time.time() * 1000)
    pending = cancel_mark_record("dwell.delayed", "persistent://t/ns/x", now, 0, 5)[1]
    gone = cancel_mark_record("dwell.delayed", "persistent://t/ns/x",
                              now - CANCEL_KEEP_MS - 60_000, 0, 5)[1]
    plain = mark_record("dwell.delayed", "persistent://t/ns/x", now, {0: BitMap64([5])})[1]
    assert (t.needed(pending, lows), t.needed(gone, lows), t.needed(plain, lows)) == (
        True, False, False)
