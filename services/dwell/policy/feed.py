"""The change feed: every change of the policy store published to the compacted topic
`dwell.policies` (key = scope, value = the stored record JSON, tombstone = null value;
docs/internals.md), and the catch-up that makes the feed converge to Redis after Kafka
was down or the service crashed between its Redis write and its Kafka send.

Each publish sends the scope's *current* Redis state and then checks that the state did
not move meanwhile (else it sends again), so whatever the interleaving of writers —
requests, the catch-up, other replicas — the last record of a scope on the feed, the one
compaction keeps, carries the scope's latest version.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from dwell import headers
from dwell.adapters import kafka
from dwell.core import invalid, topics
from dwell.policy.store import MAX_VERSION, PolicyStore

log = logging.getLogger("dwell.policy.feed")

# A scope rewritten faster than Kafka acknowledges is left to the next catch-up after this.
_MAX_ROUNDS = 5


class FeedUnavailable(Exception):
    """Kafka did not acknowledge a change-feed record in time."""


def record_version(record: kafka.Record) -> int | None:
    """The version a feed record carries, or None for a record that is not the policy
    service's (the topic is shared, so foreign records are skipped, not fatal), a version
    beyond what the store counts to among them: it would put the store behind for good."""
    try:
        header = record.header(headers.VERSION)
        if header is not None:
            version = int(header)
        elif record.value is None:
            return None
        else:
            version = orjson.loads(record.value).get("version")
        return version if isinstance(version, int) and 0 <= version <= MAX_VERSION else None
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None


class PolicyFeed:
    def __init__(self, store: PolicyStore, bootstrap: str, *, replication: int = 1,
                 timeout_ms: int = 5000, compression_type: str = "none",
                 max_record_bytes: int | None = None) -> None:
        self._store = store
        self._max_record_bytes = max_record_bytes
        # scope -> version of a record too big for the feed, set aside on dwell.invalid
        self._set_aside: dict[str, int] = {}
        self._bootstrap = bootstrap
        self._replication = replication
        self._timeout_s = timeout_ms / 1000
        self._producer = kafka.Producer(bootstrap, linger_ms=0,
                                        compression_type=compression_type,
                                        **{"message.timeout.ms": timeout_ms})
        self._published: dict[str, int] = {}  # scope -> version of its last record acked
        self._loaded = False
        self._dirty = True
        self._sync_lock = asyncio.Lock()
        self.synced = False  # the startup catch-up has completed once

    async def publish(self, scope: str) -> None:
        """Put the scope's current state on the feed; FeedUnavailable when Kafka does not ack."""
        for _ in range(_MAX_ROUNDS):
            state = await self._store.scope_state(scope)
            if state is None:
                return
            version, value = state
            limit = self._max_record_bytes
            if value is not None and limit is not None and len(value) > limit:
                await self._put_aside(scope, version, len(value), limit)
                return
            await self._send(scope, version, value)
            now = await self._store.scope_state(scope)
            if now is None or now[0] == version:
                return
        self._dirty = True

    async def _send(self, scope: str, version: int, value: bytes | None) -> None:
        fut = self._producer.send(topics.POLICIES, value, key=scope,
                                  headers={headers.VERSION: str(version)})
        try:
            await asyncio.wait_for(asyncio.wrap_future(fut), self._timeout_s + 1)
        except (kafka.KafkaUnavailable, TimeoutError) as exc:
            self._dirty = True
            raise FeedUnavailable(str(exc) or "Kafka did not acknowledge in time") from exc
        self._published[scope] = version

    async def _put_aside(self, scope: str, version: int, size: int, limit: int) -> None:
        """A stored record the feed cannot carry (written before the store refused such
        records): noted on dwell.invalid, without its value, which Kafka would refuse as
        well, and left out of the catch-up, which would otherwise fail on it forever."""
        if self._set_aside.get(scope) == version:
            return
        reason = (f"version {version} is {size} bytes, more than max_policy_record_bytes "
                  f"({limit}); not published")
        log.warning("%s: %s; set aside on %s", scope, reason, topics.INVALID)
        await self.set_aside(invalid.invalid_record(topics.POLICIES, -1, -1, scope.encode(),
                                                    None, invalid.OVERSIZED, reason))
        self._set_aside[scope] = version

    async def set_aside(self, out: invalid.InvalidRecord) -> None:
        """Write a `dwell.invalid` record; FeedUnavailable when Kafka does not ack."""
        fut = self._producer.send(out[0], out[1], key=out[2], headers=dict(out[3]))
        try:
            await asyncio.wait_for(asyncio.wrap_future(fut), self._timeout_s + 1)
        except (kafka.KafkaUnavailable, TimeoutError) as exc:
            self._dirty = True
            raise FeedUnavailable(str(exc) or "Kafka did not acknowledge in time") from exc

    def carried(self, scope: str) -> int:
        """The version of the scope's last record Kafka acknowledged; -1 for none."""
        return self._published.get(scope, -1)

    @property
    def highest_version(self) -> int:
        """The highest version this service has seen on the feed (loaded or published):
        a store whose counter is lower has lost writes."""
        return max(self._published.values(), default=0)

    def note_published(self, versions: dict[str, int]) -> None:
        """What a rebuild found on the feed: those scopes need no republishing."""
        for scope, version in versions.items():
            if version >= self._published.get(scope, -1):
                self._published[scope] = version

    async def _load(self) -> None:
        """Ensure the topic and learn from it what the feed already carries."""
        parts, config = kafka.DWELL_TOPIC_DEFAULTS[topics.POLICIES]
        await asyncio.to_thread(kafka.ensure_topic, self._bootstrap, topics.POLICIES, parts,
                                self._replication, config, 10.0)
        records = await asyncio.to_thread(kafka.read_all, self._bootstrap, topics.POLICIES)
        seen: dict[str, int] = {}
        for r in records:
            version = record_version(r)
            if r.key is not None and version is not None:
                try:
                    scope = r.key.decode()
                except UnicodeDecodeError:
                    continue  # no scope of the store's: not the policy service's record
                # The last record of a scope is what compaction keeps, so it is what counts.
                seen[scope] = version
        for scope, version in seen.items():
            self._published.setdefault(scope, version)
        # A store whose counter is below the feed's lost writes: dwell.policy.rebuild sees
        # that against highest_version, puts them back and raises the counter.
        self._loaded = True
        log.info("change feed loaded: %d scopes on %s", len(seen), topics.POLICIES)

    async def sync(self) -> int:
        """Republish every scope whose latest version the feed does not carry; the count."""
        async with self._sync_lock:
            if not self._loaded:
                await self._load()
            self._dirty = False
            # Only what the store has that is newer than the feed: a store that is behind
            # (it lost writes) must never put its older state over the feed's.
            behind = [scope for scope, version in (await self._store.scopes()).items()
                      if version > self._published.get(scope, -1)
                      and version != self._set_aside.get(scope)]
            for scope in behind:
                await self.publish(scope)
            if behind:
                log.info("change feed caught up: %d scopes republished", len(behind))
            self.synced = True
            return len(behind)

    async def run(self, interval_s: float) -> None:
        """Catch up at once, then again every interval while something is behind."""
        while True:
            if self._dirty or not self.synced:
                try:
                    await self.sync()
                except Exception as exc:  # Kafka or Redis down: retried next round
                    self._dirty = True
                    log.warning("change feed catch-up failed, retrying in %.1fs: %s",
                                interval_s, exc)
            await asyncio.sleep(interval_s)

    def close(self) -> None:
        self._producer.close(timeout=2.0)
