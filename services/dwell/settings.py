"""Settings every dwell process shares, read from `DWELL_*` environment variables.
Each service subclasses `CommonSettings` with its own fields; Helm values,
env vars and field names use the same words."""

from __future__ import annotations

from typing import Final, Literal
from urllib.parse import urlparse

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dwell import endpoints
from dwell.core import topics as names
from dwell.core.admit import DELAY_LIMIT_MS
from dwell.core.policy import BrokerDefaults, BrokerLimits
from dwell.security import KafkaSecurity, RedisSecurity, TlsSettings

# dwell's own consumer groups start with this: no tenant's name may (tenant names are
# checked at creation), so no tenant's Kafka ACL prefix `<tenant>.` covers a group of
# dwell's or the tracker's `<group>.lowmark`.
GROUP_PREFIX: Final = "dwell-"
# What the chart's schema checks of such a setting, before a pod starts.
GROUP_SCHEMA: Final = {"pattern": f"^{GROUP_PREFIX}."}


def dwell_group(setting: str, group: str) -> str:
    """``group`` if it is a dwell consumer group id (it starts GROUP_PREFIX); else the
    process stops at start with a message naming ``setting``."""
    if not group.startswith(GROUP_PREFIX) or group == GROUP_PREFIX:
        raise ValueError(f"{setting} must start with {GROUP_PREFIX!r} (got {group!r}): a "
                         "tenant's Kafka ACLs cover the groups and topics that start "
                         "with its name and a dot, and no tenant name starts with "
                         f"{GROUP_PREFIX!r}")
    return group


# DWELL_ALLOW_INSECURE's names: what DWELL_ENV=production refuses unless allowed by name.
INSECURE_NAMES: Final = ("auth", "kafka-plaintext", "redis-plaintext", "http-plaintext")


class ServiceSettings(BaseSettings):
    """What the HTTP services (policy, admission, tracker) take beyond CommonSettings."""

    model_config = SettingsConfigDict(env_prefix="DWELL_", extra="ignore")

    max_request_bytes: int = Field(64 * 1024, ge=1024, description=(
        "A request body above this is answered 413 before it is read whole."))


class TrackerClientSettings(BaseSettings):
    """What the services that ask the tracker (policy, admission) take."""

    model_config = SettingsConfigDict(env_prefix="DWELL_", extra="ignore")

    tracker_url: str = Field(endpoints.TRACKER_URL, description=(
        "The tracker, which holds the index of delayed messages: the policy service serves "
        "its figures on Pulsar's topic stats path (`GET /admin/v2/persistent/.../stats`, "
        "where pulsar-admin's `topics stats` asks), admission hands it cancels "
        "(`DELETE /topics/.../messages/{messageId}`, and the cancel requests of "
        "`dwell.publish`)."))


class RedisLossSettings(BaseSettings):
    """What the processes that find out Redis lost their data (the tracker, the Spark app)
    take."""

    model_config = SettingsConfigDict(env_prefix="DWELL_", extra="ignore")

    redis_check_interval_ms: int = Field(1000, ge=50, description=(
        "Losing Redis: how often the process checks that Redis still holds what it wrote "
        "(the tracker: the index it ingested, `dwell.tracker.recovery`; the Spark app, "
        "while idle: the redelivery indexes, `dwell_spark.recovery`)."))


class ReadyTopicSettings(BaseSettings):
    """How the processes that create ready topics (admission, the tracker) create them."""

    model_config = SettingsConfigDict(env_prefix="DWELL_", extra="ignore")

    allow_auto_topic_creation: bool = Field(True, description=(
        "Pulsar's `allowAutoTopicCreation`: a topic's ready topic is created on first use, "
        "by admission's first publish or the tracker's first subscription to it. `false`: "
        "a publish is answered 404 `Topic persistent://t/ns/x not found` until the topic "
        "is created (`pulsar-admin topics create`), and registering a subscription does "
        "not create it; a subscription's retry topic, which users' principals may not "
        "create, is made always."))
    ready_topic_partitions: int = Field(4, ge=1, description=(
        "Partitions of the ready topics admission and the tracker create."))


