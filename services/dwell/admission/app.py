"""The admission HTTP service (port 8082): Pulsar's REST producer endpoint
`POST /topics/{persistent|non-persistent}/{tenant}/{namespace}/{topic}` over the shared
publish path, plus `/readyz` (policy replay caught up, version applied, ingress state).
Building the app also wires the policy follower and the Kafka ingress into its lifespan,
so one process serves both entry paths."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from dwell.adapters import kafka
from dwell.auth.guard import Guard, operation_of
from dwell.core import topics as names
from dwell.core.authz import Grants, Operation
from dwell.core.topics import InvalidTopicName, TopicName
from dwell.http import (
    CANCEL_RESPONSES,
    ApiError,
    BodyLimit,
    CancelBody,
    create_app,
    declared_size,
    errors,
    internal_error,
    too_large,
)
from dwell.policy_view import PolicyCache, PolicyFollower
from dwell.security import http_verify

from . import metrics
from .cancels import cancel_path
from .ingress import Ingress
from .metrics import POLICY_VERSION_APPLIED
from .publish import Publisher
from .schema import PublishError, PublishRequest, PublishResults, model_of
from .settings import AdmissionSettings

log = logging.getLogger("dwell.admission")
RETRY_AFTER_S = "1"


class Admission:
    """Everything one admission process runs: cache + follower, publisher, ingress."""

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.cache = PolicyCache(settings.broker_defaults(),
                                 on_version=POLICY_VERSION_APPLIED.set)
        self.follower = PolicyFollower(
            self.cache, settings.kafka_bootstrap,
            replay_timeout_s=settings.policy_replay_timeout_s,
            catch_up_timeout_s=settings.policy_catch_up_timeout_ms / 1000)
        self.producer = kafka.Producer(settings.kafka_bootstrap,
                                       linger_ms=settings.producer_linger_ms,
                                       poll_in_background=False,
                                       compression_type=settings.kafka_compression_type,
                                       **{"message.timeout.ms": settings.publish_timeout_ms})
        self.publisher = Publisher(settings, self.cache, self.producer,
                                   catch_up=self.follower.catch_up)
        # Grants come from the replayed policy feed: no call to the policy service.
        self.guard = Guard(settings, self._grants, self._catch_up)
        self.ingress = (Ingress(settings, self.publisher, self.guard, self.cache.grants)
                        if settings.ingress_enabled else None)
        self.topics_ready = threading.Event()
        self.startup_error: str | None = None
        self._starter = threading.Thread(target=self._start, name="admission-start",
                                         daemon=True)

    async def _grants(self, tenant: str, namespace: str | None) -> Grants:
        return self.cache.grants(tenant, namespace)

    async def _catch_up(self) -> bool:
        return await asyncio.wrap_future(self.follower.catch_up())

    def start(self) -> None:
        self._starter.start()

    def _start(self) -> None:
        # Kafka may come up after us: keep trying, and stay unready meanwhile.
        s = self.settings
        while True:
            try:
                kafka.ensure_dwell_topics(s.kafka_bootstrap, s.kafka_replication_factor,
                                          s.dwell_topic_partitions())
                break
            except kafka.KafkaUnavailable as exc:
                self.startup_error = str(exc)
                log.warning("creating dwell topics: %s; retrying", exc)
                time.sleep(1.0)
            except kafka.RetentionRefused as exc:
                # Accepting messages the delay log may then drop is worse than not starting.
                self.startup_error = str(exc)
                log.error("refusing to start: %s", exc)
                return
        self.startup_error = None
        self.topics_ready.set()
        self.follower.start()
        if self.ingress is not None:
            self.ingress.start()

    def stop(self) -> None:
        self.follower.stop()
        if self.ingress is not None:
            self.ingress.stop()
        self.producer.close()

    def readiness(self) -> dict[str, Any]:
        ready = self.topics_ready.is_set() and self.cache.ready.is_set()
        out: dict[str, Any] = {"ready": ready, "policyReplayed": self.cache.ready.is_set(),
                               "policyVersionApplied": self.cache.version}
        if self.ingress is not None:
            out["ingressAssigned"] = self.ingress.assigned.is_set()
        errors = [e for e in (self.startup_error, self.follower.error,
                              self.ingress.error if self.ingress else None) if e]
        if errors:
            out["errors"] = errors
        return out


# (domain, tenant, namespace, topic, body) -> (status, JSON body, extra headers)
Answer = tuple[int, bytes, dict[str, str] | None]
Handler = Callable[[str, str, str, str, bytes], Awaitable[Answer]]
# A publish route's path parameters -> (domain, tenant, namespace, topic); None: the app
# answers the request (a malformed partition number: FastAPI's 422).
TopicOf = Callable[[dict[str, Any]], "tuple[str, str, str, str] | None"]
PUBLISH_PATH = "/topics/{domain}/{tenant}/{namespace}/{topic}"
PARTITION_PATH = f"{PUBLISH_PATH}/partitions/{{partition}}"


@dataclass(frozen=True)
class PublishRoute:
    """A publish route as the app declares it (its path, its guard's operation, what
    OpenAPI documents), and how its path parameters name the topic published to."""

    route: APIRoute
    operation: Operation | None
    topic_of: TopicOf


def partition_topic(topic: str, partition: int) -> str:
    """Pulsar's route to one partition of `topic`: a publish to `<topic>-partition-N`,
    and partition -1 to `topic` itself (Pulsar's `TopicName.getPartition`)."""
    if names.PARTITION_SUFFIX in topic:
        raise ApiError(400, "Topic name can't contain '-partition-' suffix.")
    return topic if partition == -1 else f"{topic}{names.PARTITION_SUFFIX}{partition}"


def _topic(params: dict[str, Any]) -> tuple[str, str, str, str]:
    return params["domain"], params["tenant"], params["namespace"], params["topic"]


def _partition(params: dict[str, Any]) -> tuple[str, str, str, str] | None:
    number: str = params["partition"]
    if not (number.isascii() and number.isdigit()):
        return None
    return (params["domain"], params["tenant"], params["namespace"],
            partition_topic(params["topic"], int(number)))


def add_publish_routes(app: FastAPI, handle: Handler,
                       dependencies: Sequence[Any] = ()) -> list[PublishRoute]:
    """Declare the publish routes on `app`, guarded by `dependencies`: the one
    declaration of each, which OpenAPI documents and any ASGI server serves through
    FastAPI. Returned for `PublishFront`, which serves the same routes (their own path
    matching and guard) without FastAPI's per-request work."""
    body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model_of(PublishRequest).model_json_schema()}}}}
    responses = {200: {"model": PublishResults}} | errors(404, 409, 413)

    @app.post(PUBLISH_PATH, dependencies=list(dependencies), responses=responses,
              openapi_extra=body)
    async def publish(domain: str, tenant: str, namespace: str, topic: str,
                      request: Request) -> Response:
        status, content, headers = await handle(domain, tenant, namespace, topic,
                                                await request.body())
        return Response(content, status, headers, media_type="application/json")

    @app.post(PARTITION_PATH, dependencies=list(dependencies), responses=responses,
              openapi_extra=body)
    async def publish_to_partition(domain: str, tenant: str, namespace: str, topic: str,
                                   partition: int, request: Request) -> Response:
        """Pulsar's route to one partition: the same as a publish to `<topic>-partition-N`."""
        status, content, headers = await handle(
            domain, tenant, namespace, partition_topic(topic, partition),
            await request.body())
        return Response(content, status, headers, media_type="application/json")

    routes = {r.endpoint: r for r in app.routes if isinstance(r, APIRoute)}
    operations = [op for d in dependencies if (op := operation_of(d)) is not None]
    operation = operations[0] if operations else None
    return [PublishRoute(routes[publish], operation, _topic),
            PublishRoute(routes[publish_to_partition], operation, _partition)]


