"""The subscription registry with Kafka as its record (docs/internals.md, "Losing Redis").

A registration is written to the compacted `dwell.subscriptions` (key
`<topic> <subscription>`, value the settings JSON, a tombstone when deleted) and answered
only once Kafka has it; then it goes to Redis (`dwell:subs:{topic}`, read by the backoff
job and the HTTP API). Redis's marker `dwell:trk:subs:applied` is the offset of the log
below which Redis holds every record. Only a rebuild creates it (a write moves it only if it
exists), so after a FLUSHALL or a restart without data it is gone even if a write came in
between; a marker below what this process wrote means Redis rolled back (a restart that
lost its last second, a replica that missed writes). Before every call, and on an interval,
the guard reads the marker; when Redis is behind it replays the log into Redis (the latest
record per key wins, tombstones delete) and sets the marker to the log's end.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import redis as redislib

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics
from dwell.core.policy import SUBSCRIPTIONS_OVER_MAX
from dwell.core.subscriptions import SubscriptionSettings
from dwell.http import ApiError
from dwell.index import subscriptions
from dwell.tracker import LUA_DIR
from dwell.tracker.metrics import REGISTRY_REBUILD_SECONDS, REGISTRY_REBUILDS

log = logging.getLogger("dwell.tracker.registry")

def record_key(topic: str, sub: str) -> bytes:
    """The `dwell.subscriptions` key: a Pulsar topic holds no space."""
    return f"{topic} {sub}".encode()


def parse_key(key: bytes) -> tuple[str, str]:
    topic, sep, sub = key.decode().partition(" ")
    if not sep or not topic or not sub:
        raise ValueError(f"not a subscription key: {key!r}")
    return topic, sub


class SubscriptionRegistry:
    """The tracker's subscription registry: Kafka first, then Redis, and Redis rebuilt from
    Kafka when it lost what Kafka holds. Blocking calls (the HTTP routes run them on a
    worker thread)."""

    def __init__(self, r: redislib.Redis, bootstrap: str, *, timeout_s: float = 10.0,
                 compression_type: str = "none") -> None:
        self._r = r
        self._bootstrap = bootstrap
        self._timeout_s = timeout_s
        self._compression = compression_type
        self._scripts = redis_adapter.Scripts(r, LUA_DIR)
        self._producer: kafka.Producer | None = None
        self._lock = threading.Lock()
        # The log offset after the last record this process wrote to Redis: a marker below
        # it shows Redis rolled back.
        self._written = 0
        self.rebuilding = False
        self.error: str | None = None

    def _send(self, key: bytes, value: bytes | None) -> int:
        """Write one record with acks=all; the offset after it. 503 when Kafka does not
        take it in time: nothing is answered that Kafka does not hold."""
        with self._lock:
            if self._producer is None:
                self._producer = kafka.Producer(self._bootstrap, linger_ms=0,
                                                compression_type=self._compression)
            producer = self._producer
        try:
            _, offset = producer.send(topics.SUBSCRIPTIONS, value, key=key).result(
                self._timeout_s)
        except (TimeoutError, kafka.KafkaUnavailable) as exc:
            raise ApiError(503, f"{topics.SUBSCRIPTIONS} did not take the change: "
                                f"{exc or 'not acknowledged in time'}",
                           {"Retry-After": "1"}) from exc
        return offset + 1

    def _applied(self, pipe: redislib.client.Pipeline, after: int) -> None:
        # XX: a write never creates the marker, so a Redis that lost it still shows the loss.
        pipe.set(keys.SUBSCRIPTIONS_APPLIED, after, xx=True)
        self._written = max(self._written, after)

    def put(self, topic: str, sub: str, settings: SubscriptionSettings,
            max_subscriptions: int = 0) -> None:
        """Register (or update) `sub`; a new one beyond `max_subscriptions` on the topic
        (0: no limit) is refused with Pulsar's 412, since each costs Kafka a RETRY and a DLQ
        topic."""
        self.ensure()
        reserved = keys.sub_reservations(topic)
        # The count and the place are taken in one step (reserve-2.lua): two registrations
        # at max - 1 cannot both pass. A place outlives a registration that died mid-way
        # by at most the Kafka write's timeout.
        if max_subscriptions > 0 and not self._scripts.run(
                "reserve", [keys.subscriptions(topic), reserved],
                [sub, max_subscriptions, int(time.time() * 1000),
                 int(self._timeout_s * 1000) + 1000]):
            raise ApiError(412, SUBSCRIPTIONS_OVER_MAX.format(topic=topic))
        value = json.dumps(settings.to_json(), sort_keys=True).encode()
        try:
            after = self._send(record_key(topic, sub), value)
        except BaseException:
            self._r.zrem(reserved, sub)
            raise
        pipe = self._r.pipeline(transaction=True)
        subscriptions.put(pipe, topic, sub, settings)
        pipe.zrem(reserved, sub)
        self._applied(pipe, after)
        pipe.execute()

    def get(self, topic: str, sub: str) -> SubscriptionSettings | None:
        self.ensure()
        return subscriptions.get(self._r, topic, sub)

    def names(self, topic: str) -> list[str]:
        self.ensure()
        return subscriptions.names(self._r, topic)

    def delete(self, topic: str, sub: str) -> bool:
        """Remove the subscription (a tombstone, then Redis) and its redelivery index;
        False when it was not registered."""
        self.ensure()
        if subscriptions.get(self._r, topic, sub) is None:
            return False
        after = self._send(record_key(topic, sub), None)
        subscriptions.delete(self._r, topic, sub)
        pipe = self._r.pipeline(transaction=True)
        self._applied(pipe, after)
        pipe.execute()
        return True

    def _behind(self) -> str | None:
        raw = self._r.get(keys.SUBSCRIPTIONS_APPLIED)
        if raw is None:
            return "lost"
        if int(raw) < self._written:
            return "stale"
        return None

    def ensure(self) -> None:
        """Return once Redis holds what `dwell.subscriptions` holds; ApiError 503 when that
        could not be had (Kafka or Redis unreachable during the rebuild)."""
        if self._behind() is None:
            return
        try:
            self.rebuild()
        except Exception as exc:  # Kafka or Redis unreachable mid-rebuild: the call may retry
            log.warning("subscription registry rebuild failed: %s", exc)
            raise ApiError(503, "the subscription registry is being rebuilt from "
                                f"{topics.SUBSCRIPTIONS} (Redis lost it): {exc}",
                           {"Retry-After": "1"}) from exc

    def rebuild(self) -> int:
        """Replay the log into Redis if Redis is behind it; the registrations put back."""
        with self._lock:
            reason = self._behind()  # another call may have rebuilt it meanwhile
            if reason is None:
                return 0
            self.rebuilding = True
            started = time.monotonic()
            try:
                restored, end = self._replay()
            finally:
                self.rebuilding = False
            took = time.monotonic() - started
            REGISTRY_REBUILDS.labels(reason).inc()
            REGISTRY_REBUILD_SECONDS.observe(took)
            log.warning("subscription registry %s: rebuilt from %s (up to offset %d) in "
                        "%.2fs, %d subscriptions", reason, topics.SUBSCRIPTIONS, end, took,
                        restored)
            return restored

    def _replay(self) -> tuple[int, int]:
        # The end first: every record below it is in what read_all returns.
        end = kafka.end_offsets(self._bootstrap, topics.SUBSCRIPTIONS, self._timeout_s).get(0, 0)
        latest: dict[bytes, bytes | None] = {}
        for rec in kafka.read_all(self._bootstrap, topics.SUBSCRIPTIONS, self._timeout_s):
            if rec.key is not None:
                latest[rec.key] = rec.value
            end = max(end, rec.offset + 1)
        pipe = self._r.pipeline(transaction=False)
        restored = 0
        for key, value in latest.items():
            try:
                topic, sub = parse_key(key)
                if value is None:
                    pipe.hdel(keys.subscriptions(topic), sub)
                    continue
                settings = SubscriptionSettings.from_json(json.loads(value))
            except ValueError as exc:
                log.warning("skipped a %s record with key %r: %s", topics.SUBSCRIPTIONS,
                            key, exc)
                continue
            subscriptions.put(pipe, topic, sub, settings)
            restored += 1
        pipe.set(keys.SUBSCRIPTIONS_APPLIED, end)
        pipe.execute()
        return restored, end

    def run(self, interval_s: float, stop: threading.Event) -> None:
        """Check on an interval, so that the backoff job, which reads Redis, finds the
        registry back without waiting for an HTTP call."""
        while not stop.wait(interval_s):
            try:
                self.ensure()
                self.error = None
            except Exception as exc:  # Redis or Kafka down: the next round tries again
                self.error = str(exc)
                log.warning("subscription registry check failed, retrying in %.1fs: %s",
                            interval_s, exc)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
