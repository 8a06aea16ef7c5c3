"""The policy service's HTTP API: Pulsar's admin paths and JSON for tenants, namespaces
and delayed-delivery policies (namespace and topic level).

Every change is saved in Redis (dwell.policy.store) and then put on `dwell.policies`
(dwell.policy.feed) before the call returns, which is what lets admission read its writes
(docs/internals.md, "Read your writes"): a publish to a namespace admission does not know
yet waits until admission has applied the feed up to where it is now. When Kafka does not
acknowledge, the answer is 503: the change is saved and the feed catches up once Kafka is
back. When Redis loses data around a write (before it: the write script refuses; after it,
before its record reached the feed), the store is rebuilt from the feed and the write made
once more (dwell.policy.rebuild, docs/internals.md "Losing Redis").

Responses (the JSON shapes):
- `GET /admin/v2/clusters` → `["standalone"]` (the `cluster` setting);
  `GET /admin/v2/tenants` → `["t1", ...]`; `GET /admin/v2/tenants/{t}` → TenantInfo
  `{"adminRoles": [...], "allowedClusters": [...]}`.
- `GET /admin/v2/namespaces/{t}` → `["t/ns", ...]`;
  `GET /admin/v2/namespaces/{t}/{ns}` → Pulsar's Policies (dwell.core.policy.pulsar_policies).
- `GET .../delayedDelivery` → the policy as set (only the fields that were set; unset
  fields inherit) or `null`; a topic has a local and a global (`isGlobal=true`) one. With
  `applied=true` → every field, resolved field by field: topic local → topic global →
  namespace → broker defaults.
- Writes answer 204; errors answer `{"reason": ...}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from dwell.adapters import kafka
from dwell.adapters.redis import connect_async
from dwell.auth.guard import Guard
from dwell.http import ApiError, BodyLimit, create_app, error
from dwell.policy.audit import FeedAudit
from dwell.policy.feed import PolicyFeed
from dwell.policy.metrics import VERSION
from dwell.policy.rebuild import StoreGuard
from dwell.policy.routes import ROUTERS
from dwell.policy.service import PolicyService
from dwell.policy.settings import PolicySettings
from dwell.policy.store import Exists, InUse, Missing, PolicyStore, Refused, TooLarge
from dwell.policy.topics import TopicCatalog
from dwell.policy.tracker import Tracker
from dwell.security import http_verify

log = logging.getLogger("dwell.policy.app")

# The status each kind of the store's refusal is answered with, as Pulsar answers it.
REFUSALS: dict[type[Refused], int] = {Missing: 404, Exists: 409, InUse: 409, TooLarge: 413}


def build_app(settings: PolicySettings) -> FastAPI:
    feed: PolicyFeed
    # Writes refuse while the store's counter is below what the feed carries (rebuild.py).
    store = PolicyStore(connect_async(settings.redis_url),
                        floor=lambda: feed.highest_version,
                        max_record_bytes=settings.max_policy_record_bytes)
    feed = PolicyFeed(store, settings.kafka_bootstrap,
                      replication=settings.kafka_replication_factor,
                      timeout_ms=settings.feed_timeout_ms,
                      compression_type=settings.kafka_compression_type,
                      max_record_bytes=settings.max_policy_record_bytes)
    guard = StoreGuard(store, feed, settings.kafka_bootstrap,
                       timeout_ms=settings.store_rebuild_timeout_ms)
    tracker_http = httpx.AsyncClient(base_url=settings.tracker_url, timeout=5.0,
                                     verify=http_verify(settings))
    service = PolicyService(
        settings, store, feed, guard,
        TopicCatalog(settings.kafka_bootstrap, settings.kafka_replication_factor, store),
        Tracker(tracker_http))
    auth = Guard(settings, store.grants)

    async def ready() -> dict[str, Any]:
        try:
            redis_ok = await store.ping()
        except redis.exceptions.RedisError:
            redis_ok = False
        kafka_ok = await asyncio.to_thread(kafka.ping, settings.kafka_bootstrap, 1.0)
        # Ready also means the startup catch-up ran: the feed carries what Redis holds.
        return {"ready": redis_ok and kafka_ok and feed.synced and not guard.rebuilding,
                "redis": redis_ok, "kafka": kafka_ok, "rebuildingStore": guard.rebuilding}

    app = create_app(
        "dwell policy",
        "Tenants, namespaces and Pulsar delayed-delivery policies (namespace and topic), "
        "with Pulsar's admin paths and JSON. Unset policy fields inherit field by field: "
        "topic → namespace → broker defaults.",
        ready, metrics_access=auth.check_metrics)
    # What the routes (dwell.policy.routes) take as their dependencies.
    app.state.policy = service
    app.state.guard = auth

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        with contextlib.suppress(redis.exceptions.RedisError):
            VERSION.set(await store.version())
        tasks = [asyncio.create_task(feed.run(settings.feed_sync_interval_ms / 1000)),
                 asyncio.create_task(guard.run(settings.store_check_interval_ms / 1000))]
        audit = FeedAudit(settings.kafka_bootstrap, settings.policy_audit_group,
                          settings.broker_defaults(), settings.max_policy_record_bytes)
        audit.start()
        try:
            yield
        finally:
            audit.stop()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            feed.close()
            await store.redis.aclose()
            await tracker_http.aclose()

    app.router.lifespan_context = lifespan

    @app.middleware("http")
    async def _store_current(request: Request, call_next: Any) -> Response:
        # Every admin call reads or writes a store that holds what the feed holds.
        if request.url.path.startswith("/admin/"):
            try:
                await guard.ensure()
            except ApiError as exc:
                return error(exc.status, exc.reason, exc.headers)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                return error(503, f"policy store (Redis) unavailable: {exc}")
        response: Response = await call_next(request)
        return response

    # Added after the middleware above, so it runs first: an oversized request is refused
    # before it costs a store check.
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes,
                       setting="max_request_bytes")

    @app.exception_handler(Refused)
    async def _refused(_: Request, exc: Refused) -> JSONResponse:
        return error(REFUSALS[type(exc)], exc.reason)

    @app.exception_handler(redis.exceptions.ConnectionError)
    @app.exception_handler(redis.exceptions.TimeoutError)
    async def _redis_down(_: Request, exc: Exception) -> JSONResponse:
        return error(503, f"policy store (Redis) unavailable: {exc}")

    for router in ROUTERS:
        app.include_router(router)
    return app
