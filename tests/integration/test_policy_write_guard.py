"""Redis losing data between the policy service's check and a call's write, or between
the write and its record on `dwell.policies` (real Redis, Kafka and the service's app, run
in-process so that the test can lose the data at that very moment): the store is rebuilt
from the feed and the change is made once more, under a version above every earlier one
on the feed. The app runs on a Redis database of its own, which the tests empty or roll
back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import orjson
import pytest
import redis
from fastapi.testclient import TestClient

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics
from dwell.core.policy import DelayedDeliveryPolicies
from dwell.policy.app import build_app
from dwell.policy.feed import PolicyFeed, record_version
from dwell.policy.rebuild import StoreGuard
from dwell.policy.settings import PolicySettings
from dwell.policy.store import PolicyStore, StoreBehind, TenantInfo
from dwell_dev.testkit import redis_db_url

pytestmark = pytest.mark.integration

DB = 14


class Losses:
    """Makes Redis lose data, `times` times once armed, at one of three moments: right
    after the guard's check returns (between a call's check and its write), right before
    the feed reads a scope to publish it (between a write and its record on the feed), or
    right after a rebuild restored the scope `after` (in the middle of a rebuild)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lose: Callable[[], object] = lambda: None
        self.at = "check"
        self.after = ""
        self.times = 0
        self.lost = 0
        check, publish, restore = StoreGuard.ensure, PolicyFeed.publish, PolicyStore.restore

        def maybe(at: str) -> None:
            if self.times and self.at == at:
                self.times -= 1
                self.lose()
                self.lost += 1

        async def ensure(guard: StoreGuard) -> None:
            await check(guard)
            maybe("check")

        async def publish_(feed: PolicyFeed, scope: str) -> None:
            maybe("publish")
            await publish(feed, scope)

        async def restore_(store: PolicyStore, scope: str, version: int,
                           value: bytes | None) -> bool:
            done = await restore(store, scope, version, value)
            if scope == self.after:
                maybe("restore")
            return done

        monkeypatch.setattr(StoreGuard, "ensure", ensure)
        monkeypatch.setattr(PolicyFeed, "publish", publish_)
        monkeypatch.setattr(PolicyStore, "restore", restore_)

    def arm(self, lose: Callable[[], object], times: int = 1, at: str = "check",
            after: str = "") -> None:
        self.lose, self.times, self.at, self.after = lose, times, at, after


def _url(stack) -> str:  # type: ignore[no-untyped-def]
    return redis_db_url(stack, DB)


@pytest.fixture()
def db(stack) -> Iterator[redis.Redis]:  # type: ignore[no-untyped-def]
    r = redis_adapter.connect(_url(stack))
    r.flushdb()
    yield r
    r.flushdb()


@pytest.fixture()
def app(stack, db: redis.Redis, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
        ) -> Iterator[tuple[TestClient, Losses]]:
    hook = Losses(monkeypatch)
    # The interval check stays out of the way: only calls check the store here.
    settings = PolicySettings(redis_url=_url(stack), kafka_bootstrap=stack.kafka_bootstrap,
                              store_check_interval_ms=600_000, feed_sync_interval_ms=600_000)
    with TestClient(build_app(settings)) as http:
        yield http, hook


def _feed(kafka_bootstrap: str, scope: str) -> tuple[list[tuple[int, bytes | None]], int]:
    """The scope's records on `dwell.policies` as (version, value), in feed order, and the
    highest version of any record there."""
    mine, highest = [], 0
    for r in kafka.read_all(kafka_bootstrap, topics.POLICIES, 30.0):
        version = record_version(r)
        if version is None:
            continue
        highest = max(highest, version)
        if r.key is not None and r.key == scope.encode():
            mine.append((version, r.value))
    return mine, highest


def _setup(http: TestClient, tenant: str) -> str:
    assert http.put(f"/admin/v2/tenants/{tenant}").status_code == 204
    assert http.put(f"/admin/v2/namespaces/{tenant}/a").status_code == 204
    path = f"/admin/v2/namespaces/{tenant}/a/delayedDelivery"
    assert http.post(path, json={"tickTime": 100}).status_code == 204
    return path


def _rebuilt_answer(http: TestClient, db: redis.Redis, path: str) -> object:
    """What the path answers from a store rebuilt from the feed alone."""
    db.flushdb()
    got = http.get(path)
    assert got.status_code == 200, got.text
    return got.json()


def test_write_after_a_flush_that_followed_the_check(app, db: redis.Redis, stack,
                                                     unique: str) -> None:
    http, hook = app
    path = _setup(http, unique)
    _, before = _feed(stack.kafka_bootstrap, f"ns:{unique}/a")
    hook.arm(db.flushdb)
    got = http.post(path, json={"tickTime": 250})
    # Not the 404 that the namespace missing from the emptied store would give.
    assert got.status_code == 204, got.text
    assert hook.lost == 1
    assert db.exists(keys.POLICY_EPOCH)
    assert http.get(path).json() == {"tickTime": 250}
    records, _ = _feed(stack.kafka_bootstrap, f"ns:{unique}/a")
    version, value = records[-1]
    assert version > before
    assert value is not None and orjson.loads(value)["policy"] == {"tickTime": 250}
    assert _rebuilt_answer(http, db, path) == {"tickTime": 250}
    assert 'dwell_policy_store_rebuilds_total{reason="lost"}' in http.get("/metrics").text


