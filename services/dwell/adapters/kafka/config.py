"""The connection properties every client of the adapter starts from."""

from __future__ import annotations

from typing import Any

from dwell.security import librdkafka_config


def connection(bootstrap: str) -> dict[str, Any]:
    """`bootstrap.servers` plus the SASL/TLS properties of the DWELL_KAFKA_* settings."""
    return {"bootstrap.servers": bootstrap, **librdkafka_config()}
