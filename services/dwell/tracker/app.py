"""The tracker's HTTP API (port 8083): subscription registration (Kafka first, through
dwell.tracker.registry), per-topic stats, Pulsar's topic stats path with its
delayed-delivery fields, and /metrics. With authorization on, the tenants' admin roles
and the namespaces' permissions come from a replay of `dwell.policies`, as admission's."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis as redislib
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from dwell import keys, liveness
from dwell.adapters import kafka
from dwell.auth.guard import Guard
from dwell.core.authz import Grants
from dwell.core.authz import Operation as Op
from dwell.core.policy import MAX_SUBSCRIPTIONS_FIELD, applied_limit
from dwell.core.positions import CANCEL_STATUS
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import InvalidTopicName, TopicName, retry_topic, validate_subscription
from dwell.http import (
    CANCEL_RESPONSES,
    ApiError,
    BodyLimit,
    CancelBody,
    CancelMany,
    CancelManyBody,
    create_app,
    errors,
)
from dwell.policy_view import PolicyCache, PolicyFollower
from dwell.tracker import cancel as cancels
from dwell.tracker import metrics
from dwell.tracker.index_view import IndexView
from dwell.tracker.ingest_loop import IngestLoop
from dwell.tracker.recovery import LowmarkKeeper
from dwell.tracker.registry import SubscriptionRegistry
from dwell.tracker.restage import Restager
from dwell.tracker.settings import TrackerSettings
from dwell.tracker.stats import pulsar_stats, topic_stats, topics


def _topic(kind: str, tenant: str, namespace: str, topic: str) -> str:
    try:
        return str(TopicName.of(kind, tenant, namespace, topic))
    except InvalidTopicName as exc:
        raise ApiError(400, str(exc)) from None


def _sub(name: str) -> str:
    try:
        return validate_subscription(name)
    except InvalidTopicName as exc:
        raise ApiError(400, str(exc)) from None


def feed_guard(settings: TrackerSettings) -> tuple[Guard, PolicyCache]:
    """A guard whose grants come from a replay of `dwell.policies`, followed in a daemon
    thread."""
    cache = PolicyCache(settings.broker_defaults())
    follower = PolicyFollower(cache, settings.kafka_bootstrap, replay_timeout_s=60.0)
    follower.start()

    async def grants(tenant: str, namespace: str | None) -> Grants:
        return cache.grants(tenant, namespace)

    async def catch_up() -> bool:
        return await asyncio.wrap_future(follower.catch_up())

    return Guard(settings, grants, catch_up), cache


def build_app(settings: TrackerSettings, r: redislib.Redis,
              ingest: IngestLoop | None = None, refiled: IngestLoop | None = None,
              restager: Restager | None = None,
              keeper: LowmarkKeeper | None = None,
              registry: SubscriptionRegistry | None = None,
              canceller: cancels.Canceller | None = None,
              view: IndexView | None = None) -> FastAPI:
    # The replay of dwell.policies gives the grants (with authorization) and the
    # namespaces' maxSubscriptionsPerTopic.
    feed_checked, policies = feed_guard(settings)
    guard = feed_checked if settings.authorization_enabled else Guard(settings)
    if registry is None:
        registry = SubscriptionRegistry(r, settings.kafka_bootstrap,
                                        compression_type=settings.kafka_compression_type)
    reg = registry
    if canceller is None:
        canceller = cancels.Canceller(r, settings.kafka_bootstrap, settings.delayed_topic,
                                      wait_ms=settings.cancel_wait_ms,
                                      margin_ms=settings.cancel_clock_margin_ms)
    cancel = canceller

    async def ready() -> dict[str, Any]:
        checks: dict[str, Any] = {"redis": bool(r.ping())}
        for name, loop in (("ingest", ingest), ("ingestRefiled", refiled)):
            if loop is not None:
                checks[name] = loop.running and loop.error is None
                if loop.error:
                    checks[f"{name}Error"] = loop.error
            if loop is not None and loop.rebuilding:
                # Reported, not unready: the rebuild is the ingest doing its work.
                checks[f"{name}Rebuilding"] = sorted(loop.rebuilding)
        # A failing restage slows the drain down but loses nothing: reported, not unready.
        if restager is not None and restager.error:
            checks["restageError"] = restager.error
        if keeper is not None and keeper.error:
            checks["lowmarkError"] = keeper.error
        if reg.error:
            checks["subscriptionRegistryError"] = reg.error
        if reg.rebuilding:
            checks["subscriptionRegistryRebuilding"] = True
        if settings.authorization_enabled:
            checks["policyReplayed"] = policies.ready.is_set()
        checks["ready"] = all(v for k, v in checks.items()
                              if not k.endswith(("Error", "Rebuilding")))
        return checks

    beats = [hb for loop in (ingest, refiled) if loop is not None
             for hb in (loop.polling, loop.writing)]
    for hb in beats:
        metrics.LOOP_ROUND_AGE.labels(hb.name).set_function(hb.age)
    stall_s = settings.stall_timeout_ms / 1000
    app = create_app("dwell tracker", "Shared per-topic index of delayed messages", ready,
                     lambda: liveness.stalled(beats, stall_s), guard.check_metrics)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes,
                       setting="max_request_bytes")
    strict = settings.delayed_delivery_deliver_at_time_strict
    lookahead = settings.delayed_delivery_fixed_delay_detection_lookahead

    index_view = view or IndexView(r)

    def stats_of(topic: str) -> dict[str, Any]:
        reg.ensure()  # the stats list the topic's registered subscriptions
        return topic_stats(index_view, topic, int(time.time() * 1000), strict=strict,
                           lookahead=lookahead)

    base = "/v1/topics/{kind}/{tenant}/{namespace}/{topic}"

    @app.put(base + "/subscriptions/{sub}",
             dependencies=[guard.require(Op.SUBSCRIBE)])
    async def put_subscription(kind: str, tenant: str, namespace: str, topic: str, sub: str,
                               request: Request) -> dict[str, Any]:
        name = _topic(kind, tenant, namespace, topic)
        _sub(sub)
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(400, "body: is not valid JSON") from None
        except RecursionError:
            raise ApiError(400, "body: nested too deeply") from None
        try:
            settings_ = SubscriptionSettings.from_json(body)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        limit = applied_limit(policies.namespace_limit(
            TopicName.parse(name).namespace_name, MAX_SUBSCRIPTIONS_FIELD),
            settings.max_subscriptions_per_topic)
        await asyncio.to_thread(reg.put, name, sub, settings_, limit)
        await asyncio.to_thread(subscription_topics, name, sub)
        return settings_.to_json()

    def subscription_topics(name: str, sub: str) -> None:
        """The ready and retry topics a consumer subscribes to, made here because with
        Kafka ACLs a user's principal may read them but not create them. A partition
        `x-partition-N` reads partition N of x's ready topic, which x's creation made."""
        t = TopicName.parse(name)
        wanted = [retry_topic(t, sub)]
        if settings.allow_auto_topic_creation and t.partition_index < 0:
            wanted.insert(0, t.kafka_topic)
        try:
            for kafka_topic in wanted:
                kafka.ensure_topic(settings.kafka_bootstrap, kafka_topic,
                                   settings.ready_topic_partitions,
                                   settings.kafka_replication_factor)
        except kafka.TopicRefused as exc:
            raise ApiError(409, f"topic: {name} maps to a Kafka topic Kafka refuses "
                                f"({exc})") from None
        except kafka.KafkaUnavailable as exc:
            raise ApiError(503, f"Kafka: {exc}") from None

    @app.get(base + "/subscriptions/{sub}",
             dependencies=[guard.require(Op.GET_SUBSCRIPTION)],
             responses=errors(404))
    def get_subscription(kind: str, tenant: str, namespace: str, topic: str,
                         sub: str) -> dict[str, Any]:
        found = reg.get(_topic(kind, tenant, namespace, topic), _sub(sub))
        if found is None:
            raise ApiError(404, "Subscription not found")
        return found.to_json()

    @app.delete(base + "/subscriptions/{sub}", status_code=204,
                dependencies=[guard.require(Op.UNSUBSCRIBE)],
                responses=errors(404))
    def delete_subscription(kind: str, tenant: str, namespace: str, topic: str,
                            sub: str) -> Response:
        if not reg.delete(_topic(kind, tenant, namespace, topic), _sub(sub)):
            raise ApiError(404, "Subscription not found")
        return Response(status_code=204)

    # Admission's Kafka ingress asks with a delegated token (dwell.auth.tokens).
    @app.delete(base + "/messages/{message_id}", response_model=CancelBody,
                dependencies=[guard.require(Op.PRODUCE, delegated=True)],
                responses=CANCEL_RESPONSES)
    async def cancel_message(kind: str, tenant: str, namespace: str, topic: str,
                             message_id: str) -> JSONResponse:
        """Cancel a pending delayed message by the messageId its publish returned. A
        message answered `cancelled` is never delivered, to any subscription."""
        name = TopicName.parse(_topic(kind, tenant, namespace, topic))
        try:
            out = await asyncio.wrap_future(cancel.cancel(name, message_id))
        except ValueError as exc:
            raise ApiError(400, f"messageId: {exc}") from None
        except (kafka.KafkaUnavailable, cancels.NotRecorded) as exc:
            raise ApiError(503, f"Kafka: {exc}", {"Retry-After": "1"}) from None
        except redislib.RedisError as exc:
            raise ApiError(503, f"Redis: {type(exc).__name__}", {"Retry-After": "1"}) from None
        status = CANCEL_STATUS[out.answer]
        return JSONResponse({"messageId": message_id, "result": out.answer,
                             "delivered": out.delivered, "reason": out.detail},
                            status_code=status,
                            headers={"Retry-After": "1"} if status == 503 else None)

    @app.post(base + "/cancellations", response_model=CancelManyBody,
              dependencies=[guard.require(Op.PRODUCE, delegated=True)],
              responses=errors(400))
    async def cancel_messages(kind: str, tenant: str, namespace: str, topic: str,
                              body: CancelMany) -> dict[str, Any]:
        """Cancel several pending delayed messages of the topic at once (admission's Kafka
        ingress sends a cancel request's ids this way): one answer per id, in order, with
        the HTTP status its own DELETE would have had (400 for an id that is not one, 503
        when Kafka or Redis could not be asked)."""
        name = TopicName.parse(_topic(kind, tenant, namespace, topic))
        asked: list[Any] = []
        for message_id in body.messageIds:
            try:
                asked.append(cancel.cancel(name, message_id))
            except ValueError as exc:
                asked.append(exc)
        results: list[dict[str, Any]] = []
        for message_id, f in zip(body.messageIds, asked, strict=True):
            if isinstance(f, ValueError):
                results.append({"messageId": message_id, "status": 400,
                                "reason": f"messageId: {f}"})
                continue
            try:
                out = await asyncio.wrap_future(f)
            except (kafka.KafkaUnavailable, cancels.NotRecorded) as exc:
                results.append({"messageId": message_id, "status": 503,
                                "reason": f"Kafka: {exc}"})
                continue
            except redislib.RedisError as exc:
                results.append({"messageId": message_id, "status": 503,
                                "reason": f"Redis: {type(exc).__name__}"})
                continue
            results.append({"messageId": message_id, "status": CANCEL_STATUS[out.answer],
                            "result": out.answer, "delivered": out.delivered,
                            "reason": out.detail})
        return {"results": results}

    @app.get(base + "/stats",
             dependencies=[guard.require(Op.GET_STATS)])
    def get_topic_stats(kind: str, tenant: str, namespace: str, topic: str) -> dict[str, Any]:
        return stats_of(_topic(kind, tenant, namespace, topic))

    @app.get("/v1/stats",
             dependencies=[guard.require(Op.GET_ALL_STATS)])
    def list_stats() -> dict[str, Any]:
        out = []
        for t in topics(r):
            s = stats_of(t)
            out.append({k: s[k] for k in ("topic", "delayedMessages", "bufferMemoryBytes",
                                          "buckets", "nextDueAt", "drainLagMs")})
        return {"topics": out}

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats",
             dependencies=[guard.require(Op.GET_STATS)],
             responses=errors(404))
    def pulsar_topic_stats(tenant: str, namespace: str, topic: str) -> dict[str, Any]:
        name = _topic("persistent", tenant, namespace, topic)
        if not r.sismember(keys.TOPICS, name) and not reg.names(name):
            raise ApiError(404, f"Topic {name} not found")
        return pulsar_stats(stats_of(name))

    return app
