"""dwell.acks as the backoff job reads it: every event checked (dwell.core.invalid) before
the job uses it. Good events go on to the backoff query; malformed ones go to
`dwell.invalid` with their reason, through a query of their own, so that no event can
stop or crash-loop the backoff query (a bad messageId or backoff would fail its
micro-batch, and the batch would fail again on every restart).

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
to `dwell.invalid` as `unknown_subscription`.

The side query is at-least-once: a crash between writing a batch's records and its
checkpoint writes them again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from dwell import headers as hdr
from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.auth.keys import kafka_token_key
from dwell.auth.tokens import InvalidToken, KafkaTokenVerifier
from dwell.cache import BoundedCache, ExpiringCache
from dwell.core import invalid
from dwell.core import topics as names
from dwell.core.authz import Grants, Operation, allowed, namespace_auth
from dwell.core.topics import TopicName
from dwell.security import spark_kafka_options

from . import metrics
from .settings import SparkSettings

log = logging.getLogger("dwell.spark.invalid")

CHECK_SCHEMA: Final = StructType([StructField("kind", StringType()),
                                  StructField("reason", StringType())])
QUERY: Final = "acks-invalid"
# kafka.fetch.max.wait.ms of the side query, as the backoff query's.
FETCH_MAX_WAIT_MS: Final = 10
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
        todo = sorted({p for p in pairs
                       if _registered.get((self.redis_url, *p), 0.0) <= now})
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


def check_events(values: pd.Series, auths: pd.Series, max_bytes: int,
                 system_topics: frozenset[str], auth: AckAuth | None = None,
                 timestamps: pd.Series | None = None,
                 timestamp_types: pd.Series | None = None,
                 subscriptions: SubscriptionCheck | None = None) -> pd.DataFrame:
    """(kind, reason) of each event, both None for a good one: ``values`` are the raw
    record values, ``auths`` each record's `dwell-authorization` header values,
    ``timestamps`` their record timestamps in ms and ``timestamp_types`` Kafka's type of
    each (1: LogAppendTime); ``auth`` who may send them (None: authentication off);
    ``subscriptions`` which subscriptions are registered (None: any)."""
    kinds: list[str | None] = []
    reasons: list[str | None] = []
    # Index of each good event of a user topic, with its (topic, subscription).
    named: list[tuple[int, tuple[str, str]]] = []
    n = len(values)
    stamps = timestamps if timestamps is not None else pd.Series([0] * n)
    types = timestamp_types if timestamp_types is not None else pd.Series([0] * n)
    for value, header, ts, ts_type in zip(values, auths, stamps, types, strict=True):
        try:
            invalid.check_size(value, max_bytes, "acks_max_event_bytes")
            token = invalid.authorization([] if header is None else list(header))
            doc = invalid.check_ack_event(value, max_bytes, system_topics)
            if doc["topic"] not in system_topics:
                if auth is not None:
                    auth.check(token, doc["topic"], int(ts),
                               int(ts_type) == LOG_APPEND_TIME)
                named.append((len(kinds), (doc["topic"], doc["subscription"])))
        except invalid.Malformed as exc:
            kinds.append(exc.kind)
            reasons.append(exc.reason[:invalid.MAX_REASON_CHARS])
            continue
        kinds.append(None)
        reasons.append(None)
    if subscriptions is not None and named:
        unknown = subscriptions.unknown(pair for _, pair in named)
        for i, (topic, sub) in named:
            if (topic, sub) in unknown:
                kinds[i] = invalid.UNKNOWN_SUBSCRIPTION
                reasons[i] = (f"subscription: {sub!r} is not registered on {topic} (PUT "
                              "/v1/topics/<topic>/subscriptions/<sub> at the tracker, as "
                              "the SDK does)")[:invalid.MAX_REASON_CHARS]
    return pd.DataFrame({"kind": kinds, "reason": reasons})


def _checker(max_bytes: int, system_topics: frozenset[str], auth: AckAuth | None,
             subscriptions: SubscriptionCheck) -> Any:
    @F.pandas_udf(CHECK_SCHEMA)  # type: ignore[call-overload]
    def check(values: pd.Series, auths: pd.Series, timestamps: pd.Series,
              timestamp_types: pd.Series) -> pd.DataFrame:
        return check_events(values, auths, max_bytes, system_topics, auth, timestamps,
                            timestamp_types, subscriptions)
    return check


def _auth_values() -> Column:
    """The record's `dwell-authorization` header values (an empty array without one)."""
    headers = F.coalesce(F.col("headers"), F.array().cast("array<struct<key:string,"
                                                          "value:binary>>"))
    return F.transform(F.filter(headers, lambda h: h["key"] == F.lit(hdr.AUTHORIZATION)),
                       lambda h: h["value"])


