"""Settings of the policy service (`DWELL_*` environment variables)."""

from __future__ import annotations

from pydantic import Field, field_validator

from dwell import endpoints
from dwell.settings import (
    GROUP_SCHEMA,
    CommonSettings,
    ServiceSettings,
    TrackerClientSettings,
    dwell_group,
)


class PolicySettings(ServiceSettings, TrackerClientSettings, CommonSettings):
    http_port: int = Field(endpoints.POLICY_PORT, ge=1, le=65535,
                           description="The service's HTTP port.")
    max_request_bytes: int = Field(1024 * 1024, ge=1024, description=(
        "A request body above this is answered 413 before it is read whole."))
    # It must stay below the broker's message.max.bytes for dwell.policies, since the feed
    # must carry every record.
    max_policy_record_bytes: int = Field(512 * 1024, ge=1024, description=(
        "A policy record (a tenant, a namespace with its permissions, a policy) above this "
        "is refused with 413 before anything is stored. Keep it below the broker's "
        "`message.max.bytes` for `dwell.policies`."))
    feed_timeout_ms: int = Field(5000, ge=100, description=(
        "How long an admin call waits for Kafka to acknowledge its change-feed record "
        "before answering 503 (the change stays saved and is published once Kafka is back)."))
    feed_sync_interval_ms: int = Field(5000, ge=100, description=(
        "How often what the feed missed while Kafka was down is published again."))
    store_check_interval_ms: int = Field(1000, ge=50, description=(
        "Losing Redis: how often the store's epoch and version are checked between calls "
        "(`dwell.policy.rebuild`)."))
    store_rebuild_timeout_ms: int = Field(10000, ge=1000, description=(
        "Losing Redis: how long a call waits for the store's rebuild before its 503."))
    policy_audit_group: str = Field(
        "dwell-policy-audit", json_schema_extra=GROUP_SCHEMA, description=(
            "Consumer group under which the replicas audit `dwell.policies`, setting aside "
            "once each record the followers cannot apply; must start with `dwell-`."))

    @field_validator("policy_audit_group")
    @classmethod
    def _dwell_group(cls, group: str) -> str:
        return dwell_group("DWELL_POLICY_AUDIT_GROUP", group)
