"""Where dwell's processes listen by default and how a client finds each: the one module
that spells their ports and local addresses (tests/unit/test_endpoints.py fails on a
second spelling under services/ or spark/). A client takes an address given to it, else
the environment variable named here, else the local default."""

from __future__ import annotations

import os
from typing import Final

LOCAL: Final = "127.0.0.1"
POLICY_PORT: Final = 8081
ADMISSION_PORT: Final = 8082
TRACKER_PORT: Final = 8083
SPARK_METRICS_PORT: Final = 8084
KAFKA_PORT: Final = 9092
# The in-chart and local Kafka's KRaft controller listener (no client connects to it).
KAFKA_CONTROLLER_PORT: Final = 9093
REDIS_PORT: Final = 6379

POLICY_URL: Final = f"http://{LOCAL}:{POLICY_PORT}"
ADMISSION_URL: Final = f"http://{LOCAL}:{ADMISSION_PORT}"
TRACKER_URL: Final = f"http://{LOCAL}:{TRACKER_PORT}"
KAFKA_BOOTSTRAP: Final = f"{LOCAL}:{KAFKA_PORT}"
REDIS_URL: Final = f"redis://{LOCAL}:{REDIS_PORT}/0"

# The environment variables a client reads (the services' own settings use the same).
POLICY_URL_ENV: Final = "DWELL_POLICY_URL"
ADMISSION_URL_ENV: Final = "DWELL_ADMISSION_URL"
TRACKER_URL_ENV: Final = "DWELL_TRACKER_URL"
KAFKA_BOOTSTRAP_ENV: Final = "DWELL_KAFKA_BOOTSTRAP"


def _find(given: str | None, env: str, default: str) -> str:
    return given or os.environ.get(env) or default


def policy_url(given: str | None = None) -> str:
    return _find(given, POLICY_URL_ENV, POLICY_URL)


def admission_url(given: str | None = None) -> str:
    return _find(given, ADMISSION_URL_ENV, ADMISSION_URL)


def tracker_url(given: str | None = None) -> str:
    return _find(given, TRACKER_URL_ENV, TRACKER_URL)


def kafka_bootstrap(given: str | None = None) -> str:
    return _find(given, KAFKA_BOOTSTRAP_ENV, KAFKA_BOOTSTRAP)