def checked_acks(spark: SparkSession, settings: SparkSettings,
                 system_topics: frozenset[str]) -> DataFrame:
    """dwell.acks as a stream, each record with `bad` (kind, reason: null when good)."""
    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .options(**spark_kafka_options(settings))
           .option("subscribe", names.ACKS)
           .option("startingOffsets", settings.acks_starting_offsets)
           .option("maxOffsetsPerTrigger", str(settings.acks_max_events_per_batch))
           .option("failOnDataLoss", "false")
           .option("includeHeaders", "true")
           .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
           .load())
    return with_checks(raw, settings, system_topics)


def with_checks(raw: DataFrame, settings: SparkSettings,
                system_topics: frozenset[str]) -> DataFrame:
    """dwell.acks records as the Kafka source reads them (headers included), each with
    `bad` (kind, reason: null when good)."""
    check = _checker(settings.acks_max_event_bytes, system_topics, AckAuth.of(settings),
                     SubscriptionCheck.of(settings))
    return raw.withColumn("bad", check(F.col("value"), _auth_values(),
                                       F.unix_millis(F.col("timestamp")),
                                       F.col("timestampType")))


def write_invalid(rows: list[Any], producer: kafka.Producer) -> None:
    """Put a batch's malformed events on dwell.invalid and count them."""
    futures = []
    for row in rows:
        topic, value, key, headers, _ = invalid.invalid_record(
            names.ACKS, int(row.partition), int(row.offset), row.key, row.value,
            row.kind, row.reason)
        futures.append(producer.send(topic, value, key, dict(headers)))
        metrics.INVALID_RECORDS.labels(names.ACKS, row.kind).inc()
    for f in futures:
        f.result(30)


def start(spark: SparkSession, settings: SparkSettings, system_topics: frozenset[str]) -> Any:
    """The side query: malformed dwell.acks events to dwell.invalid."""
    producer = kafka.Producer(settings.kafka_bootstrap, linger_ms=0,
                              compression_type=settings.kafka_compression_type)

    metrics.expect_query(QUERY)

    def _batch(df: DataFrame, batch_id: int) -> None:
        with metrics.batch_running(QUERY):
            rows = df.collect()
            if rows:
                write_invalid(rows, producer)
                log.warning("dwell.acks: %d malformed events set aside on %s (first: %s)",
                            len(rows), names.INVALID, rows[0].reason)
        # Its first batch reads the backoff's warm-up event (backoff.warm_up) and pays for
        # this query's first plans, before any consumer's events depend on the cores.
        metrics.mark_ready(QUERY)

    bad = (checked_acks(spark, settings, system_topics)
           .where(F.col("bad.kind").isNotNull())
           .select("partition", "offset", "key", "value", "bad.kind", "bad.reason"))
    return (bad.writeStream.queryName(f"dwell-{QUERY}")
            .foreachBatch(_batch)
            .trigger(processingTime=f"{settings.invalid_trigger_ms} milliseconds")
            .option("checkpointLocation", f"{settings.spark_checkpoint_dir}/acks-invalid")
            .start())
