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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from dwell.adapters import kafka
from dwell.auth.guard import Guard
from dwell.core import topics as names
from dwell.core.authz import Grants, Operation
from dwell.http import (
    ApiError,
    BodyLimit,
    create_app,
    declared_size,
    errors,
    internal_error,
    too_large,
)
from dwell.policy_feed import PolicyCache, PolicyFollower

from . import metrics
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
                                          {names.DELAYED: s.delayed_topic_partitions})
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
Handler = Callable[[str, str, str, str, bytes],
                   Awaitable[tuple[int, bytes, dict[str, str] | None]]]
_PREFIX = "/topics/"


def publish_parts(scope: Scope) -> list[str] | None:
    """The four path segments of a publish request, or None: the FastAPI routes' match
    (a POST, four non-empty segments of the decoded path, or six ending in
    `partitions/<N>`, whose topic is then `<topic>-partition-<N>`)."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    if not path.startswith(_PREFIX):
        return None
    parts = path[len(_PREFIX):].split("/")
    if (len(parts) == 6 and parts[4] == "partitions" and parts[5].isascii()
            and parts[5].isdigit() and names.PARTITION_SUFFIX not in parts[3]):
        # Pulsar's route to one partition of x is a publish to x-partition-N; the FastAPI
        # route answers its malformed forms.
        parts = [*parts[:3], f"{parts[3]}{names.PARTITION_SUFFIX}{int(parts[5])}"]
    return parts if len(parts) == 4 and all(parts) else None


class PublishFront:
    """ASGI: publish requests go straight to `handle`; every other request, and the
    lifespan, to `app`.

    A publish needs none of FastAPI's per-request work (routing, parameter resolution,
    the middleware stack), and that work costs more than the rest of the HTTP exchange
    around a batch. What the app would give a publish is kept here: a body over
    `max_bytes` is refused with 413, as `BodyLimit` refuses it (at once when its
    Content-Length says so, else as soon as the bytes read pass the limit, closing the
    connection), and an unexpected error is a 500 without a trace. Keep-alive,
    pipelining and `Expect: 100-continue` are uvicorn's."""

    def __init__(self, app: ASGIApp, handle: Handler, max_bytes: int,
                 guard: Guard | None = None) -> None:
        self.app = app
        self.handle = handle
        self.max_bytes = max_bytes
        self.guard = guard if guard is not None and guard.authentication else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = publish_parts(scope)
        if parts is None:
            await self.app(scope, receive, send)
            return
        if self.guard is not None:
            # The route's guard (Operation.PRODUCE), which this path bypasses with the app.
            try:
                await self.guard.check(_authorization(scope), Operation.PRODUCE, parts[1],
                                       parts[2])
            except ApiError as exc:
                await _answer(send, exc.status, orjson.dumps({"reason": exc.reason}),
                              exc.headers)
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
    """The admission app: the publish route, `/readyz`, and the policy follower and Kafka
    ingress started and stopped with its lifespan. `app.state.publish` is its publish
    handler, which `serve_publishes` hands publishes to directly."""
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

    # Documents the endpoint (OpenAPI) and serves it under any ASGI server; behind
    # `serve_publishes`, as `python -m dwell.admission` runs it, publishes skip it.
    @app.post("/topics/{domain}/{tenant}/{namespace}/{topic}",
              dependencies=[adm.guard.require(Operation.PRODUCE)],
              responses={200: {"model": PublishResults}} | errors(404, 409, 413),
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": model_of(PublishRequest).model_json_schema()}}}})
    async def publish(domain: str, tenant: str, namespace: str, topic: str,
                      request: Request) -> Response:
        status, content, headers = await handle(domain, tenant, namespace, topic,
                                                await request.body())
        return Response(content, status, headers, media_type="application/json")

    @app.post("/topics/{domain}/{tenant}/{namespace}/{topic}/partitions/{partition}",
              dependencies=[adm.guard.require(Operation.PRODUCE)],
              responses={200: {"model": PublishResults}} | errors(404, 409, 413),
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": model_of(PublishRequest).model_json_schema()}}}})
    async def publish_to_partition(domain: str, tenant: str, namespace: str, topic: str,
                                   partition: int, request: Request) -> Response:
        """Pulsar's route to one partition: the same as a publish to `<topic>-partition-N`."""
        if names.PARTITION_SUFFIX in topic:
            raise ApiError(400, "Topic name can't contain '-partition-' suffix.")
        status, content, headers = await handle(
            domain, tenant, namespace, f"{topic}{names.PARTITION_SUFFIX}{partition}",
            await request.body())
        return Response(content, status, headers, media_type="application/json")

    return app


def serve_publishes(app: FastAPI, settings: AdmissionSettings) -> PublishFront:
    """`app` (from `build_app`) behind the ASGI front that serves its publishes."""
    return PublishFront(app, app.state.publish, settings.max_request_bytes,
                        app.state.admission.guard)
