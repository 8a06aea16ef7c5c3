"""The tracker's bookkeeping lease (dwell.tracker.lease) on real Redis: only its holder
exports the index figures and trims; and two tracker processes sharing one Redis and one
delay log: one of them exports the index figures at a time, and when it is killed with
SIGKILL the other takes over within the lease's length."""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters.redis import connect
from dwell.index.topic import TopicIndex
from dwell.tracker import metrics
from dwell.tracker.index_view import IndexView
from dwell.tracker.lease import Lease
from dwell.tracker.stats import StatsRefresher
from dwell.tracker.trim import Trimmer
from dwell_dev.procs import Child
from dwell_dev.testkit import OwnRedis, free_port, redis_db_url

pytestmark = pytest.mark.integration

DB = 7
TICK = 1000


@pytest.fixture()
def r(stack):  # type: ignore[no-untyped-def]
    client = connect(redis_db_url(stack, DB))
    client.flushdb()
    return client


def test_one_replica_holds_it_until_it_gives_it_up_or_it_runs_out(r) -> None:  # type: ignore[no-untyped-def]
    a, b = Lease(r, 60_000, holder="a"), Lease(r, 60_000, holder="b")
    assert (a.renew(), b.renew()) == (True, False)
    assert (a.held(), b.held()) == (True, False)
    assert a.renew() and r.pttl(keys.TRACKER_LEASE) > 59_000  # extended
    a.stop()
    assert not a.held() and r.get(keys.TRACKER_LEASE) is None
    assert b.renew() and not a.renew()

    # Not renewed: the holder stops counting itself one before Redis lets another in.
    c, d = Lease(r, 300, key="lease:short", holder="c"), Lease(r, 300, key="lease:short",
                                                                holder="d")
    assert c.renew() and not d.renew()
    time.sleep(0.35)
    assert not c.held()
    assert d.renew() and not c.renew()


def test_a_lease_redis_lost_is_taken_again_and_its_old_holder_steps_down(r) -> None:  # type: ignore[no-untyped-def]
    a, b = Lease(r, 60_000, holder="a"), Lease(r, 60_000, holder="b")
    assert a.renew()
    r.flushdb()
    assert b.renew()
    assert not a.renew() and not a.held()


def test_a_holder_without_an_expiry_is_taken_over(r) -> None:  # type: ignore[no-untyped-def]
    # Set by hand or restored without its TTL: it would keep every replica out for good.
    r.set(keys.TRACKER_LEASE, "gone-for-good")
    a, b = Lease(r, 60_000, holder="a"), Lease(r, 60_000, holder="b")
    assert a.renew() and not b.renew()
    assert r.get(keys.TRACKER_LEASE) == b"a" and 59_000 < r.pttl(keys.TRACKER_LEASE) <= 60_000
    # Its own id without an expiry is its own lease: extended, with an expiry again.
    r.persist(keys.TRACKER_LEASE)
    assert a.renew() and r.pttl(keys.TRACKER_LEASE) > 59_000


def test_a_stop_leaves_another_replicas_lease_alone(r) -> None:  # type: ignore[no-untyped-def]
    a, b = Lease(r, 60_000, holder="a"), Lease(r, 300, holder="b")
    assert b.renew()
    time.sleep(0.35)
    assert a.renew()
    b._until = time.monotonic() + 60  # b still believes it holds the lease
    b.stop()
    assert r.get(keys.TRACKER_LEASE) == b"a" and a.renew()


def test_without_redis_the_hold_runs_out(stack) -> None:  # type: ignore[no-untyped-def]
    gone = connect(f"redis://127.0.0.1:{free_port()}/0")
    lease = Lease(gone, 60_000, holder="a")
    assert lease.renew() is False and not lease.held()