class CommonSettings(TlsSettings, KafkaSecurity, RedisSecurity, BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DWELL_", extra="ignore")

    env: Literal["development", "production"] = Field(
        "development", description=(
            "`production` refuses a Redis URL without a password, and at start refuses "
            "authentication off, plaintext Kafka (`PLAINTEXT`, `SASL_PLAINTEXT`), Redis "
            "without TLS (`redis://`) and HTTP without TLS, naming each (see "
            "`DWELL_ALLOW_INSECURE`)."))
    http_host: str = Field("127.0.0.1", description="Address the process's HTTP port binds.")
    http_port: int = Field(8080, ge=1, le=65535, description=(
        "The process's HTTP port; each service has its own default (below)."))
    max_header_bytes: int = Field(32 * 1024, ge=1024, description=(
        "An HTTP request's target and headers, in bytes, above which it is answered 431."))
    # May hold a password: kept out of the settings' repr.
    redis_url: str = Field(endpoints.REDIS_URL, repr=False, description=(
        "Redis to use; `rediss://` turns TLS on, and a user and password may be in the URL."))
    kafka_bootstrap: str = Field(endpoints.KAFKA_BOOTSTRAP,
                                 description="Kafka's bootstrap servers.")
    kafka_replication_factor: int = Field(1, ge=1, description=(
        "Replication factor of the Kafka topics dwell creates."))
    kafka_compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none", description=(
            "Codec of every record dwell writes (librdkafka's `compression.type`). `none` "
            "keeps the topics readable by any Kafka client with its defaults: a bare "
            "kafka-python reads only `none` and `gzip`."))
    delayed_topic_partitions: int = Field(4, ge=1, le=10_000, description=(
        "Partitions of `dwell.delayed`, the delay log, when dwell creates it: how many "
        "tracker and restage readers can share it. An existing topic keeps its count: a "
        "start that sets another logs a warning and changes nothing."))
    acks_topic_partitions: int = Field(4, ge=1, le=10_000, description=(
        "Partitions of `dwell.acks`, the consumers' delivered/ack/nack events, when dwell "
        "creates it: the backoff job reads one Spark task per partition. An existing "
        "topic keeps its count, as `DWELL_DELAYED_TOPIC_PARTITIONS`'s does."))
    refiled_topic_partitions: int = Field(4, ge=1, le=10_000, description=(
        "Partitions of `dwell.delayed.refiled`, the tracker's re-file log, when dwell "
        "creates it: how many tracker ingest loops can share its copies. An existing "
        "topic keeps its count."))
    delivered_topic_partitions: int = Field(4, ge=1, le=10_000, description=(
        "Partitions of `dwell.delivered`, the delivered marks a rebuild of the index "
        "skips, when dwell creates it. An existing topic keeps its count."))
    publish_topic_partitions: int = Field(4, ge=1, le=10_000, description=(
        "Partitions of `dwell.publish` and `dwell.publish.results` (publishing through "
        "Kafka, and its results) when dwell creates them: how many admission readers can "
        "share them. An existing topic keeps its count."))
    cluster: str = Field("standalone", description=(
        "The one cluster dwell is (Pulsar's `clusterName`), the only one a tenant's "
        "`allowedClusters` may name."))
    log_level: str = Field("info", description="Log level: `debug`, `info`, `warning`, `error`.")

    delayed_delivery_enabled: bool = Field(True, description=(
        "Pulsar's `delayedDeliveryEnabled`: the broker default a policy may override."))
    delayed_delivery_tick_time_ms: int = Field(1000, ge=1, description=(
        "Pulsar's `delayedDeliveryTickTimeMillis`: the width of a delay bucket; a message "
        "may be delivered up to one tick early unless delivery is strict."))
    delayed_delivery_max_delay_ms: int = Field(0, ge=0, description=(
        "Pulsar's `delayedDeliveryMaxDelayInMillis`: the longest delay a message may ask "
        "for; 0 is no limit."))
    delayed_delivery_fixed_delay_ms: int = Field(0, ge=0, description=(
        "A delay every message gets (Pulsar's PIP-437); 0 is off. At most "
        "`DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS`."))
    delayed_delivery_deliver_at_time_strict: bool = Field(False, description=(
        "Pulsar's `isDelayedDeliveryDeliverAtTimeStrict`: never deliver before the time asked "
        "for (otherwise a message may go up to a tick early)."))
    delayed_delivery_fixed_delay_detection_lookahead: int = Field(50000, ge=0, description=(
        "Pulsar's `delayedDeliveryFixedDelayDetectionLookahead`: a topic's stats report "
        "`fixedDelayDetected` once this many messages with one delay are pending."))
    # dwell.core.admit.DELAY_LIMIT_MS says why it can go no higher.
    delayed_delivery_delay_limit_ms: int = Field(
        DELAY_LIMIT_MS, ge=1, le=DELAY_LIMIT_MS, description=(
            "dwell's own: the longest delay accepted, above every policy (the default, 100 "
            "years, is also the most). A longer message is rejected (`Exceeds max allowed "
            "delivery delay of <limit> milliseconds`), a longer fixed delay is a 400 (a "
            "larger max is stored, as Pulsar stores it). Lower it to bound the disk pending "
            "messages hold (`docs/architecture.md`, \"The longest delay\")."))

    def dwell_topic_partitions(self) -> dict[str, int]:
        """The partition counts of dwell's own topics that are settings, by topic."""
        return {names.DELAYED: self.delayed_topic_partitions,
                names.REFILED: self.refiled_topic_partitions,
                names.ACKS: self.acks_topic_partitions,
                names.DELIVERED: self.delivered_topic_partitions,
                names.PUBLISH: self.publish_topic_partitions,
                names.PUBLISH_RESULTS: self.publish_topic_partitions}

    authentication_enabled: bool = Field(False, description=(
        "Pulsar's `authenticationEnabled`: every call needs a token."))
    authorization_enabled: bool = Field(False, description=(
        "Pulsar's `authorizationEnabled`: roles from tokens are checked against tenants' and "
        "namespaces' permissions; needs authentication."))
    super_user_roles: str = Field("", description=(
        "Pulsar's `superUserRoles`: a comma list of roles allowed everything."))
    token_secret_key: SecretStr = Field(SecretStr(""), description=(
        "Pulsar's `tokenSecretKey`: the HS256 key tokens are signed with, as "
        "`data:;base64,...`, `file:/path` or base64."))
    token_public_key: str = Field("", description=(
        "Pulsar's `tokenPublicKey`: the public key (DER or PEM; RS256, ES256, ...) of tokens "
        "signed with a key pair, in the same forms; used when no secret key is set."))
    kafka_token_secret_key: SecretStr = Field(SecretStr(""), description=(
        "dwell's own: the HMAC key of the Kafka tokens it issues (`dwell.auth.tokens`), in "
        "the same forms; empty: `DWELL_TOKEN_SECRET_KEY` (required with a public key)."))
    kafka_token_ttl_ms: int = Field(600_000, ge=1000, le=3_600_000, description=(
        "The life of a Kafka token dwell issues: at most 1 hour, and never past the expiry "
        "of the token it was exchanged for."))

    authenticate_metrics_endpoint: bool = Field(False, description=(
        "Pulsar's `authenticateMetricsEndpoint`: `/metrics` (it names every tenant's topics) "
        "needs a token; with authorization on, of a super-user or one of "
        "`DWELL_METRICS_ROLES`."))
    metrics_roles: str = Field("", description=(
        "Pulsar's `metricsRoles`: a comma list of roles that may read `/metrics` besides "
        "super-users."))

    # dwell's defaults are bounded where Pulsar's are 0 (unlimited) because every topic,
    # partition and subscription costs Kafka partitions (a subscription a RETRY and a DLQ
    # topic): no tenant may create them without end.
    max_num_partitions_per_partitioned_topic: int = Field(100, ge=0, description=(
        "Pulsar's `maxNumPartitionsPerPartitionedTopic` (Pulsar's default: 0, no limit): "
        "more is 406 `Number of partitions should be less than or equal to 100`."))
    max_topics_per_namespace: int = Field(1000, ge=0, description=(
        "Pulsar's `maxTopicsPerNamespace` (Pulsar's default: 0); a partition counts as a "
        "topic, in topic creation and admission's auto-creation alike: more is 412 "
        "`Exceed maximum number of topics in namespace.`. A namespace's own policy wins."))
    max_subscriptions_per_topic: int = Field(100, ge=0, description=(
        "Pulsar's `maxSubscriptionsPerTopic` (Pulsar's default: 0), checked when the tracker "
        "registers a new subscription: more is 412 `Exceed the maximum number of "
        "subscriptions of the topic: persistent://t/ns/x`. A namespace's own policy wins."))

    allow_insecure: str = Field("", description=(
        "With `DWELL_ENV=production`, what may run unprotected anyway, by name: a comma list "
        "of `auth`, `kafka-plaintext`, `redis-plaintext`, `http-plaintext`."))

    @model_validator(mode="after")
    def _defaults_within_the_delay_limit(self) -> CommonSettings:
        limit = self.delayed_delivery_delay_limit_ms
        if self.delayed_delivery_fixed_delay_ms > limit:
            raise ValueError("DWELL_DELAYED_DELIVERY_FIXED_DELAY_MS is more than "
                             f"DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS ({limit} ms)")
        return self

    @model_validator(mode="after")
    def _refuse_insecure_production(self) -> CommonSettings:
        # Outside development a Redis without a password is refused, as the
        # FastAPI template refuses its `changethis` secret.
        if (self.env == "production" and not urlparse(self.redis_url).password
                and self.redis_password is None):
            raise ValueError("DWELL_REDIS_URL has no password; production needs Redis AUTH "
                             "(set DWELL_REDIS_PASSWORD from a Secret, or "
                             "redis://:$(REDIS_PASSWORD)@host:6379/0)")
        if self.authorization_enabled and not self.authentication_enabled:
            raise ValueError("DWELL_AUTHORIZATION_ENABLED needs DWELL_AUTHENTICATION_ENABLED: "
                             "roles come from tokens")
        if self.env == "production":
            refused = [text for name, text in self.insecure().items()
                       if name not in self.allowed_insecure()]
            if refused:
                raise ValueError(
                    "DWELL_ENV=production refuses to run with " + "; ".join(refused) + ". "
                    "Secure it, or allow each by name in DWELL_ALLOW_INSECURE (a comma "
                    f"list of {', '.join(INSECURE_NAMES)})")
        return self

    def allowed_insecure(self) -> frozenset[str]:
        names = frozenset(n.strip() for n in self.allow_insecure.split(",") if n.strip())
        unknown = sorted(names - set(INSECURE_NAMES))
        if unknown:
            raise ValueError(f"DWELL_ALLOW_INSECURE names {', '.join(unknown[:3])}, which is "
                             f"not one of {', '.join(INSECURE_NAMES)}")
        return names

    def insecure(self) -> dict[str, str]:
        """What runs unprotected, by its DWELL_ALLOW_INSECURE name, with what to set."""
        found = {}
        if not self.authentication_enabled:
            found["auth"] = ("authentication off (set DWELL_AUTHENTICATION_ENABLED=true; "
                             "allow with 'auth')")
        if not self.ssl:
            found["kafka-plaintext"] = (
                f"Kafka over {self.kafka_security_protocol} (set DWELL_KAFKA_SECURITY_PROTOCOL"
                "=SSL or SASL_SSL; allow with 'kafka-plaintext')")
        if not self.redis_url.startswith("rediss://"):
            found["redis-plaintext"] = ("Redis without TLS (a rediss:// DWELL_REDIS_URL; "
                                        "allow with 'redis-plaintext')")
        if not self.tls_enabled:
            found["http-plaintext"] = ("HTTP without TLS (set DWELL_TLS_ENABLED=true; allow "
                                       "with 'http-plaintext')")
        return found

    def metrics_role_set(self) -> frozenset[str]:
        return frozenset(r.strip() for r in self.metrics_roles.split(",") if r.strip())

    def broker_limits(self) -> BrokerLimits:
        return BrokerLimits(self.max_num_partitions_per_partitioned_topic,
                            self.max_topics_per_namespace, self.max_subscriptions_per_topic)

    def super_users(self) -> frozenset[str]:
        return frozenset(r.strip() for r in self.super_user_roles.split(",") if r.strip())

    def broker_defaults(self) -> BrokerDefaults:
        return BrokerDefaults(
            enabled=self.delayed_delivery_enabled,
            tick_time_ms=self.delayed_delivery_tick_time_ms,
            max_delay_ms=self.delayed_delivery_max_delay_ms,
            fixed_delay_ms=self.delayed_delivery_fixed_delay_ms,
            strict=self.delayed_delivery_deliver_at_time_strict,
            fixed_delay_detection_lookahead=self.delayed_delivery_fixed_delay_detection_lookahead,
        )
