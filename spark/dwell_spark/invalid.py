"""dwell.acks as the backoff reads it: every event checked (dwell.core.invalid) before
the backoff uses it, in the same pass over the records (dwell_spark.backoff). Good events
go on to the backoff's decisions; malformed ones go to `dwell.invalid` with their reason,
so that no event can stop or crash-loop the backoff (a bad messageId or backoff would
fail its micro-batch, and the batch would fail again on every restart).

With authentication on (DWELL_AUTHENTICATION_ENABLED), an event must also carry, in
`dwell-authorization`, a Kafka token (dwell.auth.tokens) that was valid when the broker
wrote the event (dwell.acks has message.timestamp.type=LogAppendTime); a long-lived token
is refused. With authorization on, its role must hold `consume`
on the event's namespace (or be a super-user or the tenant's admin), as read from the
policy store in Redis (cached per Python worker for backoff_registry_ttl_ms); events that
fail go to `dwell.invalid` as `unauthenticated` / `unauthorized`. The app's own events
(SYSTEM_TOPICS) carry no token.

An event's subscription must be registered at the tracker (SubscriptionCheck): the
backoff and the drain make a retry and a dead-letter topic for each subscription they
see, and only the tracker's registration is held to maxSubscriptionsPerTopic. Others go
to `dwell.invalid` as `unknown_subscription`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from dwell import headers as hdr
from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.auth.keys import kafka_token_key
from dwell.auth.tokens import InvalidToken, KafkaTokenVerifier
from dwell.cache import BoundedCache, ExpiringCache
from dwell.core import invalid
from dwell.core import topics as names
from dwell.core.authz import Grants, Operation, allowed, namespace_auth
from dwell.core.topics import TopicName

from .settings import SparkSettings

# The Kafka source's timestampType of a timestamp the broker set.
LOG_APPEND_TIME: Final = 1


# Per Python worker (workers are reused across batches): token verifiers by key, and the
# grants read.
_verifiers: dict[tuple[str, str, str], KafkaTokenVerifier] = {}
_grants: ExpiringCache[tuple[str, str, str], Grants] = ExpiringCache()
_lock = threading.Lock()


@dataclass(frozen=True)
class AckAuth:
    """Who may send ack events: ``check(token, topic)`` raises Malformed
    (UNAUTHENTICATED / UNAUTHORIZED) for an event the role may not send. Pickles as
    its settings, so it ships to the executors."""

    kafka_secret_key: str
    secret_key: str
    public_key: str
    authorization: bool
    super_users: frozenset[str]
    redis_url: str
    ttl_ms: int

    @classmethod
    def of(cls, settings: SparkSettings) -> AckAuth | None:
        if not settings.authentication_enabled:
            return None
        auth = cls(settings.kafka_token_secret_key.get_secret_value(),
                   settings.token_secret_key.get_secret_value(), settings.token_public_key,
                   settings.authorization_enabled, settings.super_users(),
                   settings.redis_url, settings.backoff_registry_ttl_ms)
        auth._verifier()  # a missing or bad key stops the app at start, with its reason
        return auth

    def _verifier(self) -> KafkaTokenVerifier:
        key = (self.kafka_secret_key, self.secret_key, self.public_key)
        with _lock:
            found = _verifiers.get(key)
            if found is None:
                found = _verifiers[key] = KafkaTokenVerifier(kafka_token_key(*key))
        return found

    def _grants(self, tenant: str, namespace: str) -> Grants:
        def load() -> Grants:
            tenant_raw, ns_raw = redis_adapter.shared(self.redis_url).mget(
                [keys.tenant(tenant), keys.namespace(f"{tenant}/{namespace}")])
            admins = orjson.loads(tenant_raw)["tenant"]["adminRoles"] if tenant_raw else ()
            return Grants.of(admins, namespace_auth(orjson.loads(ns_raw)) if ns_raw else None)
        return _grants.get((self.redis_url, tenant, namespace), self.ttl_ms, load)

    def check(self, token: str | None, topic: str, record_ms: int,
              log_append_time: bool) -> None:
        """``record_ms``: the event's record timestamp, which ``log_append_time`` says the
        broker set (a producer-set one would let an expired token be replayed)."""
        if token is None:
            raise invalid.Malformed(invalid.UNAUTHENTICATED,
                                    f"header {hdr.AUTHORIZATION}: missing; authentication "
                                    "is on (Bearer <Kafka token>, from POST "
                                    "/admin/v2/kafka-tokens)")
        if not log_append_time:
            raise invalid.Malformed(invalid.UNAUTHENTICATED,
                                    f"{names.ACKS} records need broker timestamps "
                                    "(message.timestamp.type=LogAppendTime)")
        try:
            role = self._verifier().role_at(token, record_ms)
        except InvalidToken as exc:
            raise invalid.Malformed(invalid.UNAUTHENTICATED, f"token: {exc}") from None
        if not self.authorization:
            return
        name = TopicName.parse(topic)
        if role in self.super_users:
            return
        if not allowed(role, Operation.ACK, self.super_users,
                       self._grants(name.tenant, name.namespace)):
            raise invalid.Malformed(invalid.UNAUTHORIZED,
                                    f"role {role!r} may not consume on {name.namespace_name}")


# Per Python worker: (redis_url, topic, subscription) found registered, until when
# (time.monotonic()).
_registered: BoundedCache[tuple[str, str, str], float] = BoundedCache()


@dataclass(frozen=True)
class SubscriptionCheck:
    """``unknown(pairs)``: the (topic, subscription) pairs the tracker's registry
    (`dwell:subs:{topic}`) does not hold, read in one round trip. Only registered ones are
    cached (``ttl_ms``), so a new registration counts at once. While the registry's marker
    is missing (Redis lost it and the tracker has not rebuilt it yet) none is unknown:
    losing Redis may delay a redelivery, never drop it. Pickles as its settings."""

    redis_url: str
    ttl_ms: int

    @classmethod
    def of(cls, settings: SparkSettings) -> SubscriptionCheck:
        return cls(settings.redis_url, settings.backoff_registry_ttl_ms)

    def unknown(self, pairs: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        now = time.monotonic()
        todo = sorted(p for p in set(pairs)
                      if _registered.get((self.redis_url, *p), 0.0) <= now)
        if not todo:
            return set()
        pipe = redis_adapter.shared(self.redis_url).pipeline(transaction=False)
        pipe.exists(keys.SUBSCRIPTIONS_APPLIED)
        for topic, sub in todo:
            pipe.hexists(keys.subscriptions(topic), sub)
        whole, *found = pipe.execute()
        if not whole:
            return set()
        unknown = set()
        for pair, known in zip(todo, found, strict=True):
            if known:
                _registered.put((self.redis_url, *pair), now + self.ttl_ms / 1000)
            else:
                unknown.add(pair)
        return unknown


# One record as the checks leave it: (kind, reason, event) with kind and reason None and
# the parsed event for a good one, the event None for a malformed one.
Checked = tuple[str | None, str | None, dict[str, Any] | None]


def check_records(values: Sequence[bytes | None], auths: Sequence[Any], max_bytes: int,
                  system_topics: frozenset[str], auth: AckAuth | None = None,
                  timestamps: Sequence[int] | None = None,
                  timestamp_types: Sequence[int] | None = None,
                  subscriptions: SubscriptionCheck | None = None) -> list[Checked]:
    """Each record checked: ``values`` are the raw record values, ``auths`` each record's
    `dwell-authorization` header values, ``timestamps`` their record timestamps in ms and
    ``timestamp_types`` Kafka's type of each (1: LogAppendTime); ``auth`` who may send
    them (None: authentication off); ``subscriptions`` which subscriptions are registered
    (None: any)."""
    out: list[Checked] = []
    # Index of each good event of a user topic, with its (topic, subscription).
    named: list[tuple[int, tuple[str, str]]] = []
    n = len(values)
    stamps = timestamps if timestamps is not None else [0] * n
    types = timestamp_types if timestamp_types is not None else [0] * n
    for value, header, ts, ts_type in zip(values, auths, stamps, types, strict=True):
        try:
            invalid.check_size(value, max_bytes, "acks_max_event_bytes")
            token = invalid.authorization([] if header is None else list(header))
            doc = invalid.check_ack_event(value, max_bytes, system_topics)
            if doc["topic"] not in system_topics:
                if auth is not None:
                    auth.check(token, doc["topic"], int(ts),
                               int(ts_type) == LOG_APPEND_TIME)
                named.append((len(out), (doc["topic"], doc["subscription"])))
        except invalid.Malformed as exc:
            out.append((exc.kind, exc.reason[:invalid.MAX_REASON_CHARS], None))
            continue
        out.append((None, None, doc))
    if subscriptions is not None and named:
        unknown = subscriptions.unknown(pair for _, pair in named)
        for i, (topic, sub) in named:
            if (topic, sub) in unknown:
                out[i] = (invalid.UNKNOWN_SUBSCRIPTION,
                          (f"subscription: {sub!r} is not registered on {topic} (PUT "
                           "/v1/topics/<topic>/subscriptions/<sub> at the tracker, as the "
                           "SDK does)")[:invalid.MAX_REASON_CHARS], None)
    return out
