"""The admission service's settings (`DWELL_*` environment variables)."""

from __future__ import annotations

import socket

from pydantic import Field, field_validator

from dwell.settings import GROUP_SCHEMA, CommonSettings, dwell_group


class AdmissionSettings(CommonSettings):
    http_port: int = Field(8082, ge=1, le=65535)

    # Request limits (HTTP and Kafka ingress alike). max_request_bytes caps a request's
    # body as sent (JSON, payloads base64-encoded or not): a bigger HTTP body is refused
    # with 413 before it is read whole, a bigger dwell.publish record is refused as a
    # request. Its default leaves room for one max_payload_bytes payload in base64 (4/3).
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_payload_bytes: int = Field(5 * 1024 * 1024, ge=1)
    max_messages_per_request: int = Field(1000, ge=1)

    # Pulsar's allowAutoTopicCreation: a publish to a topic whose ready topic does not
    # exist creates it; false answers 404 `Topic persistent://t/ns/x not found` instead
    # (topics are then created through the policy service's topic routes).
    allow_auto_topic_creation: bool = True
    # Partitions of the Kafka topics admission creates on first use.
    ready_topic_partitions: int = Field(4, ge=1)
    delayed_topic_partitions: int = Field(4, ge=1)

    # Producer: batching and how long an unacknowledged send may take before the
    # publish answers 503 (retriable). A publish waits for its acks, so the linger is
    # latency every request pays, and a client waiting longer sends less.
    producer_linger_ms: int = Field(1, ge=0)
    publish_timeout_ms: int = Field(10000, ge=1000)

    # Policy feed replay: give up (and stay unready, retrying) after this long.
    policy_replay_timeout_s: float = Field(60.0, gt=0)
    # Read your writes: a publish to a namespace unknown here first waits, at most this
    # long, until the policy feed is applied up to its current end; then 404, or 503
    # when the feed could not be caught up with in time.
    policy_catch_up_timeout_ms: int = Field(2000, ge=100)

    # Kafka ingress (consumer group on dwell.publish).
    ingress_enabled: bool = True
    ingress_group: str = Field("dwell-admission", json_schema_extra=GROUP_SCHEMA)
    ingress_offset_reset: str = "earliest"
    ingress_max_batch: int = Field(200, ge=1)
    # Stable per replica so that a restarted replica fences its predecessor's open
    # transaction at once instead of leaving read_committed readers waiting for
    # transaction_timeout_ms. Empty: "dwell-admission-<hostname>-<http_port>".
    ingress_transactional_id: str = ""
    ingress_transaction_timeout_ms: int = Field(10000, ge=1000)

    @field_validator("ingress_group")
    @classmethod
    def _dwell_group(cls, group: str) -> str:
        return dwell_group("DWELL_INGRESS_GROUP", group)

    def transactional_id(self) -> str:
        return self.ingress_transactional_id or (
            f"dwell-admission-{socket.gethostname()}-{self.http_port}")
