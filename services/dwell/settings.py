"""Settings every dwell process shares, read from `DWELL_*` environment variables.
Each service subclasses `CommonSettings` with its own fields; Helm values,
env vars and field names use the same words."""

from __future__ import annotations

from typing import Final, Literal
from urllib.parse import urlparse

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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


class CommonSettings(TlsSettings, KafkaSecurity, RedisSecurity, BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DWELL_", extra="ignore")

    env: Literal["development", "production"] = "development"
    http_host: str = "127.0.0.1"
    http_port: int = Field(8080, ge=1, le=65535)
    # An HTTP request's target and headers, in bytes, above which it is answered 431.
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    # May hold a password: kept out of the settings' repr.
    redis_url: str = Field("redis://127.0.0.1:6379/0", repr=False)
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_replication_factor: int = Field(1, ge=1)
    # Codec of every record dwell produces (librdkafka's compression.type). "none" by
    # default: the topics users read must be readable by any Kafka client with its
    # defaults, and a bare kafka-python cannot decode lz4, snappy or zstd.
    kafka_compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"
    cluster: str = "standalone"
    log_level: str = "info"

    # Broker defaults, Pulsar's broker.conf names with units.
    delayed_delivery_enabled: bool = True
    delayed_delivery_tick_time_ms: int = Field(1000, ge=1)
    delayed_delivery_max_delay_ms: int = Field(0, ge=0)
    delayed_delivery_fixed_delay_ms: int = Field(0, ge=0)
    delayed_delivery_deliver_at_time_strict: bool = False
    delayed_delivery_fixed_delay_detection_lookahead: int = Field(50000, ge=0)
    # dwell's own: the longest delay admission accepts and the largest max or fixed delay a
    # policy may set, whatever the policies say (dwell.core.admit.DELAY_LIMIT_MS says why
    # it can go no higher). Lower it to bound the disk long delays hold.
    delayed_delivery_delay_limit_ms: int = Field(DELAY_LIMIT_MS, ge=1, le=DELAY_LIMIT_MS)

    # Authentication and authorization, Pulsar's broker.conf names (dwell.auth). Keys as
    # Pulsar's tokenSecretKey / tokenPublicKey: data:;base64,..., file:/path, or base64.
    authentication_enabled: bool = False
    authorization_enabled: bool = False
    super_user_roles: str = ""  # comma list
    token_secret_key: SecretStr = SecretStr("")
    token_public_key: str = ""
    # Kafka tokens (dwell.auth.tokens): the HMAC key they are signed with, in the same
    # forms (DWELL_TOKEN_SECRET_KEY when empty; required with a public key), and their life.
    kafka_token_secret_key: SecretStr = SecretStr("")
    kafka_token_ttl_ms: int = Field(600_000, ge=1000, le=3_600_000)

    # Pulsar's authenticateMetricsEndpoint: /metrics (it names every tenant's topics) then
    # needs a token; with authorization on, of a super-user or one of metrics_roles.
    authenticate_metrics_endpoint: bool = False
    metrics_roles: str = ""  # comma list

    # Quotas, Pulsar's broker.conf names (0: unlimited, Pulsar's default). dwell's defaults
    # are bounded because every topic, partition and subscription costs Kafka partitions
    # (a subscription a RETRY and a DLQ topic): no tenant may create them without end.
    max_num_partitions_per_partitioned_topic: int = Field(100, ge=0)
    max_topics_per_namespace: int = Field(1000, ge=0)
    max_subscriptions_per_topic: int = Field(100, ge=0)

    # What DWELL_ENV=production may run without, by name (comma list of INSECURE_NAMES).
    allow_insecure: str = ""

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
