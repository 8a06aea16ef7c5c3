"""The Spark app's Prometheus metrics (ARCHITECTURE "dwell's own"), served with /healthz on
127.0.0.1:DWELL_SPARK_METRICS_PORT (default 8084) by a tiny HTTP server thread."""

from __future__ import annotations

import json
import logging
import ssl
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from dwell import liveness, memory
from dwell.http import ApiError
from dwell.index.marks import MARKS_WRITTEN

from .records import LATENESS_BOUNDS_MS, CopyStats

log = logging.getLogger("dwell.spark")

REGISTRY = CollectorRegistry()
DRAIN_LAG_MS = Gauge("dwell_drain_lag_ms", "now minus the earliest bucket start still in the "
                     "index (topic or redelivery) at the start of a drain round; 0 when none "
                     "is past", registry=REGISTRY)
DRAINED = Counter("dwell_drained_messages_total", "Messages written by the drain (ready, "
                  "retry and DLQ topics)", registry=REGISTRY)
REDELIVERIES = Counter("dwell_redeliveries_total", "Redeliveries written to retry topics, "
                       "by redelivery count", ["count"], registry=REGISTRY)
BACKOFF_WRITE_RETRIES = Counter("dwell_backoff_write_retries_total", "Tries again of a "
                                "dwell.acks partition's batch in the backoff whose writes "
                                "failed (Redis or Kafka unreachable)", registry=REGISTRY)
TOPIC_FAILURES = Counter("dwell_drain_topic_failures_total", "Copies of a topic's due "
                         "messages that failed (its claims come back after the lease)",
                         ["topic"], registry=REGISTRY)
BACKOFF_LAG = Gauge("dwell_backoff_lag_events", "dwell.acks events the backoff has not "
                    "applied yet (its end offsets minus the applied marker, summed over "
                    "partitions), checked every DWELL_REDIS_CHECK_INTERVAL_MS",
                    registry=REGISTRY)
FAILING_TOPICS = Gauge("dwell_drain_failing_topics", "Topics whose last drain copy failed, "
                       "retried alone with a growing wait", registry=REGISTRY)
MESSAGES_LOST = Counter("dwell_messages_lost_total", "Pending messages whose records were "
                        "gone from their log when due (deleted by an operator, a truncated "
                        "log): reported once, and the drain goes on with the rest",
                        ["topic"], registry=REGISTRY)
CANCELLED = Counter("dwell_drain_cancelled_messages_total", "Cancelled delayed messages "
                    "the drain passed over instead of delivering", ["topic"],
                    registry=REGISTRY)
LEASE_RENEWALS = Counter("dwell_drain_lease_renewals_total", "Leases of claimed buckets "
                         "renewed while a drain round wrote them", registry=REGISTRY)
LEASES_LOST = Counter("dwell_drain_leases_lost_total", "Claimed buckets whose lease another "
                      "drainer took before the round completed them (their remaining records "
                      "are not written by this round)", registry=REGISTRY)
BACKOFF_REBUILDS = Counter("dwell_backoff_index_rebuilds_total",
                           "Rebuilds of the subscriptions' redelivery indexes from a replay of "
                           "dwell.acks because Redis lost them or rolled back, by reason",
                           ["reason"], registry=REGISTRY)
BACKOFF_REBUILT = Counter("dwell_backoff_rebuild_redeliveries_total",
                          "Pending redeliveries a rebuild found replaying dwell.acks: put back "
                          "before their time (pending), put back already due (due: the "
                          "drain sends them at once; those in flight at the loss reach the "
                          "retry topic twice), or skipped as already on the retry or dead-"
                          "letter topic (skipped_delivered)", ["outcome"], registry=REGISTRY)
INVALID_RECORDS = Counter("dwell_invalid_records_total", "Malformed records set aside on "
                          "dwell.invalid, by the topic they were read from and kind "
                          "(dwell.core.invalid.KINDS)", ["source", "kind"], registry=REGISTRY)