class PublishFront:
    """ASGI: requests to the publish `routes` (matched by the routes themselves) go
    straight to `handle`; every other request, and the lifespan, to `app`.

    A publish needs none of FastAPI's per-request work (routing, parameter resolution,
    the middleware stack), and that work costs more than the rest of the HTTP exchange
    around a batch. What the app would give a publish is kept here: the route's guard
    (its operation on the path's tenant and namespace), a body over `max_bytes` refused
    with 413, as `BodyLimit` refuses it (at once when its Content-Length says so, else
    as soon as the bytes read pass the limit, closing the connection), and an unexpected
    error a 500 without a trace. Keep-alive, pipelining and `Expect: 100-continue` are
    uvicorn's."""

    def __init__(self, app: ASGIApp, routes: Sequence[PublishRoute], handle: Handler,
                 max_bytes: int, guard: Guard | None = None) -> None:
        self.app = app
        self.routes = tuple(routes)
        self.handle = handle
        self.max_bytes = max_bytes
        self.guard = guard if guard is not None and guard.authentication else None

    def match(self, scope: Scope) -> tuple[PublishRoute, dict[str, Any]] | None:
        """The publish route `scope` is a request to and its path parameters, or None."""
        if scope["type"] != "http":
            return None
        for route in self.routes:
            found, child = route.route.matches(scope)
            if found is Match.FULL:
                return route, child["path_params"]
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        matched = self.match(scope)
        parts = None
        if matched is not None:
            route, params = matched
            try:
                # The route's guard first, as FastAPI runs it before the path's checks.
                if self.guard is not None and route.operation is not None:
                    await self.guard.check(_authorization(scope), route.operation,
                                           params.get("tenant"), params.get("namespace"))
                parts = route.topic_of(params)
            except ApiError as exc:
                await _answer(send, exc.status, orjson.dumps({"reason": exc.reason}),
                              exc.headers)
                return
        if parts is None:
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        size = declared_size(scope)
        if size is not None and size > limit:
            await _answer(send, 413, _too_large(limit, size), _CLOSE)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                await _answer(send, 413, _too_large(limit, None), _CLOSE)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        del chunks
        answer = self.handle(parts[0], parts[1], parts[2], parts[3], body)
        del body  # the handler lets it go once decoded: see Publisher.publish
        try:
            status, content, headers = await answer
        except Exception as exc:  # the app's 500 handler, which this path bypasses
            log.exception("unhandled error on POST %s", scope["path"])
            await _answer(send, 500, orjson.dumps({"reason": internal_error(exc)}), None)
            return
        await _answer(send, status, content, headers)


