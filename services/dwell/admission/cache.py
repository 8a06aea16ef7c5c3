"""Admission's view of the policy store, built only from the compacted `dwell.policies`
feed (docs/internals.md): known tenants and namespaces, namespace and topic policies, the
effective policy per topic, and the highest feed version applied. The publish path reads
it from memory and never touches Redis.

`PolicyCache.apply` is pure bookkeeping (unit-tested without Kafka); `PolicyFollower`
replays the feed from the beginning without a consumer group commit, marks the cache
ready once it has caught up with the end offsets seen at start, then keeps following it
in a daemon thread.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import orjson
import pydantic

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.policy import (
    BrokerDefaults,
    DelayedDeliveryPolicies,
    EffectivePolicy,
    resolve_policy,
)
from dwell.core.topics import TopicName

from .metrics import POLICY_VERSION_APPLIED

log = logging.getLogger("dwell.admission.cache")

VERSION_HEADER = "dwell-version"


class PolicyCache:
    """In-memory policies. Written by one follower thread, read by the publish path.

    Readers never lock: every write replaces `_resolved` with a fresh dict, so a reader
    that raced a write can only store its stale result in the dict just thrown away.
    """

    def __init__(self, broker: BrokerDefaults) -> None:
        self.broker = broker
        self.tenants: set[str] = set()
        self.namespaces: set[str] = set()
        self.ns_policies: dict[str, DelayedDeliveryPolicies] = {}
        self.topic_policies: dict[str, DelayedDeliveryPolicies] = {}
        self.version = 0
        self.ready = threading.Event()
        self._resolved: dict[str, EffectivePolicy] = {}

    # -- reads (publish path)

    def namespace_known(self, tenant: str, namespace: str) -> bool:
        return tenant in self.tenants and f"{tenant}/{namespace}" in self.namespaces

    def effective(self, topic: TopicName) -> EffectivePolicy:
        resolved = self._resolved
        key = str(topic)
        policy = resolved.get(key)
        if policy is None:
            policy = resolve_policy(self.broker, self.ns_policies.get(topic.namespace_name),
                                    self.topic_policies.get(key))
            resolved[key] = policy
        return policy

    # -- writes (follower)

    def apply(self, scope: str, value: bytes | None, headers: dict[str, bytes]) -> None:
        """Apply one feed record; a malformed one is logged and skipped, never fatal."""
        try:
            version = self._apply(scope, value, headers)
        except (ValueError, KeyError, TypeError, pydantic.ValidationError) as exc:
            log.warning("skipping malformed dwell.policies record %r: %s", scope, exc)
            return
        self._resolved = {}
        if version > self.version:
            self.version = version
            POLICY_VERSION_APPLIED.set(version)

    def _apply(self, scope: str, value: bytes | None, headers: dict[str, bytes]) -> int:
        kind, _, name = scope.partition(":")
        doc = orjson.loads(value) if value is not None else None
        if doc is None:
            raw = headers.get(VERSION_HEADER)
            version = int(raw) if raw else 0
        else:
            version = int(doc["version"])
        if kind == "tenant":
            self._set(self.tenants, name, doc is not None)
        elif kind == "namespace":
            self._set(self.namespaces, name, doc is not None)
        elif kind in ("ns", "topic"):
            target = self.ns_policies if kind == "ns" else self.topic_policies
            if doc is None:
                target.pop(name, None)
            else:
                target[name] = DelayedDeliveryPolicies.model_validate(doc.get("policy") or {})
        else:
            raise ValueError(f"unknown scope kind {kind!r}")
        return version

    @staticmethod
    def _set(target: set[str], name: str, present: bool) -> None:
        if present:
            target.add(name)
        else:
            target.discard(name)


class PolicyFollower:
    """Replays `dwell.policies` into a `PolicyCache`, then follows it (daemon thread)."""

    def __init__(self, cache: PolicyCache, bootstrap: str, *, replay_timeout_s: float = 60.0,
                 topic: str = names.POLICIES) -> None:
        self.cache = cache
        self.bootstrap = bootstrap
        self.topic = topic
        self.replay_timeout_s = replay_timeout_s
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="policy-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._replay_and_follow()
            except kafka.KafkaUnavailable as exc:
                # Stay on the last good state; a later replay re-applies the feed
                # idempotently (every record sets, never increments).
                self.error = str(exc)
                log.warning("policy feed: %s; retrying", exc)
                time.sleep(1.0)

    def _replay_and_follow(self) -> None:
        records = kafka.read_all(self.bootstrap, self.topic, timeout=self.replay_timeout_s)
        next_offsets = {(self.topic, p): kafka.OFFSET_BEGINNING
                        for p in kafka.partitions(self.bootstrap, self.topic)}
        for r in records:
            self.cache.apply(r.key.decode() if r.key else "", r.value, r.headers)
            next_offsets[(r.topic, r.partition)] = r.offset + 1
        self.cache.ready.set()
        self.error = None
        log.info("policy feed replayed: %d records, version %d", len(records),
                 self.cache.version)
        # A group id is required by the client; nothing is ever committed under it.
        consumer = kafka.Consumer(self.bootstrap, f"dwell-admission-policies-{uuid.uuid4().hex}",
                                  **{"fetch.wait.max.ms": 20})
        try:
            consumer.assign([(t, p, o) for (t, p), o in next_offsets.items()])
            while not self._stop.is_set():
                for r in consumer.poll(1000, 0.1):
                    self.cache.apply(r.key.decode() if r.key else "", r.value, r.headers)
        finally:
            consumer.close()
