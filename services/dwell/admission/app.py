"""The admission HTTP service (port 8082): Pulsar's REST producer endpoint
`POST /topics/{persistent|non-persistent}/{tenant}/{namespace}/{topic}` over the shared
publish path, plus `/readyz` (policy replay caught up, version applied, ingress state).
Building the app also wires the policy follower and the Kafka ingress into its lifespan,
so one process serves both entry paths."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.http import BodyLimit, create_app

from . import metrics
from .cache import PolicyCache, PolicyFollower
from .ingress import Ingress
from .publish import Publisher
from .schema import PublishError
from .settings import AdmissionSettings

log = logging.getLogger("dwell.admission")
RETRY_AFTER_S = "1"


class Admission:
    """Everything one admission process runs: cache + follower, publisher, ingress."""

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.cache = PolicyCache(settings.broker_defaults())
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
        self.ingress = Ingress(settings, self.publisher) if settings.ingress_enabled else None
        self.topics_ready = threading.Event()
        self.startup_error: str | None = None
        self._starter = threading.Thread(target=self._start, name="admission-start",
                                         daemon=True)

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


def build_app(settings: AdmissionSettings) -> FastAPI:
    """The admission app: the publish route, `/readyz`, and the policy follower and Kafka
    ingress started and stopped with its lifespan."""
    adm = Admission(settings)

    async def ready() -> dict[str, Any]:
        return adm.readiness()

    app = create_app("dwell admission", "Publish checks (max and fixed delay) and routing "
                                        "to the ready topic or the delay log.", ready)

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

    @app.post("/topics/{domain}/{tenant}/{namespace}/{topic}")
    async def publish(domain: str, tenant: str, namespace: str, topic: str,
                      request: Request) -> Response:
        # Streamed rather than `request.body()`, which would keep the body on the request
        # while Kafka acknowledges (see Publisher.publish). A body over the limit raises
        # BodyLimit's 413 here, before the request is counted.
        body = b"".join([chunk async for chunk in request.stream()])
        started = time.perf_counter()
        status = 200
        try:
            tn = adm.publisher.topic(domain, tenant, namespace, topic)
            answer = adm.publisher.publish(tn, body)
            del body  # see Publisher.publish
            return Response(await answer, media_type="application/json")
        except PublishError as exc:
            status = exc.status
            headers = {"Retry-After": RETRY_AFTER_S} if exc.status == 503 else None
            return Response(orjson.dumps({"reason": exc.reason}), status, headers,
                            media_type="application/json")
        except Exception:
            status = 500
            raise
        finally:
            counter = requests.get(status)
            if counter is None:
                counter = requests[status] = metrics.REQUESTS.labels("http", str(status))
            counter.inc()
            latency.observe(time.perf_counter() - started)

    return app