def test_write_after_a_rollback_that_followed_the_check(app, db: redis.Redis, stack,
                                                        unique: str) -> None:
    """Redis comes back without its last writes (an older AOF, a replica that missed them)
    between the check and the write: its counter is below versions the feed carries."""
    http, hook = app
    path = _setup(http, unique)
    snapshot = {k: db.dump(k) for k in db.keys("*")}
    for tick in (200, 300):
        assert http.post(path, json={"tickTime": tick}).status_code == 204
    _, before = _feed(stack.kafka_bootstrap, f"ns:{unique}/a")

    def roll_back() -> None:
        # One transaction: nothing sees the store empty in between.
        pipe = db.pipeline(transaction=True)
        pipe.flushdb()
        for k, v in snapshot.items():
            pipe.restore(k, 0, v)
        pipe.execute()

    hook.arm(roll_back)
    assert http.post(path, json={"tickTime": 250}).status_code == 204
    assert hook.lost == 1
    records, _ = _feed(stack.kafka_bootstrap, f"ns:{unique}/a")
    assert records[-1][0] > before
    assert http.get(path).json() == {"tickTime": 250}
    # The rebuild keeps the latest version per scope: the user's change, not the 300.
    assert _rebuilt_answer(http, db, path) == {"tickTime": 250}
    assert 'dwell_policy_store_rebuilds_total{reason="stale"}' in http.get("/metrics").text


def test_write_refused_twice_is_a_503(app, db: redis.Redis, unique: str) -> None:
    """Redis loses its data again after the rebuild the refused write asked for: the call
    answers 503 with Retry-After and changes nothing, rather than guess."""
    http, hook = app
    path = _setup(http, unique)
    hook.arm(db.flushdb, times=2)
    got = http.post(path, json={"tickTime": 250})
    assert got.status_code == 503, got.text
    assert got.headers["Retry-After"] == "1"
    assert "nothing was changed" in got.json()["reason"]
    assert hook.lost == 2
    assert http.get(path).json() == {"tickTime": 100}


def test_every_write_script_refuses_a_store_behind_the_feed(db: redis.Redis,
                                                            stack, unique: str) -> None:
    """The scripts' own check, store method by store method: with the epoch gone, or the
    counter below the floor, each refuses before it takes a version or writes a key."""
    ns = f"{unique}/a"
    policy = DelayedDeliveryPolicies(tickTime=5)
    floor = 0

    async def run() -> None:
        nonlocal floor
        store = PolicyStore(redis_adapter.connect_async(_url(stack)), floor=lambda: floor)
        writes = [lambda: store.create_tenant(unique, TenantInfo()),
                  lambda: store.update_tenant(unique, TenantInfo()),
                  lambda: store.create_namespace(ns),
                  lambda: store.set_namespace_policy(ns, policy),
                  lambda: store.remove_namespace_policy(ns),
                  lambda: store.delete_namespace(ns),
                  lambda: store.delete_tenant(unique)]
        try:
            # No epoch: a store that lost everything, even the first write refuses.
            for write in writes:
                with pytest.raises(StoreBehind):
                    await write()
            assert db.dbsize() == 0
            await store.begin_rebuild("e1", 10_000)
            assert await store.mark_complete("e1")
            await store.create_tenant(unique, TenantInfo())
            await store.create_namespace(ns)
            await store.set_namespace_policy(ns, policy)
            counter = await store.version()
            floor = counter + 1  # the feed carries a version the store never saw
            state = {k: db.dump(k) for k in db.keys("*")}
            for write in writes:
                with pytest.raises(StoreBehind):
                    await write()
            assert {k: db.dump(k) for k in db.keys("*")} == state
            floor = counter
            assert await store.delete_namespace(ns) == [
                (f"ns:{ns}", counter + 1), (f"namespace:{ns}", counter + 2)]
        finally:
            await store.redis.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("times", [1, 2])
def test_change_lost_before_it_reached_the_feed(app, db: redis.Redis, stack, unique: str,
                                                times: int) -> None:
    """Redis loses the write after it was made, before the feed published it: the feed
    would carry nothing of it (or an older state), so the call must not answer 204 for
    it. Once, the change is made again on the rebuilt store; twice, a 503."""
    http, hook = app
    path = _setup(http, unique)
    _, before = _feed(stack.kafka_bootstrap, f"ns:{unique}/a")
    hook.arm(db.flushdb, times=times, at="publish")
    got = http.post(path, json={"tickTime": 250})
    records, _ = _feed(stack.kafka_bootstrap, f"ns:{unique}/a")
    if times == 2:
        assert got.status_code == 503, got.text
        assert got.headers["Retry-After"] == "1"
        assert hook.lost == 2
        assert records[-1][0] <= before
        assert _rebuilt_answer(http, db, path) == {"tickTime": 100}
        return
    assert got.status_code == 204, got.text
    assert hook.lost == 1
    version, value = records[-1]
    assert version > before
    assert value is not None and orjson.loads(value)["policy"] == {"tickTime": 250}
    assert _rebuilt_answer(http, db, path) == {"tickTime": 250}


def test_store_lost_again_during_its_rebuild(app, db: redis.Redis, unique: str) -> None:
    """Redis loses its data in the middle of a rebuild, after the tenant was put back: the
    rebuild must not mark the store complete (the epoch would hide the loss from every
    check), but start over."""
    http, hook = app
    path = _setup(http, unique)
    db.flushdb()
    hook.arm(db.flushdb, at="restore", after=f"tenant:{unique}")
    got = http.get(f"/admin/v2/tenants/{unique}")
    assert hook.lost == 1
    assert got.status_code == 200, got.text
    assert http.get(f"/admin/v2/namespaces/{unique}").json() == [f"{unique}/a"]
    assert http.get(path).json() == {"tickTime": 100}
    assert db.exists(keys.POLICY_EPOCH)
    assert not db.exists(keys.POLICY_REBUILDS)
