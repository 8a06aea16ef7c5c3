"""The connection properties every client of the adapter starts from."""

from __future__ import annotations

from typing import Any

from dwell.security import librdkafka_config

# How often a client asks again for the metadata of the topics it uses (librdkafka's
# default: 5 minutes): partitions added to a topic (`update-partitioned-topic`) are written
# by every producer and read by every consumer of it within this long.
METADATA_REFRESH_MS = 10_000


def connection(bootstrap: str) -> dict[str, Any]:
    """`bootstrap.servers` plus the SASL/TLS properties of the DWELL_KAFKA_* settings."""
    return {"bootstrap.servers": bootstrap,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
            **librdkafka_config()}
