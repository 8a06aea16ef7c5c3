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
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import httpx
import orjson
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from dwell.adapters import kafka
from dwell.adapters.redis import connect_async
from dwell.auth.guard import Guard
from dwell.core.authz import Operation as Op
from dwell.core.policy import DelayedDeliveryPolicies, pulsar_policies, resolve_policy
from dwell.core.topics import (
    NON_PERSISTENT,
    PARTITION_SUFFIX,
    PERSISTENT,
    POLICIES,
    TopicName,
)
from dwell.http import ApiError, BodyLimit, create_app, error, errors
from dwell.index.subscriptions import names_of as subscription_names
from dwell.policy import kafka_tokens, limits, permissions, stats
from dwell.policy.audit import FeedAudit
from dwell.policy.feed import FeedUnavailable, PolicyFeed
from dwell.policy.metrics import CHANGES, VERSION
from dwell.policy.rebuild import StoreGuard
from dwell.policy.requests import (
    POLICY_BODY,
    TENANT_BODY,
    check_tenant_info,
    namespace_body,
    namespace_name,
    partitions_body,
    policy_body,
    policy_topic,
    tenant_body,
    tenant_name,
    topic_name,
    topic_not_found,
)
from dwell.policy.settings import PolicySettings
from dwell.policy.store import (
    NAMESPACE_NOT_EMPTY,
    Change,
    PolicyStore,
)
from dwell.policy.topics import TopicCatalog
from dwell.policy.tracker import Tracker
from dwell.security import http_verify

log = logging.getLogger("dwell.policy.app")

def _json(value: Any) -> Response:
    return Response(orjson.dumps(value), media_type="application/json")


def _own(policy: DelayedDeliveryPolicies | None) -> Response:
    return _json(policy.model_dump(exclude_none=True) if policy is not None else None)