_CLOSE = {"connection": "close"}


def _authorization(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bytes(value).decode("latin-1")
    return None


def _too_large(limit: int, size: int | None) -> bytes:
    return orjson.dumps({"reason": too_large(limit, "max_request_bytes", size)})


async def _answer(send: Send, status: int, content: bytes,
                  headers: dict[str, str] | None) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
    if headers:
        raw += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


def build_app(settings: AdmissionSettings) -> FastAPI:
    """The admission app: the publish routes, `/readyz`, and the policy follower and Kafka
    ingress started and stopped with its lifespan. `app.state.publish` is its publish
    handler and `app.state.publish_routes` its publish routes, which `serve_publishes`
    serves directly."""
    adm = Admission(settings)

    async def ready() -> dict[str, Any]:
        return adm.readiness()

    app = create_app("dwell admission", "Publish checks (max and fixed delay) and routing "
                                        "to the ready topic or the delay log.", ready,
                     metrics_access=adm.guard.check_metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        adm.start()
        yield
        adm.stop()

    app.router.lifespan_context = lifespan
    app.state.admission = adm
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes,
                       setting="max_request_bytes")

    # The metric children, looked up once rather than per request.
    latency = metrics.PUBLISH_LATENCY.labels("http")
    requests: dict[int, Any] = {}

    async def handle(domain: str, tenant: str, namespace: str, topic: str,
                     body: bytes) -> tuple[int, bytes, dict[str, str] | None]:
        """One publish request: (status, JSON body, extra headers)."""
        started = time.perf_counter()
        status = 200
        try:
            tn = adm.publisher.topic(domain, tenant, namespace, topic)
            answer = adm.publisher.publish(tn, body)
            del body  # see Publisher.publish
            return 200, await answer, None
        except PublishError as exc:
            status = exc.status
            headers = {"Retry-After": RETRY_AFTER_S} if exc.status == 503 else None
            return status, orjson.dumps({"reason": exc.reason}), headers
        except Exception:
            status = 500
            raise
        finally:
            counter = requests.get(status)
            if counter is None:
                counter = requests[status] = metrics.REQUESTS.labels("http", str(status))
            counter.inc()
            latency.observe(time.perf_counter() - started)

    app.state.publish = handle
    app.state.publish_routes = add_publish_routes(
        app, handle, [adm.guard.require(Operation.PRODUCE)])
    add_cancel_route(app, settings, [adm.guard.require(Operation.PRODUCE)])
    return app


def add_cancel_route(app: FastAPI, settings: AdmissionSettings,
                     dependencies: Sequence[Any]) -> None:
    """`DELETE /topics/{domain}/{tenant}/{namespace}/{topic}/messages/{messageId}`: the
    cancel of a pending delayed message, decided by the tracker (which holds the index)
    and answered as it answers; the caller's credentials go with it."""
    tracker = httpx.AsyncClient(base_url=settings.tracker_url.rstrip("/"), timeout=30.0,
                                verify=http_verify(settings))

    @app.delete("/topics/{domain}/{tenant}/{namespace}/{topic}/messages/{message_id}",
                dependencies=list(dependencies), response_model=CancelBody,
                responses=CANCEL_RESPONSES)
    async def cancel_message(domain: str, tenant: str, namespace: str, topic: str,
                             message_id: str, request: Request) -> Response:
        """Cancel a pending delayed message by the messageId its publish returned:
        `cancelled` (200), `delivered` or `not_found` (404), `too_late` (409: due and
        being delivered), `busy` (503: retry). A message answered `cancelled` is never
        delivered, to any subscription."""
        try:
            name = TopicName.of(domain, tenant, namespace, topic)
        except InvalidTopicName as exc:
            raise ApiError(400, str(exc)) from None
        auth = request.headers.get("authorization")
        try:
            resp = await tracker.delete(cancel_path(name, message_id),
                                        headers={"Authorization": auth} if auth else None)
        except httpx.HTTPError as exc:
            raise ApiError(503, f"tracker unreachable: {str(exc) or type(exc).__name__}",
                           {"Retry-After": RETRY_AFTER_S}) from None
        headers = {k: v for k, v in resp.headers.items() if k.lower() == "retry-after"}
        return Response(resp.content, status_code=resp.status_code, headers=headers,
                        media_type="application/json")


def serve_publishes(app: FastAPI, settings: AdmissionSettings) -> PublishFront:
    """`app` (from `build_app`) behind the ASGI front that serves its publishes."""
    return PublishFront(app, app.state.publish_routes, app.state.publish,
                        settings.max_request_bytes, app.state.admission.guard)