DLQ = Counter("dwell_dlq_messages_total", "Messages written to dead-letter topics",
              registry=REGISTRY)
FOREIGN_RECORDS = Counter("dwell_drain_foreign_records_total", "Redeliveries and dead "
                          "letters not copied: their messageId named a record of another "
                          "topic", registry=REGISTRY)


class _LastBatch(Collector):
    """`dwell_spark_last_batch_duration_ms{query}`: each streaming query's last
    micro-batch, asked of Spark at scrape time (a Python StreamingQueryListener fell
    behind under load: its callbacks queue for the driver's busy Python side)."""

    def __init__(self) -> None:
        self.queries: list[Any] = []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("dwell_spark_last_batch_duration_ms", "Duration of the last "
                              "micro-batch of each streaming query (drain, backoff)",
                              labels=["query"])
        for q in list(self.queries):
            try:
                progress = q.lastProgress
            except Exception:
                continue
            if progress:
                name = (progress.get("name") or "").removeprefix("dwell-")
                g.add_metric([name], float(progress.get("batchDuration", 0)))
        yield g


LAST_BATCH = _LastBatch()
REGISTRY.register(LAST_BATCH)


def watch(queries: Sequence[Any]) -> None:
    """The streaming queries whose last batch `/metrics` reports."""
    LAST_BATCH.queries = list(queries)


