"""A view of the policy store built only from the compacted `dwell.policies` feed
(docs/internals.md): known tenants and namespaces, namespace and topic policies, the
effective policy per topic, and the highest feed version applied. Admission's publish
path reads it from memory and never touches Redis; the tracker's authorization reads
tenants' and namespaces' grants from it.

`PolicyCache.apply` is pure bookkeeping (unit-tested without Kafka); `PolicyFollower`
replays the feed from the beginning without a consumer group commit, marks the cache
ready once it has caught up with the end offsets seen at start, then keeps following it
in a daemon thread.

Read your writes: the policy service answers a change only once Kafka has it (acks=all),
so a publish that misses (an unknown namespace) asks `PolicyFollower.catch_up` before
it is answered 404: the feed's end offsets are read from the broker, and the answer
waits until the follower has applied the feed up to them (bounded by
`policy_catch_up_timeout_ms`). Misses that come while one catch-up is under way share
the next one: its end offsets are read after they came, so they cover every change
acknowledged before them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

import orjson
import pydantic
from prometheus_client import Counter

from dwell.adapters import kafka
from dwell.core import invalid
from dwell.core import topics as names
from dwell.core.authz import NO_GRANTS, Grants, namespace_auth
from dwell.core.policy import (
    NAMESPACE_LIMIT_FIELDS,
    BrokerDefaults,
    DelayedDeliveryPolicies,
    EffectivePolicy,
    resolve_policy,
)
from dwell.core.topics import TopicName
from dwell.headers import VERSION

log = logging.getLogger("dwell.policy_view")

SKIPPED = Counter("dwell_policy_records_skipped_total",
                  "dwell.policies records this process could not apply and skipped (the "
                  "policy service sets them aside on dwell.invalid)")


class PolicyCache:
    """In-memory policies. Written by one follower thread, read by the publish path.

    Readers never lock: every write replaces `_resolved` with a fresh dict, so a reader
    that raced a write can only store its stale result in the dict just thrown away.
    """

    def __init__(self, broker: BrokerDefaults,
                 on_version: Callable[[int], None] | None = None) -> None:
        self.broker = broker
        self._on_version = on_version  # told each new highest version (a gauge's set)
        self.tenants: set[str] = set()
        self.namespaces: set[str] = set()
        self.ns_policies: dict[str, DelayedDeliveryPolicies] = {}
        self.topic_policies: dict[str, DelayedDeliveryPolicies] = {}
        # Topics whose record marks them as partitioned topics of one partition.
        self.partitioned_one: set[str] = set()
        self.version = 0
        self.ready = threading.Event()
        self._resolved: dict[str, EffectivePolicy] = {}
        # Authorization (dwell.auth): tenants' adminRoles, namespaces' permissions.
        self.admin_roles: dict[str, list[str]] = {}
        self.namespace_auth: dict[str, dict[str, list[str]]] = {}
        # Namespaces' quotas (maxTopicsPerNamespace, maxSubscriptionsPerTopic), by field.
        self.namespace_limits: dict[str, dict[str, int]] = {}
        self._grants: dict[tuple[str, str | None], Grants] = {}

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

    def grants(self, tenant: str, namespace: str | None) -> Grants:
        """The tenant's admin roles and the namespace's permissions (empty when unknown)."""
        memo = self._grants
        key = (tenant, namespace)
        found = memo.get(key)
        if found is None:
            admins = self.admin_roles.get(tenant)
            perms = self.namespace_auth.get(f"{tenant}/{namespace}") if namespace else None
            found = (Grants.of(admins or (), perms) if admins or perms else NO_GRANTS)
            if len(memo) > 100_000:  # keys come from requests: bounded
                memo.clear()
            memo[key] = found
        return found

    def namespace_limit(self, ns: str, field: str) -> int | None:
        """The namespace's own quota `field` (dwell.core.policy), None when it set none."""
        return self.namespace_limits.get(ns, {}).get(field)

    # -- writes (follower)

    def apply(self, scope: str, value: bytes | None,
              headers: dict[str, bytes]) -> tuple[str, str] | None:
        """Apply one feed record. A malformed one is skipped and counted, never fatal: the
        feed is written by whoever may produce to it, so a record may have any shape.
        (its dwell.invalid kind, the reason) when it was skipped, else None; the policy
        service's audit sets such records aside (dwell.policy.audit)."""
        try:
            version = self._apply(scope, value, headers)
        except orjson.JSONDecodeError as exc:
            return self._skipped(scope, invalid.NOT_JSON, f"the value is not JSON: {exc}")
        except (ValueError, KeyError, TypeError, AttributeError,
                pydantic.ValidationError) as exc:
            reason = (f"missing field {exc}" if isinstance(exc, KeyError)
                      else str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return self._skipped(scope, invalid.FIELD, reason)
        self._resolved = {}
        self._grants = {}
        if version > self.version:
            self.version = version
            if self._on_version is not None:
                self._on_version(version)
        return None

    @staticmethod
    def _skipped(scope: str, kind: str, reason: str) -> tuple[str, str]:
        SKIPPED.inc()
        log.debug("skipping malformed %s record %r: %s", names.POLICIES, scope[:200], reason)
        return kind, reason[:invalid.MAX_REASON_CHARS]

    def _apply(self, scope: str, value: bytes | None, headers: dict[str, bytes]) -> int:
        kind, _, name = scope.partition(":")
        doc = orjson.loads(value) if value is not None else None
        if doc is None:
            raw = headers.get(VERSION)
            version = int(raw) if raw else 0
        else:
            version = int(doc["version"])
        if kind == "tenant":
            self._set(self.tenants, name, doc is not None)
            if doc is None:
                self.admin_roles.pop(name, None)
            else:
                self.admin_roles[name] = _admin_roles(doc["tenant"].get("adminRoles"))
        elif kind == "namespace":
            self._set(self.namespaces, name, doc is not None)
            limits = {f: v for f in NAMESPACE_LIMIT_FIELDS
                      if isinstance(v := (doc or {}).get(f), int) and not isinstance(v, bool)}
            if limits:
                self.namespace_limits[name] = limits
            else:
                self.namespace_limits.pop(name, None)
            perms = namespace_auth(doc)
            if perms:
                self.namespace_auth[name] = perms
            else:
                self.namespace_auth.pop(name, None)
        elif kind in ("ns", "topic"):
            target = self.ns_policies if kind == "ns" else self.topic_policies
            if doc is None:
                target.pop(name, None)
            else:
                target[name] = DelayedDeliveryPolicies.model_validate(doc.get("policy") or {})
            if kind == "topic":
                self._set(self.partitioned_one, name, doc is not None and
                          doc.get("partitioned") is True)
        else:
            raise ValueError(f"unknown scope kind {kind!r}")
        return version

    @staticmethod
    def _set(target: set[str], name: str, present: bool) -> None:
        if present:
            target.add(name)
        else:
            target.discard(name)


# The policy service's bound on a tenant's adminRoles (dwell.policy.store), which a record
# it did not write may pass.
MAX_ADMIN_ROLES = 1000


def _admin_roles(roles: object) -> list[str]:
    """A tenant record's adminRoles; ValueError unless a list of at most MAX_ADMIN_ROLES
    strings (a string is not read as its characters, each a role)."""
    if roles is None:
        return []
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise ValueError("tenant.adminRoles: must be a list of strings")
    if len(roles) > MAX_ADMIN_ROLES:
        raise ValueError(f"tenant.adminRoles: {len(roles)} roles; the limit is "
                         f"{MAX_ADMIN_ROLES}")
    return list(roles)


class PolicyFollower:
    """Replays `dwell.policies` into a `PolicyCache`, then follows it (daemon thread);
    `catch_up` waits for it to apply what the feed holds now (a second daemon thread
    serves those waits, so that the follower never stops to answer them)."""

    def __init__(self, cache: PolicyCache, bootstrap: str, *, replay_timeout_s: float = 60.0,
                 catch_up_timeout_s: float = 2.0, topic: str = names.POLICIES) -> None:
        self.cache = cache
        self.bootstrap = bootstrap
        self.topic = topic
        self.replay_timeout_s = replay_timeout_s
        self.catch_up_timeout_s = catch_up_timeout_s
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="policy-follower", daemon=True)
        # partition -> next offset of the feed whose records the cache has applied
        self._applied: dict[int, int] = {}
        self._progress = threading.Condition()
        self._waiters: list[Future[bool]] = []  # misses waiting for the next catch-up
        self._catcher = threading.Thread(target=self._serve_catch_ups,
                                         name="policy-catch-up", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._catcher.start()

    def stop(self) -> None:
        self._stop.set()
        with self._progress:
            self._progress.notify_all()
        self._thread.join(timeout=5)
        self._catcher.join(timeout=5)

    def catch_up(self) -> Future[bool]:
        """A future of whether the cache has applied every record on the feed as of this
        call (False when that could not be learned or done in `catch_up_timeout_s`)."""
        fut: Future[bool] = Future()
        with self._progress:
            self._waiters.append(fut)
            self._progress.notify_all()
        return fut

    def _serve_catch_ups(self) -> None:
        reader: kafka.Consumer | None = None
        try:
            while not self._stop.is_set():
                with self._progress:
                    while not self._waiters and not self._stop.is_set():
                        self._progress.wait(1.0)
                    batch, self._waiters = self._waiters, []
                if not batch:
                    continue
                deadline = time.monotonic() + self.catch_up_timeout_s
                done = False
                try:
                    if reader is None:
                        # A group id is required by the client; nothing is committed.
                        reader = kafka.Consumer(self.bootstrap, "dwell-admission-catch-up")
                    done = self._wait_applied(reader, deadline)
                except kafka.KafkaUnavailable as exc:
                    log.warning("policy catch-up: %s", exc)
                except Exception:  # this thread must live on: the waiters get False
                    log.exception("policy catch-up failed")
                    if reader is not None:
                        reader.close()
                    reader = None
                for fut in batch:
                    fut.set_result(done)
        finally:
            for fut in self._waiters:
                fut.set_result(False)
            if reader is not None:
                reader.close()

    def _wait_applied(self, reader: kafka.Consumer, deadline: float) -> bool:
        with self._progress:
            parts = list(self._applied)
        if not parts:
            return False  # not replayed yet: the cache is not ready either
        ends = reader.end_offsets(self.topic, parts, max(0.1, deadline - time.monotonic()))
        with self._progress:
            while any(self._applied.get(p, 0) < end for p, end in ends.items()):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._progress.wait(left)
        return True

    def _advance(self, positions: dict[int, int]) -> None:
        with self._progress:
            for p, offset in positions.items():
                if offset > self._applied.get(p, -1):
                    self._applied[p] = offset
            self._progress.notify_all()

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
            self.cache.apply(scope_of(r.key), r.value, r.headers)
            next_offsets[(r.topic, r.partition)] = r.offset + 1
        self._advance({p: max(o, 0) for (_, p), o in next_offsets.items()})
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
                # A batch poll waits out its whole timeout unless the batch fills: wait
                # for one record, then take what else has come, so that a change is in
                # force (and a catch-up waiting for it ends) as soon as it arrives.
                records = consumer.poll(1, 0.1)
                if records:
                    records += consumer.poll(1000, 0)
                for r in records:
                    self.cache.apply(scope_of(r.key), r.value, r.headers)
                # After the records are applied: a catch-up waiting for them may end.
                self._advance({p: o for (_, p), o in consumer.positions().items()})
        finally:
            consumer.close()


def scope_of(key: bytes | None) -> str:
    """A feed record's scope; a key that is not UTF-8 names no scope `apply` knows."""
    return key.decode("utf-8", "replace") if key else ""
