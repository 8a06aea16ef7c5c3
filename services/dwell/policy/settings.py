"""Settings of the policy service (`DWELL_*` environment variables)."""

from __future__ import annotations

from pydantic import Field, field_validator

from dwell.settings import GROUP_SCHEMA, CommonSettings, dwell_group


class PolicySettings(CommonSettings):
    http_port: int = Field(8081, ge=1, le=65535)
    # A request body above this is answered 413 before it is read whole.
    max_request_bytes: int = Field(1024 * 1024, ge=1024)
    # A policy record (a tenant, a namespace with its permissions, a policy) above this is
    # refused with 413 before anything is stored; it must stay below the broker's
    # message.max.bytes for dwell.policies, since the feed must carry every record.
    max_policy_record_bytes: int = Field(512 * 1024, ge=1024)
    # How long an admin call waits for Kafka to acknowledge its change-feed record before
    # answering 503 (the change stays saved and is published once Kafka is back).
    feed_timeout_ms: int = Field(5000, ge=100)
    # How often the service retries publishing what the feed missed while Kafka was down.
    feed_sync_interval_ms: int = Field(5000, ge=100)
    # Losing Redis (dwell.policy.rebuild): how often the store's epoch and version are
    # checked between calls, and how long a call waits for a rebuild before its 503.
    store_check_interval_ms: int = Field(1000, ge=50)
    store_rebuild_timeout_ms: int = Field(10000, ge=1000)
    # The tracker, whose index figures `GET /admin/v2/persistent/.../stats` serves on the
    # admin URL, where pulsar-admin's `topics stats` asks for them.
    tracker_url: str = "http://127.0.0.1:8083"
    # The consumer group under which the service's replicas audit dwell.policies, setting
    # aside once each record the followers cannot apply (dwell.policy.audit).
    policy_audit_group: str = Field("dwell-policy-audit", json_schema_extra=GROUP_SCHEMA)

    @field_validator("policy_audit_group")
    @classmethod
    def _dwell_group(cls, group: str) -> str:
        return dwell_group("DWELL_POLICY_AUDIT_GROUP", group)