class _Lateness(Collector):
    """`dwell_delivery_lateness_ms`: emit time − deliverAt per drained delayed message. Kept
    as bucket counts added per round (numpy), not one `observe` per message."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stats = CopyStats()

    def add(self, stats: CopyStats) -> None:
        with self.lock:
            self.stats.lateness_counts = [a + b for a, b in zip(
                self.stats.lateness_counts, stats.lateness_counts, strict=True)]
            self.stats.lateness_sum_ms += stats.lateness_sum_ms

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self.lock:
            counts, total = list(self.stats.lateness_counts), self.stats.lateness_sum_ms
        cum, buckets = 0, []
        for le, c in zip([*map(str, LATENESS_BOUNDS_MS), "+Inf"], counts, strict=True):
            cum += c
            buckets.append((le, cum))
        yield HistogramMetricFamily("dwell_delivery_lateness_ms", "Emit time minus "
                                    "deliverAt of each drained delayed message (ms)",
                                    buckets=buckets, sum_value=total)


LATENESS = _Lateness()
REGISTRY.register(LATENESS)
REGISTRY.register(memory.ALLOCATOR)
# The drain writes its completed buckets to dwell.delivered (dwell.index.marks), which
# counts them in the process-wide counter: this app serves it from its own registry.
REGISTRY.register(MARKS_WRITTEN)


def record(stats: CopyStats) -> None:
    """Account one write of the drain (or of the backoff job's dead letters)."""
    DRAINED.inc(stats.written)
    LATENESS.add(stats)
    for count, n in stats.redeliveries.items():
        REDELIVERIES.labels(count=str(count)).inc(n)
    DLQ.inc(stats.dead_letters)
    FOREIGN_RECORDS.inc(len(stats.foreign))


# Micro-batches each query has run in this process. The first ones of a session take
# seconds (planning, Python workers); /readyz answers 200 once every query is past them,
# so `make up` and the chart's readiness probe wait for a drain that keeps its pace. The
# backoff runs batches only for events, so it marks itself ready when its first starts
# (its warm-up event makes an idle query run one: backoff.warm_up); a backlog is then
# worked through, and dwell_backoff_lag_events shows how much is left.
READY_AFTER_BATCHES = 2
_batches: dict[str, int] = {}
_batches_lock = threading.Lock()


def expect_query(name: str) -> None:
    with _batches_lock:
        _batches.setdefault(name, 0)


def batch_done(name: str) -> None:
    """Count one finished micro-batch of a query; it is ready after READY_AFTER_BATCHES."""
    with _batches_lock:
        _batches[name] = _batches.get(name, 0) + 1
        now_ready = _batches[name] == READY_AFTER_BATCHES
    if now_ready:
        log.info("%s ready", name)


def mark_ready(name: str) -> None:
    """A query that says for itself when it is ready (the backoff: see backoff.warm_up).
    Logs "<name> ready" the first time; later calls change nothing."""
    with _batches_lock:
        now_ready = _batches.get(name, 0) < READY_AFTER_BATCHES
        _batches[name] = max(_batches.get(name, 0), READY_AFTER_BATCHES)
    if now_ready:
        log.info("%s ready", name)


# dwell.liveness: the micro-batch each query runs now; one running for longer than
# batch_stall_timeout_ms (set_stall_timeout) is stuck, and /healthz answers 503.
_batches_running: dict[str, liveness.Heartbeat] = {}
_stall_timeout_s = float("inf")
BATCH_AGE = Gauge("dwell_spark_batch_running_seconds", "How long the micro-batch a query "
                  "runs now has been running (0 between batches); past "
                  "DWELL_BATCH_STALL_TIMEOUT_MS the app's /healthz answers 503", ["query"],
                  registry=REGISTRY)


def set_stall_timeout(seconds: float) -> None:
    global _stall_timeout_s
    _stall_timeout_s = seconds


@contextmanager
def batch_running(name: str) -> Iterator[None]:
    """Around one micro-batch of query ``name``: while it runs longer than the stall
    timeout, /healthz names it (and its thread's stack is logged once)."""
    hb = _batches_running.get(name)
    if hb is None:
        hb = _batches_running[name] = liveness.Heartbeat(f"{name} micro-batch")
        BATCH_AGE.labels(name).set_function(hb.age)
    hb.beat()
    try:
        yield
    finally:
        hb.rest()


def stalled() -> list[str]:
    return liveness.stalled(list(_batches_running.values()), _stall_timeout_s)


def ready() -> bool:
    with _batches_lock:
        return bool(_batches) and all(n >= READY_AFTER_BATCHES for n in _batches.values())


class _Handler(BaseHTTPRequestHandler):
    # Checks a /metrics caller's Authorization header (dwell.auth.guard.Guard.check_metrics).
    access: Callable[[str | None], None] | None = None

    def do_GET(self) -> None:
        if self.path == "/metrics":
            if self.access is not None:
                try:
                    self.access(self.headers.get("Authorization"))
                except ApiError as exc:
                    self._answer(exc.status, json.dumps({"reason": exc.reason}).encode(),
                                 "application/json", exc.headers)
                    return
            body, ctype = generate_latest(REGISTRY), "text/plain; version=0.0.4"
        elif self.path == "/healthz":
            body, ctype = b'{"status": "ok"}', "application/json"
            stuck = stalled()
            if stuck:
                self._answer(503, json.dumps({"status": "stalled", "stalled": stuck}).encode(),
                             ctype)
                return
        elif self.path == "/readyz":
            ok = ready()
            with _batches_lock:
                body = json.dumps({"ready": ok, "batches": dict(_batches)}).encode()
            ctype = "application/json"
            if not ok:
                self._answer(503, body, ctype)
                return
        else:
            self.send_error(404)
            return
        self._answer(200, body, ctype)

    def _answer(self, status: int, body: bytes, ctype: str,
                headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:  # scrapes are not worth a log line
        return


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that does not speak TLS to the TLS port, or hangs up, is not worth a
        # stack trace in the app's log.
        if isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError)):
            return
        super().handle_error(request, client_address)


def serve(host: str, port: int, tls: ssl.SSLContext | None = None,
          access: Callable[[str | None], None] | None = None) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz on a daemon thread, over TLS with `tls`, and
    /metrics to the callers `access` lets through; returns the server."""
    handler = type("_GuardedHandler", (_Handler,), {"access": staticmethod(access)}
                   ) if access is not None else _Handler
    server = _Server((host, port), handler)
    if tls is not None:
        # The handshake runs on the request's thread, at its first read: a slow client
        # never holds up the accept loop.
        server.socket = tls.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name="dwell-metrics", daemon=True).start()
    return server
