"""The policy service's routes, one `APIRouter` per resource, in the order the app includes
them. Each route takes what it works with as dependencies: the `Service`
(dwell.policy.service) and its guard (`dwell.auth.guard.requires`)."""

from __future__ import annotations

from fastapi import APIRouter

from dwell.policy.routes import (
    clusters,
    kafka_tokens,
    limits,
    namespaces,
    permissions,
    stats,
    tenants,
    topic_policies,
    topics,
)

ROUTERS: tuple[APIRouter, ...] = (
    clusters.router, tenants.router, namespaces.router, topics.router, topic_policies.router,
    permissions.router, kafka_tokens.router, limits.router, stats.router)