def test_only_the_holder_exports_the_index_figures(r) -> None:  # type: ignore[no-untyped-def]
    topic = "persistent://t/ns/leased"
    at = (int(time.time() * 1000) // TICK + 3600) * TICK
    TopicIndex(r, topic).add([(0, o, at, TICK) for o in range(5)])
    leading = [True]
    stats = StatsRefresher(IndexView(r), "c", strict=False, lookahead=0, interval_s=10,
                           leading=lambda: leading[0])
    try:
        stats.refresh()
        assert [s["delayedMessages"] for s in metrics.INDEX_STATS.snapshot] == [5]
        leading[0] = False
        TopicIndex(r, topic).add([(1, 9, at, TICK)])
        read = stats.view.buckets_read
        stats.refresh()
        assert metrics.INDEX_STATS.snapshot == []
        # Its view is kept in step all the same (for the HTTP stats): the one bucket named.
        assert stats.view.buckets_read == read + 1 and stats.view.full_reads == 1
    finally:
        metrics.INDEX_STATS.snapshot = []


def test_only_the_holder_trims_and_a_new_holder_reads_the_kept_rounds(r) -> None:  # type: ignore[no-untyped-def]
    rounds: list[bool] = []

    class Counted(Trimmer):
        def run_once(self) -> dict[tuple[str, int], int]:
            rounds.append(self.leading())
            return {}

    leading = [False]
    trim = Counted("127.0.0.1:1", "dwell-lease-trim", delayed_topic="d", refiled_topic="d.r",
                   interval_s=0.02, keep_delivered_s=60, redis=r, leading=lambda: leading[0])
    trim._seen.append((0.0, {("d", 0): 5}))  # a round it read while it led before
    trim._loaded = True
    runner = threading.Thread(target=trim.run, daemon=True)
    runner.start()
    try:
        time.sleep(0.3)
        assert rounds == []
        # What it kept from its own rounds is forgotten: the holder's are in Redis.
        assert (list(trim._seen), trim._loaded) == ([], False)
        leading[0] = True
        time.sleep(0.3)
    finally:
        trim.stop()
        runner.join(5)
    assert rounds and all(rounds)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return resp.read().decode()


def _value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _tracker_env(stack, redis_url: str, tag: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """A tracker process of its own: its Redis, delay logs and group named by ``tag``."""
    return stack.service_env() | {
        "DWELL_REDIS_URL": redis_url, "DWELL_DELAYED_TOPIC": f"test.lease.{tag}",
        "DWELL_TRACKER_GROUP_ID": f"dwell-lease-{tag}", "DWELL_TRIM_INTERVAL_MS": "0"}


def _stop(children: Iterable[Child], stack, tag: str) -> None:  # type: ignore[no-untyped-def]
    """Stop the trackers a test started and delete the delay logs named by ``tag``."""
    for child in children:
        child.stop()
    for log in (f"test.lease.{tag}", f"test.lease.{tag}.refiled"):
        kafka.delete_topic(stack.kafka_bootstrap, log)


def test_two_trackers_export_each_topic_once_and_hand_over_when_one_dies(
        stack, r, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:8]
    topic = f"persistent://t/ns/replicas-{tag}"
    at = (int(time.time() * 1000) // TICK + 3600) * TICK
    TopicIndex(r, topic).add([(0, o, at, TICK) for o in range(7)])
    env = _tracker_env(stack, redis_db_url(stack, DB), tag) | {
        "DWELL_BOOKKEEPING_LEASE_MS": "3000", "DWELL_STATS_REFRESH_S": "0.5"}
    trackers: dict[str, Child] = {}
    try:
        for i in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            trackers[url] = Child.spawn(f"tracker-{i}", [sys.executable, "-m", "dwell.tracker"],
                                        tmp_path / f"tracker-{i}.log",
                                        env | {"DWELL_HTTP_PORT": str(port)})

        def exported() -> dict[str, tuple[float | None, float | None]]:
            out = {}
            for url, child in trackers.items():
                if not child.running():
                    raise AssertionError(f"{child.name} exited:\n{child.tail()}")
                try:
                    text = _metrics(url)
                except OSError:
                    continue
                out[url] = (_value(text, "dwell_tracker_bookkeeping"),
                            _value(text, "dwell_tracker_delayed_messages"))
            return out

        def settled() -> dict[str, tuple[float | None, float | None]] | None:
            got = exported()
            if len(got) != len(trackers):
                return None
            if sorted(v[0] for v in got.values()) != [0.0] * (len(got) - 1) + [1.0]:
                return None
            if sorted((v[1] or 0) for v in got.values()) != [0.0] * (len(got) - 1) + [7.0]:
                return None
            return got

        deadline = time.monotonic() + 90
        while (got := settled()) is None:
            assert time.monotonic() < deadline, f"never settled: {exported()}"
            time.sleep(0.2)
        holder = next(url for url, v in got.items() if v[0] == 1.0)
        for _ in range(5):  # it stays so: no replica takes the lease from its holder
            time.sleep(0.5)
            assert exported()[holder][0] == 1.0

        trackers.pop(holder).kill()
        killed = time.monotonic()
        while (got := settled()) is None:
            assert time.monotonic() - killed < 3 + 10, f"no takeover: {exported()}"
            time.sleep(0.2)
        print(f"taken over {time.monotonic() - killed:.1f} s after the holder's SIGKILL")
    finally:
        _stop(trackers.values(), stack, tag)


def test_a_tracker_restarted_under_its_holder_id_takes_its_lease_back_at_once(
        stack, r, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The chart names each tracker's lease holder after its pod: a container restarted in
    its pod after a SIGKILL holds the lease again as soon as it runs, not a lease length
    (here 60 s) later."""
    tag = uuid.uuid4().hex[:8]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _tracker_env(stack, redis_db_url(stack, DB), tag) | {
        "DWELL_BOOKKEEPING_LEASE_MS": "60000", "DWELL_BOOKKEEPING_LEASE_HOLDER": f"pod-{tag}",
        "DWELL_HTTP_PORT": str(port)}

    def holding(child: Child, within_s: float) -> float:
        started = time.monotonic()
        while True:
            assert child.running(), f"{child.name} exited:\n{child.tail()}"
            try:
                if _value(_metrics(url), "dwell_tracker_bookkeeping") == 1.0:
                    return time.monotonic() - started
            except OSError:
                pass
            assert time.monotonic() - started < within_s, (
                f"{child.name} not holding the lease after {within_s} s:\n{child.tail()}")
            time.sleep(0.2)

    child = Child.spawn("tracker-first", [sys.executable, "-m", "dwell.tracker"],
                        tmp_path / "tracker-first.log", env)
    try:
        holding(child, 60)
        assert r.get(keys.TRACKER_LEASE) == f"pod-{tag}".encode()
        child.kill()
        child = Child.spawn("tracker-restarted", [sys.executable, "-m", "dwell.tracker"],
                            tmp_path / "tracker-restarted.log", env)
        took = holding(child, 30)
        assert r.pttl(keys.TRACKER_LEASE) > 50_000
        print(f"restarted tracker held its lease {took:.1f} s after it started")
    finally:
        _stop([child], stack, tag)


def test_a_redis_lost_under_two_trackers_leaves_one_holder_again(
        stack, own_redis: OwnRedis, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Redis dies under two running trackers (renewals fail, both holds run out) and comes
    back empty: the trackers keep running, and exactly one holds the lease again."""
    tag = uuid.uuid4().hex[:8]
    env = _tracker_env(stack, own_redis.url, tag) | {
        "DWELL_BOOKKEEPING_LEASE_MS": "3000", "DWELL_REDIS_CHECK_INTERVAL_MS": "200"}
    trackers: dict[str, Child] = {}

    def holders() -> list[float | None]:
        got = []
        for url, child in trackers.items():
            assert child.running(), f"{child.name} exited:\n{child.tail()}"
            try:
                got.append(_value(_metrics(url), "dwell_tracker_bookkeeping"))
            except OSError:
                got.append(None)
        return got

    def one_holder(within_s: float) -> float:
        started = time.monotonic()
        while sorted(h or 0.0 for h in holders()) != [0.0, 1.0] or None in holders():
            assert time.monotonic() - started < within_s, f"no single holder: {holders()}"
            time.sleep(0.2)
        return time.monotonic() - started

    try:
        for i in range(2):
            port = free_port()
            trackers[f"http://127.0.0.1:{port}"] = Child.spawn(
                f"tracker-{i}", [sys.executable, "-m", "dwell.tracker"],
                tmp_path / f"tracker-{i}.log", env | {"DWELL_HTTP_PORT": str(port)})
        one_holder(90)
        own_redis.kill()
        deadline = time.monotonic() + 10
        while holders() != [0.0, 0.0]:  # both holds run out within the lease's length
            assert time.monotonic() < deadline, f"a hold outlived its lease: {holders()}"
            time.sleep(0.2)
        own_redis.start()
        took = one_holder(30)
        for _ in range(5):  # and it stays one
            time.sleep(0.5)
            assert sorted(h or 0.0 for h in holders()) == [0.0, 1.0], holders()
        print(f"one holder again {took:.1f} s after Redis came back empty")
    finally:
        _stop(trackers.values(), stack, tag)
