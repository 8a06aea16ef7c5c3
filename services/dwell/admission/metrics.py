"""Admission's Prometheus metrics: the PIP counters per topic, dwell's publish counters,
the publish-latency histogram and the policy version this replica has applied."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DELAYED_REJECTED = Counter(
    "pulsar_broker_topic_messages_delayed_rejected",
    "Messages refused because their delay exceeds the topic's max (PIP-315).",
    ["cluster", "namespace", "topic"],
)
FIXED_DELAY_OVERRIDDEN = Counter(
    "pulsar_broker_topic_messages_fixed_delay_overridden",
    "Messages whose producer deliverAt was replaced by the fixed delay (PIP-437).",
    ["cluster", "namespace", "topic"],
)
MESSAGES = Counter(
    "dwell_admission_messages",
    "Messages handled by admission, by outcome (immediate, delayed, rejected, invalid, "
    "unavailable) and entry path (http, kafka).",
    ["outcome", "path"],
)
REQUESTS = Counter(
    "dwell_admission_requests",
    "Publish requests by entry path and answer status (HTTP status code semantics).",
    ["path", "status"],
)
PUBLISH_LATENCY = Histogram(
    "dwell_admission_publish_latency_seconds",
    "Time from receiving a publish request to every accepted message being acknowledged.",
    ["path"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
INVALID_RECORDS = Counter(
    "dwell_invalid_records",
    "Malformed records set aside on dwell.invalid, by the topic they were read from and "
    "kind (dwell.core.invalid.KINDS).",
    ["source", "kind"],
)
INGRESS_BATCHES_FAILED = Counter(
    "dwell_admission_ingress_batches_failed",
    "Batches of dwell.publish whose transaction was aborted and the batch read again "
    "(Kafka did not take its records, results or offsets).",
)
POLICY_VERSION_APPLIED = Gauge(
    "dwell_policy_version_applied",
    "Highest dwell.policies version this admission replica has applied.",
)
