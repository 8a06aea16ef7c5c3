"""The policy service's Prometheus metrics, all declared here."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CHANGES = Counter("dwell_policy_changes_total", "Policy store changes, by kind", ["kind"])
VERSION = Gauge("dwell_policy_version", "Latest version of the policy store")
REBUILDS = Counter("dwell_policy_store_rebuilds_total",
                   "Rebuilds of the policy store from dwell.policies, by reason", ["reason"])
REBUILD_SECONDS = Histogram("dwell_policy_store_rebuild_seconds",
                            "How long a rebuild of the policy store took",
                            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
