"""Settings every dwell process shares, read from `DWELL_*` environment variables.
Each service subclasses `CommonSettings` with its own fields; Helm values,
env vars and field names use the same words."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dwell.core.policy import BrokerDefaults
from dwell.security import KafkaSecurity, RedisSecurity, TlsSettings


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
        return self

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
