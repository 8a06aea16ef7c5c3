"""Losing Redis: the policy store is rebuilt from `dwell.policies`, the record of every
change (Kafka is the system of record; docs/internals.md, "Losing Redis").

Before any admin call, and every `store_check_interval_ms`, the guard reads two things
from Redis in one round trip: the store's epoch key, written once the store holds what
the feed holds, and the version counter. No epoch (FLUSHALL, a restart without its data)
or a counter below the highest version this service has seen on the feed (a restart that
lost its last writes, a replica that missed them) means the store is behind: the guard
replays the feed into it, scope by scope, keeping whatever Redis holds at the same or a
later version (`restore-3.lua`), raises the counter past the feed's and writes a new
epoch, unless Redis lost data again while the rebuild ran (its token is gone from
`dwell:policy:rebuilds`, `complete-2.lua`): then it starts over. Calls wait for that (at
most `store_rebuild_timeout_ms`, then 503 with Retry-After), so none is answered from a
store that is behind. The rebuild publishes nothing: the feed already carries all of it.

The check before a call cannot stop Redis from losing data between the check and the
call's write. So each write script makes the same two checks itself, atomically with the
write (`storeBehind` in the scripts' includes), and refuses with STORE_BEHIND before it
takes a version: a write never lands in an emptied or rolled-back store, where it would
get a version lower than the feed's (and the next rebuild would drop it) or a wrong 404
from a parent that is missing only because Redis lost it. `StoreGuard.write` turns that
refusal into a rebuild and one more try, else a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dwell.adapters import kafka
from dwell.core import topics
from dwell.http import ApiError
from dwell.policy.feed import PolicyFeed, record_version
from dwell.policy.metrics import REBUILD_SECONDS, REBUILDS
from dwell.policy.store import PolicyStore, StoreBehind, scope_key, unreadable

log = logging.getLogger("dwell.policy.rebuild")

T = TypeVar("T")

class StoreGuard:
    def __init__(self, store: PolicyStore, feed: PolicyFeed, bootstrap: str, *,
                 timeout_ms: int) -> None:
        self._store = store
        self._feed = feed
        self._bootstrap = bootstrap
        self._timeout_s = timeout_ms / 1000
        self._lock = asyncio.Lock()
        self.rebuilding = False

    async def _behind(self) -> str | None:
        """Why the store is behind the feed, or None when it is not."""
        has_epoch, version = await self._store.health()
        if not has_epoch:
            return "lost"
        if version < self._feed.highest_version:
            return "stale"
        return None

    async def ensure(self) -> None:
        """Return once the store holds what the feed holds; ApiError 503 when that could
        not be had in time (Kafka or Redis unreachable)."""
        if await self._behind() is None:
            return
        try:
            await asyncio.wait_for(self.rebuild(), self._timeout_s)
        except (TimeoutError, kafka.KafkaUnavailable) as exc:
            raise ApiError(503, "the policy store is being rebuilt from dwell.policies "
                                f"(Redis lost its data): {exc or 'not done in time'}",
                           {"Retry-After": "1"}) from exc

    async def write(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run a store write; when its script found the store behind the feed, rebuild the
        store and run it once more. ApiError 503 when the store is behind again."""
        try:
            return await op()
        except StoreBehind:
            log.warning("a write found the policy store behind %s: rebuilding it first",
                        topics.POLICIES)
        await self.ensure()
        try:
            return await op()
        except StoreBehind as exc:
            raise ApiError(503, "the policy store lost data again while being rebuilt from "
                                f"{topics.POLICIES}; nothing was changed: {exc}",
                           {"Retry-After": "1"}) from exc

    async def rebuild(self) -> None:
        async with self._lock:
            reason = await self._behind()  # another call may have rebuilt it meanwhile
            if reason is None:
                return
            self.rebuilding = True
            started = time.monotonic()
            try:
                restored = 0
                while True:  # bounded by the caller's timeout (ensure)
                    complete, count = await self._replay()
                    restored += count
                    # Behind no more: another replica's rebuild, begun after the loss, ended.
                    if complete or await self._behind() is None:
                        break
                    log.warning("Redis lost data while the policy store was being rebuilt "
                                "from %s: rebuilding again", topics.POLICIES)
            finally:
                self.rebuilding = False
            took = time.monotonic() - started
            REBUILDS.labels(reason).inc()
            REBUILD_SECONDS.observe(took)
            log.warning("policy store %s: rebuilt from %s in %.2fs (%d scopes put back)",
                        "lost" if reason == "lost" else "behind the feed", topics.POLICIES,
                        took, restored)

    async def _replay(self) -> tuple[bool, int]:
        """Put the feed back into the store; (whether the store is marked complete, how
        many scopes were put back). Not complete when Redis lost data meanwhile."""
        token = uuid.uuid4().hex
        # Before the feed is read: a loss after this point takes the token with it.
        await self._store.begin_rebuild(token, int(2 * self._timeout_s * 1000))
        records = await asyncio.to_thread(kafka.read_all, self._bootstrap, topics.POLICIES,
                                          self._timeout_s)
        latest: dict[str, tuple[int, bytes | None]] = {}
        read_at: dict[str, kafka.Record] = {}
        refused: list[tuple[kafka.Record, str]] = []
        for r in records:
            version = record_version(r)
            if r.key is None or version is None:
                continue
            try:
                scope = r.key.decode()
            except UnicodeDecodeError:
                refused.append((r, "the key is not UTF-8"))
                continue
            if version >= latest.get(scope, (-1, None))[0]:
                latest[scope] = (version, r.value)
                read_at[scope] = r
        # Kafka is a trust boundary: a record the store could not read back is left out
        # rather than put back, where every call reading it would fail. The feed audit
        # (policy.audit) sets such records aside on dwell.invalid, once: not each rebuild.
        for scope, (version, value) in list(latest.items()):
            try:
                scope_key(scope)
            except ValueError:
                continue  # not a policy scope: skipped below, as before
            reason = unreadable(scope, version, value, self._store.max_record_bytes)
            if reason is not None:
                del latest[scope]
                refused.append((read_at[scope], reason))
        for r, reason in refused:
            log.warning("%s record %r at %d:%d left out of the store: %s", topics.POLICIES,
                        r.key, r.partition, r.offset, reason)
        restored = 0
        for scope, (version, value) in latest.items():
            try:
                restored += await self._store.restore(scope, version, value)
            except ValueError:
                log.warning("skipped %s record with key %r: not a policy scope",
                            topics.POLICIES, scope)
        await self._store.floor_version(max((v for v, _ in latest.values()), default=0))
        self._feed.note_published({s: v for s, (v, _) in latest.items()})
        return await self._store.mark_complete(token), restored

    async def run(self, interval_s: float) -> None:
        """Check on an interval, so that a lost store is rebuilt before the next call."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.ensure()
            except Exception as exc:  # Redis or Kafka down: the next round tries again
                log.warning("policy store check failed, retrying in %.1fs: %s",
                            interval_s, exc)
