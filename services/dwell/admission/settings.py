"""The admission service's settings (`DWELL_*` environment variables)."""

from __future__ import annotations

import socket

from pydantic import Field, field_validator

from dwell import endpoints
from dwell.settings import (
    GROUP_SCHEMA,
    CommonSettings,
    ReadyTopicSettings,
    ServiceSettings,
    TrackerClientSettings,
    dwell_group,
)


class AdmissionSettings(ServiceSettings, ReadyTopicSettings, TrackerClientSettings,
                        CommonSettings):
    http_port: int = Field(endpoints.ADMISSION_PORT, ge=1, le=65535,
                           description="The service's HTTP port.")

    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024, description=(
        "A request's body as sent (JSON, payloads base64-encoded or not), HTTP and Kafka "
        "ingress alike: a bigger HTTP body is 413 before it is read whole, a bigger "
        "`dwell.publish` record is refused. The default leaves room for one "
        "`DWELL_MAX_PAYLOAD_BYTES` payload in base64."))
    max_payload_bytes: int = Field(5 * 1024 * 1024, ge=1, description=(
        "Pulsar's `maxMessageSize`: the largest message payload, counted after base64 "
        "decoding (more is 400)."))
    max_messages_per_request: int = Field(1000, ge=1, description=(
        "The most messages one publish request may carry (more is 400)."))

    producer_linger_ms: int = Field(1, ge=0, description=(
        "The producer's batching linger. A publish waits for its acks, so every request "
        "pays it; a longer one sends less per wait."))
    publish_timeout_ms: int = Field(10000, ge=1000, description=(
        "How long an unacknowledged send may take before the publish answers 503 "
        "(retriable)."))

    policy_replay_timeout_s: float = Field(60.0, gt=0, description=(
        "How long the start-up replay of the policy feed may take before the service "
        "gives up for now (it stays unready and retries)."))
    policy_catch_up_timeout_ms: int = Field(2000, ge=100, description=(
        "Read your writes: a publish to a namespace unknown here first waits at most this "
        "long for the policy feed to be applied up to its current end; then 404, or 503 "
        "when the feed could not be caught up with in time."))

    ingress_enabled: bool = Field(True, description=(
        "Take publish requests from Kafka too (a consumer group on `dwell.publish`)."))
    ingress_group: str = Field("dwell-admission", json_schema_extra=GROUP_SCHEMA, description=(
        "The Kafka ingress's consumer group; must start with `dwell-`."))
    ingress_offset_reset: str = Field("earliest", description=(
        "Where the ingress group starts without a committed offset (`earliest`, `latest`)."))
    ingress_max_batch: int = Field(200, ge=1, description=(
        "Requests taken from `dwell.publish` per poll, each batch one Kafka transaction."))
    ingress_transactional_id: str = Field("", description=(
        "The ingress producer's transactional id, stable per replica so that a restarted "
        "replica fences its predecessor's open transaction at once. Empty: "
        "`dwell-admission-<hostname>-<http_port>`."))
    ingress_transaction_timeout_ms: int = Field(10000, ge=1000, description=(
        "How long an open ingress transaction may hold `read_committed` readers back if "
        "its replica dies without a successor of the same id."))

    @field_validator("ingress_group")
    @classmethod
    def _dwell_group(cls, group: str) -> str:
        return dwell_group("DWELL_INGRESS_GROUP", group)

    def transactional_id(self) -> str:
        return self.ingress_transactional_id or (
            f"dwell-admission-{socket.gethostname()}-{self.http_port}")