NO_CONTENT = 204


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
    broker = settings.broker_defaults()
    delay_limit = settings.delayed_delivery_delay_limit_ms
    catalog = TopicCatalog(settings.kafka_bootstrap, settings.kafka_replication_factor, store)
    tracker_http = httpx.AsyncClient(base_url=settings.tracker_url, timeout=5.0,
                                     verify=http_verify(settings))
    tracker = Tracker(tracker_http)

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

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        with contextlib.suppress(redis.exceptions.RedisError):
            VERSION.set(await store.version())
        tasks = [asyncio.create_task(feed.run(settings.feed_sync_interval_ms / 1000)),
                 asyncio.create_task(guard.run(settings.store_check_interval_ms / 1000))]
        audit = FeedAudit(settings.kafka_bootstrap, settings.policy_audit_group, broker,
                          settings.max_policy_record_bytes)
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

    @app.exception_handler(redis.exceptions.ConnectionError)
    @app.exception_handler(redis.exceptions.TimeoutError)
    async def _redis_down(_: Request, exc: Exception) -> JSONResponse:
        return error(503, f"policy store (Redis) unavailable: {exc}")

    async def commit(kind: str, *writes: Callable[[], Awaitable[list[Change]]]) -> Response:
        """Run the call's store writes in order, each one's changes published before the
        next runs, so that Redis losing data between two of them loses none the call made."""
        changed = False
        for write in writes:
            changed |= bool(await publish(write))
        if changed:
            CHANGES.labels(kind).inc()
        return Response(status_code=NO_CONTENT)

    async def publish(write: Callable[[], Awaitable[list[Change]]]) -> list[Change]:
        """Make one write and put its changes on the feed. A change the feed does not carry
        afterwards was lost by Redis between the write and its publishing (publish sends
        what the store holds): the write is made again, once, on the rebuilt store."""
        for _ in range(2):
            changes = await guard.write(write)
            for scope, _ in changes:
                try:
                    await feed.publish(scope)
                except FeedUnavailable as exc:
                    raise ApiError(503, "the change is saved, but the change feed (Kafka) did "
                                        f"not acknowledge it: {exc}; it is published once "
                                        "Kafka is back") from exc
            if all(feed.carried(scope) >= version for scope, version in changes):
                if changes:
                    VERSION.set(max(version for _, version in changes))
                return changes
            log.warning("Redis lost a change before it reached %s: making it again",
                        POLICIES)
        raise ApiError(503, "Redis lost the change twice before it reached the change feed "
                            f"({POLICIES}); try again", {"Retry-After": "1"})

    # -- clusters: dwell is one cluster, named by the `cluster` setting

    @app.get("/admin/v2/clusters", tags=["clusters"],
             dependencies=[auth.require(Op.LIST_CLUSTERS)])
    async def list_clusters() -> list[str]:
        return [settings.cluster]

    # `pulsar-admin clusters list` reads clusterName here to mark the current cluster.
    # Values are strings, as Pulsar sends them; only the settings dwell has are listed.
    runtime_config = {
        "clusterName": settings.cluster,
        "delayedDeliveryEnabled": str(broker.enabled).lower(),
        "delayedDeliveryTickTimeMillis": str(broker.tick_time_ms),
        "delayedDeliveryMaxDelayInMillis": str(broker.max_delay_ms),
        "isDelayedDeliveryDeliverAtTimeStrict": str(broker.strict).lower(),
        "delayedDeliveryFixedDelayDetectionLookahead": str(broker.fixed_delay_detection_lookahead),
    }

    @app.get("/admin/v2/brokers/configuration/runtime", tags=["clusters"],
             dependencies=[auth.require(Op.GET_RUNTIME_CONFIGURATION)])
    async def runtime_configuration() -> dict[str, str]:
        return runtime_config

    # -- tenants

    @app.get("/admin/v2/tenants", tags=["tenants"],
             dependencies=[auth.require(Op.LIST_TENANTS)])
    async def list_tenants() -> list[str]:
        return await store.list_tenants()

    @app.put("/admin/v2/tenants/{tenant}", status_code=NO_CONTENT, tags=["tenants"],
             openapi_extra=TENANT_BODY,
             dependencies=[auth.require(Op.CREATE_TENANT)],
             responses=errors(409, 412))
    async def create_tenant(tenant: str, request: Request) -> Response:
        name = tenant_name(tenant, new=True)
        info = check_tenant_info(await tenant_body(request), settings.cluster)
        return await commit("tenant_create", lambda: store.create_tenant(name, info))

    @app.post("/admin/v2/tenants/{tenant}", status_code=NO_CONTENT, tags=["tenants"],
              openapi_extra=TENANT_BODY,
              dependencies=[auth.require(Op.UPDATE_TENANT)],
              responses=errors(404, 412))
    async def update_tenant(tenant: str, request: Request) -> Response:
        name = tenant_name(tenant)
        info = check_tenant_info(await tenant_body(request), settings.cluster)
        return await commit("tenant_update", lambda: store.update_tenant(name, info))

    @app.get("/admin/v2/tenants/{tenant}", tags=["tenants"],
             dependencies=[auth.require(Op.GET_TENANT)],
             responses=errors(404, 412))
    async def get_tenant(tenant: str) -> Response:
        return _json((await store.get_tenant(tenant_name(tenant))).model_dump())

    @app.delete("/admin/v2/tenants/{tenant}", status_code=NO_CONTENT, tags=["tenants"],
                dependencies=[auth.require(Op.DELETE_TENANT)],
                responses=errors(404, 409, 412))
    async def delete_tenant(tenant: str) -> Response:
        name = tenant_name(tenant)
        return await commit("tenant_delete", lambda: store.delete_tenant(name))

    # -- namespaces

    @app.get("/admin/v2/namespaces/{tenant}", tags=["namespaces"],
             dependencies=[auth.require(Op.LIST_NAMESPACES)],
             responses=errors(404, 412))
    async def list_namespaces(tenant: str) -> list[str]:
        return await store.list_namespaces(tenant_name(tenant))

    @app.put("/admin/v2/namespaces/{tenant}/{namespace}", status_code=NO_CONTENT,
             tags=["namespaces"],
             dependencies=[auth.require(Op.CREATE_NAMESPACE)],
             responses=errors(404, 409, 412))
    async def create_namespace(tenant: str, namespace: str, request: Request) -> Response:
        ns = namespace_name(tenant, namespace)
        policy = await namespace_body(request, delay_limit)
        if policy is None:
            return await commit("namespace_create", lambda: store.create_namespace(ns))
        return await commit("namespace_create", lambda: store.create_namespace(ns),
                            lambda: store.set_namespace_policy(ns, policy))

    @app.get("/admin/v2/namespaces/{tenant}/{namespace}", tags=["namespaces"],
             dependencies=[auth.require(Op.GET_NAMESPACE_POLICIES)],
             responses=errors(404, 412))
    async def get_namespace(tenant: str, namespace: str) -> Response:
        """Pulsar's Policies of the namespace (`pulsar-admin namespaces policies`)."""
        ns = namespace_name(tenant, namespace)
        record = await store.namespace_fields(ns)
        ns_policy = await store.namespace_policy(ns)
        return _json(pulsar_policies(record, ns_policy.model_dump(exclude_none=True)
                                     if ns_policy is not None else None, settings.cluster))

    @app.delete("/admin/v2/namespaces/{tenant}/{namespace}", status_code=NO_CONTENT,
                tags=["namespaces"],
                dependencies=[auth.require(Op.DELETE_NAMESPACE)],
                responses=errors(404, 409, 412))
    async def delete_namespace(tenant: str, namespace: str) -> Response:
        ns = namespace_name(tenant, namespace)
        for domain in (PERSISTENT, NON_PERSISTENT):
            if await catalog.in_namespace(domain, ns):
                raise ApiError(409, NAMESPACE_NOT_EMPTY)
        # With no topic left, a topic record left is of a topic gone from Kafka by other
        # means, or a partitioned create cut short: it goes with the namespace.
        stale = [TopicName.parse(name) for name in await store.recorded_topics(ns)]
        return await commit("namespace_delete",
                            *[partial(store.drop_topic_policies, t) for t in stale],
                            lambda: store.delete_namespace(ns))

    # -- namespace delayed-delivery policy

    ns_path = "/admin/v2/namespaces/{tenant}/{namespace}/delayedDelivery"

    @app.get(ns_path, tags=["delayed delivery"],
             dependencies=[auth.require(Op.GET_NAMESPACE_POLICIES)],
             responses=errors(404, 412))
    async def get_namespace_policy(tenant: str, namespace: str, applied: bool = False,
                                   isGlobal: bool = False) -> Response:
        ns_policy = await store.namespace_policy(namespace_name(tenant, namespace))
        if applied:
            return _json(resolve_policy(broker, ns_policy, None).to_pulsar_json())
        return _own(ns_policy)

    @app.post(ns_path, status_code=NO_CONTENT, tags=["delayed delivery"],
              openapi_extra=POLICY_BODY,
              dependencies=[auth.require(Op.SET_NAMESPACE_POLICIES)],
              responses=errors(404, 412))
    async def set_namespace_policy(tenant: str, namespace: str, request: Request) -> Response:
        ns = namespace_name(tenant, namespace)
        policy = await policy_body(request, delay_limit)
        return await commit("namespace_policy_set",
                            lambda: store.set_namespace_policy(ns, policy))

    @app.delete(ns_path, status_code=NO_CONTENT, tags=["delayed delivery"],
                dependencies=[auth.require(Op.SET_NAMESPACE_POLICIES)],
                responses=errors(404, 412))
    async def remove_namespace_policy(tenant: str, namespace: str) -> Response:
        ns = namespace_name(tenant, namespace)
        return await commit("namespace_policy_remove",
                            lambda: store.remove_namespace_policy(ns))

    # -- topics: Kafka ready topics (dwell.policy.topics)

    async def _listing(domain: str, tenant: str, namespace: str) -> list[str]:
        ns = namespace_name(tenant, namespace)
        await store.namespace_policy(ns)  # 404 when the namespace does not exist
        return await catalog.listing(domain, ns)

    @app.get("/admin/v2/persistent/{tenant}/{namespace}", tags=["topics"],
             dependencies=[auth.require(Op.GET_TOPICS)],
             responses=errors(404, 412))
    async def list_topics(tenant: str, namespace: str) -> list[str]:
        return await _listing(PERSISTENT, tenant, namespace)

    @app.get("/admin/v2/non-persistent/{tenant}/{namespace}", tags=["topics"],
             dependencies=[auth.require(Op.GET_TOPICS)],
             responses=errors(404, 412))
    async def list_non_persistent_topics(tenant: str, namespace: str) -> list[str]:
        return await _listing(NON_PERSISTENT, tenant, namespace)

    async def _partitioned(domain: str, tenant: str, namespace: str) -> list[str]:
        ns = namespace_name(tenant, namespace)
        await store.namespace_policy(ns)
        return await catalog.partitioned(domain, ns)

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/partitioned", tags=["topics"],
             dependencies=[auth.require(Op.GET_TOPICS)],
             responses=errors(404, 412))
    async def list_partitioned_topics(tenant: str, namespace: str) -> list[str]:
        return await _partitioned(PERSISTENT, tenant, namespace)

    @app.get("/admin/v2/non-persistent/{tenant}/{namespace}/partitioned", tags=["topics"],
             dependencies=[auth.require(Op.GET_TOPICS)],
             responses=errors(404, 412))
    async def list_non_persistent_partitioned_topics(tenant: str, namespace: str) -> list[str]:
        return await _partitioned(NON_PERSISTENT, tenant, namespace)

    topic_base = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"

    @app.put(topic_base, status_code=NO_CONTENT, tags=["topics"],
             dependencies=[auth.require(Op.CREATE_TOPIC)],
             responses=errors(404, 409, 412))
    async def create_topic(tenant: str, namespace: str, topic: str) -> Response:
        name = topic_name(tenant, namespace, topic)
        await store.namespace_policy(name.namespace_name)
        index = name.partition_index
        if index >= 0:
            # Pulsar creates a partition only of a partitioned topic that has it; here
            # every partition of an existing partitioned topic exists with it.
            parent = name.partitioned_topic
            count, partitioned = await catalog.layout(parent)
            suffix = f"Can't create topic {name} with \"{PARTITION_SUFFIX}\" followed by"
            if not partitioned:
                raise ApiError(412, f"{suffix} numeric value if there isn't a partitioned "
                                    f"topic {parent.local} created.")
            if index >= count:
                raise ApiError(412, f"{suffix} a number smaller than number of partition of "
                                    f"partitioned topic {parent.local}")
            raise ApiError(409, "This topic already exists")
        return await create(name, 1)

    @app.put(topic_base + "/partitions", status_code=NO_CONTENT, tags=["topics"],
             dependencies=[auth.require(Op.CREATE_TOPIC)],
             responses=errors(404, 406, 409, 412))
    async def create_partitioned_topic(tenant: str, namespace: str, topic: str,
                                       request: Request) -> Response:
        name = topic_name(tenant, namespace, topic)
        partitions = await partitions_body(request)
        if PARTITION_SUFFIX in name.local:
            raise ApiError(412, "Partitioned Topic Name should not contain '-partition-'")
        await store.namespace_policy(name.namespace_name)
        return await create(name, partitions, partitioned=True)

    creating = limits.CreateLocks()

    @app.post(topic_base + "/partitions", status_code=NO_CONTENT, tags=["topics"],
              dependencies=[auth.require(Op.SET_TOPIC_POLICIES)],
              responses=errors(409, 412, 422))
    async def update_partitioned_topic(tenant: str, namespace: str, topic: str,
                                       request: Request, force: bool = False,
                                       updateLocalTopicOnly: bool = False) -> Response:
        """Pulsar's `topics update-partitioned-topic`: grow a partitioned topic's ready
        topic to N Kafka partitions (PersistentTopicsBase.internalUpdatePartitionedTopic).
        `force` and `updateLocalTopicOnly` change nothing here: a partition is a Kafka
        partition, so no stray partition topic can exist, and there is one cluster."""
        name = topic_name(tenant, namespace, topic)
        if name.partition_index >= 0:
            raise ApiError(412, "Partitioned Topic Name should not contain '-partition-'")
        total = await partitions_body(request, at_least=None)
        async with creating(name.namespace_name):
            count, partitioned = await catalog.layout(name)
            if not partitioned:
                raise ApiError(409, f"Topic {name} is not the partitioned topic.")
            if total < count:
                raise ApiError(422, f"Desired partitions {total} can't be less than the "
                                    f"current partitions {count}.")
            await limits.check_growth(store, catalog, settings.broker_limits(), name,
                                      count, total)
            if total > count:
                await catalog.grow(name, count, total)
        return Response(status_code=NO_CONTENT)

    async def create(name: TopicName, partitions: int, partitioned: bool = False) -> Response:
        """Create the topic's ready topic. Whether one Kafka partition is a partitioned
        topic's is in the topic's record, written first: a create cut short leaves a mark
        on no topic, which the next create of the name sets right."""
        if await catalog.partitions(name):
            raise ApiError(409, "This topic already exists")
        async with creating(name.namespace_name):
            await limits.check_create(store, catalog, settings.broker_limits(), name,
                                      partitions)
            one = partitioned and partitions == 1
            if (await store.topic_policies(name))[1].partitioned != one:
                await commit("topic_partitioned", lambda: store.mark_partitioned(name, one))
            if not await catalog.create(name, partitions):
                raise ApiError(409, "This topic already exists")
        return Response(status_code=NO_CONTENT)

    @app.get(topic_base + "/partitions", tags=["topics"],
             dependencies=[auth.require(Op.LOOKUP)],
             responses=errors(412))
    async def get_partitioned_metadata(tenant: str, namespace: str, topic: str) -> Response:
        count, partitioned = await catalog.layout(topic_name(tenant, namespace, topic))
        return _json({"partitions": count if partitioned else 0})

    async def _delete(name: TopicName, partitioned: bool, force: bool,
                      request: Request) -> Response:
        """Pulsar's two deletes, each refusing the other's kind of topic with 409
        (PersistentTopics.deleteTopic and deletePartitionedTopic), and, unless `force`, a
        topic that has subscriptions with 412: those in the tracker's subscription
        registry (on the topic or, partitioned, on a partition) and the Kafka consumer
        groups reading its ready topic. A forced delete removes the registered ones first,
        through the tracker (its registry's log keeps them otherwise)."""
        count, is_partitioned = await catalog.layout(name)
        if count and is_partitioned != partitioned:
            raise ApiError(409, f"{name} is a partitioned topic, instead of calling delete "
                                "topic, please call delete-partitioned-topic." if is_partitioned
                           else f"{name} is a non-partitioned topic. Instead of calling "
                                "delete-partitioned-topic please call delete.")
        not_found = ApiError(404, f"{topic_not_found(name)}." if partitioned
                             else topic_not_found(name))
        if count == 0:
            raise not_found
        authorization = request.headers.get("authorization")
        topics = [name, *(name.partition(i) for i in range(count))] if partitioned else [name]
        registered = {t: found for t in topics
                      if (found := await subscription_names(store.redis, str(t)))}
        if not force:
            subs = sorted({s for found in registered.values() for s in found}
                          | await catalog.consumer_groups(name))
            if subs:
                raise ApiError(412, "Topic has active producers/subscriptions" if partitioned
                               else f"Topic has subscriptions: [{', '.join(subs)}]")
        for t, found in registered.items():
            for sub in found:
                await tracker.unsubscribe(t, sub, authorization)
        if not await catalog.delete(name):
            raise not_found
        return await commit("topic_policy_remove", lambda: store.drop_topic_policies(name))

    @app.delete(topic_base, status_code=NO_CONTENT, tags=["topics"],
                dependencies=[auth.require(Op.DELETE_TOPIC)],
                responses=errors(404, 409, 412))
    async def delete_topic(tenant: str, namespace: str, topic: str, request: Request,
                           force: bool = False) -> Response:
        """`force`: delete it with its subscriptions (Pulsar's `topics delete -f`)."""
        return await _delete(topic_name(tenant, namespace, topic), False, force, request)

    @app.delete(topic_base + "/partitions", status_code=NO_CONTENT, tags=["topics"],
                dependencies=[auth.require(Op.DELETE_TOPIC)],
                responses=errors(404, 409, 412))
    async def delete_partitioned_topic(tenant: str, namespace: str, topic: str,
                                       request: Request, force: bool = False) -> Response:
        """`force`: delete it with its subscriptions (`delete-partitioned-topic -f`)."""
        name = topic_name(tenant, namespace, topic)
        if name.partition_index >= 0:
            raise ApiError(412, "Partitioned Topic Name should not contain '-partition-'")
        return await _delete(name, True, force, request)

    # -- topic delayed-delivery policy: a local one and a global one (`isGlobal`), kept
    # apart as Pulsar keeps them; the topic runs with local over global, field by field.

    topic_path = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/delayedDelivery"

    async def existing_policy_topic(tenant: str, namespace: str, topic: str) -> TopicName:
        """The topic a policy names; as in Pulsar, it must exist (`topics create`, or a first
        publish that auto-created it) and must not be a partition."""
        name = policy_topic(tenant, namespace, topic)
        if await catalog.partitions(name) == 0:
            raise ApiError(404, topic_not_found(name))
        return name

    @app.get(topic_path, tags=["delayed delivery"],
             dependencies=[auth.require(Op.GET_TOPIC_POLICIES)],
             responses=errors(404, 412))
    async def get_topic_policy(tenant: str, namespace: str, topic: str, applied: bool = False,
                               isGlobal: bool = False) -> Response:
        name = await existing_policy_topic(tenant, namespace, topic)
        ns_policy, levels = await store.topic_policies(name)
        if applied:
            # What the topic runs with, whichever level was asked for: Pulsar would
            # answer the asked level's own policy when it has one.
            return _json(resolve_policy(broker, ns_policy, levels.merged()).to_pulsar_json())
        return _own(levels.level(isGlobal))

    @app.post(topic_path, status_code=NO_CONTENT, tags=["delayed delivery"],
              openapi_extra=POLICY_BODY,
              dependencies=[auth.require(Op.SET_TOPIC_POLICIES)],
              responses=errors(404, 412))
    async def set_topic_policy(tenant: str, namespace: str, topic: str, request: Request,
                               isGlobal: bool = False) -> Response:
        name = await existing_policy_topic(tenant, namespace, topic)
        policy = await policy_body(request, delay_limit)
        return await commit("topic_policy_set",
                            lambda: store.set_topic_policy(name, policy, isGlobal))

    @app.delete(topic_path, status_code=NO_CONTENT, tags=["delayed delivery"],
                dependencies=[auth.require(Op.SET_TOPIC_POLICIES)],
                responses=errors(404, 412))
    async def remove_topic_policy(tenant: str, namespace: str, topic: str,
                                  isGlobal: bool = False) -> Response:
        name = await existing_policy_topic(tenant, namespace, topic)
        return await commit("topic_policy_remove",
                            lambda: store.remove_topic_policy(name, isGlobal))

    permissions.add_routes(app, store, auth, commit, namespace_name)
    kafka_tokens.add_routes(app, auth, settings)
    limits.add_routes(app, store, auth, commit, namespace_name)
    stats.add_routes(app, catalog, tracker, auth, topic_name)
    return app
