"""The delivery stack for every e2e module, started once per package: policy, admission
(plus a strict-mode admission), tracker and the Spark app (drain + backoff) as real
processes on the test Redis/Kafka, and helpers to drive them through the SDK.

The tracker and the Spark app use their own Redis database and a fresh tracker group that
starts at the current end of dwell.delayed, so the suite drains only what is published
while it runs, and never claims buckets other suites' tracker tests are looking at. (It
does index and drain anything other suites publish to dwell.delayed meanwhile: a
benchmark running next to it delays its drain rounds.)

Timing margins, derived from the settings the Spark app runs with here:
- first delivery: Pulsar's bound is tickTime + 1 s late; dwell adds one drain trigger and
  one drain round (SPARK_MARGIN_MS);
- redelivery: never early (the drain claims a redelivery bucket only once its last
  millisecond has passed). The backoff query writes each redelivery into the
  subscription's redelivery index at its absolute due time as soon as it reads the
  event, so the index, not Spark's timers, does the timing: a redelivery is late by one
  redelivery tick plus a drain trigger and round (SPARK_MARGIN_MS), plus whatever part of
  the event's processing outlasts the delay itself (redelivery_margin_ms). That
  processing is at most two backoff micro-batches (the one running when the event lands,
  then the one that reads it and writes the index), BACKOFF_EVENT_MS. A batch takes
  ~0.4-0.5 s on an idle local[2] on this 2-core box; the first ones after the app's
  warm-up, while every scenario starts at once, took up to 2.3 s (measured), and before
  the backoff query's Kafka fetch wait and idle batches were cut, 1.1-3.0 s.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from dwell.adapters import redis as redis_adapter
from dwell.client import Consumer, Message, Producer
from dwell.core import topics as names
from dwell.tracker import recovery
from dwell_dev import devstack
from dwell_dev.procs import Child
from dwell_dev.testkit import free_port, now_ms, redis_db_url

ROOT = Path(__file__).resolve().parents[2]

TICK_MS = 1000


DRAIN_TRIGGER_MS = 250
BACKOFF_TRIGGER_MS = 250
REDELIVERY_TICK_MS = 100
# One drain trigger (250 ms) plus one drain round that reads and writes the bucket
# (~0.1-0.8 s here, measured); the rest is headroom for the 2 shared cores.
SPARK_MARGIN_MS = 1500
BACKOFF_BATCH_MS = 3000  # a slow backoff micro-batch under the suite's load, see above
BACKOFF_EVENT_MS = 2 * BACKOFF_BATCH_MS


def redelivery_margin_ms(delay_ms: int) -> int:
    """How late a redelivery due ``delay_ms`` after its event may be: one redelivery tick,
    the drain's trigger and round, and the event processing that outlasts the delay."""
    return REDELIVERY_TICK_MS + SPARK_MARGIN_MS + max(0, BACKOFF_EVENT_MS - delay_ms)


# A claimed bucket whose drainer died comes back to the next drainer after this long.
DRAIN_LEASE_MS = 5000
# The tracker re-files a topic's buckets of varied delays this far ahead, 2 s at a time
# (dwell.tracker.restage; 40 s / 20 s by default): delays of 7 s and more take that path.
RESTAGE_LEAD_MS, RESTAGE_CHUNK_MS = 4000, 2000
# The tracker commits its low watermarks and trims the delay logs this often (10 s and
# 60 s by default).
LOWMARK_INTERVAL_MS, TRIM_INTERVAL_MS = 2000, 2000
E2E_REDIS_DB = 7


@dataclass
class SparkApp:
    """`python -m dwell_spark` as a dwell_dev.procs child: start, kill -9, start again on
    the same checkpoint (the crash a test wants to survive)."""

    env: dict[str, str]
    log_dir: Path
    child: Child | None = None
    strict: bool = False
    starts: list[float] = field(default_factory=list)
    metrics_port: int = 0

    @property
    def log(self) -> Path | None:
        return None if self.child is None else self.child.log

    def start(self, *, strict: bool = False, timeout: float = 300,
              warm: bool | None = None) -> None:
        """Start the app; with `warm` (the default for the first start) wait until both
        queries have been through their warm-up, else only until both run."""
        self.strict = strict
        self.metrics_port = free_port()
        env = self.env | {"DWELL_DELAYED_DELIVERY_DELIVER_AT_TIME_STRICT": str(strict).lower(),
                          "DWELL_SPARK_METRICS_PORT": str(self.metrics_port)}
        t0 = time.monotonic()
        self.child = Child.spawn("spark app", [sys.executable, "-m", "dwell_spark"],
                                 self.log_dir / f"spark-{uuid.uuid4().hex[:6]}.log", env,
                                 cwd=ROOT / "spark")
        if warm if warm is not None else not self.starts:
            self.child.wait_for_line("drain ready", timeout)
            # The app's own warm-up event has been through the backoff query: the
            # timed scenarios do not pay for its first Python workers and plans.
            self.child.wait_for_line("backoff first batch done", timeout)
        else:
            # A restart mid-test: both queries running is what there is (the test
            # wants to see the drain resume, not wait for it).
            self.child.wait_for_line("dwell spark app running", timeout)
        self.starts.append(time.monotonic() - t0)

    def running(self) -> bool:
        return self.child is not None and self.child.running()

    def ensure(self, *, strict: bool) -> None:
        if self.running() and self.strict == strict:
            return
        self.stop()
        # A mode change between tests: the next test starts on an app as warm as the
        # first one was (its timings do not pay for the first batches' Python workers).
        self.start(strict=strict, warm=True)

    def kill(self) -> None:
        """kill -9 of the driver, its JVM and its Python workers (its whole session)."""
        if self.child is not None:
            self.child.kill()

    def freeze(self) -> None:
        """SIGSTOP the driver, its JVM and its Python workers: what they have done stays
        as it is while a test looks (a kill takes a while, and the drain goes on)."""
        assert self.running() and self.child is not None
        self.child.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.child is not None
        self.child.signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()


@dataclass
class Dwell:
    """The e2e suite's running dwell: its services' URLs, Kafka, Redis and the Spark app."""

    admission: str
    strict_admission: str
    tracker: str
    policy: str
    bootstrap: str
    redis_url: str
    spark: SparkApp
    tracker_group: str = ""


def _ok(r: httpx.Response) -> httpx.Response:
    assert r.status_code < 300, (r.status_code, r.text)
    return r


@pytest.fixture(scope="package")
def e2e(services, stack: devstack.Stack, tmp_path_factory) -> Iterator[Dwell]:
    redis_url = redis_db_url(stack, E2E_REDIS_DB)
    redis_adapter.connect(redis_url).flushdb()
    # What this fixture starts stops with the package: a tracker left running would go on
    # indexing every later suite's delay-log records into this database, and rebuild it
    # whenever a later test flushes it.
    since = len(services.started)
    group = f"dwell-tracker-e2e-{uuid.uuid4().hex[:8]}"
    # The fresh group starts where the delay logs end now, not at their beginning.
    recovery.start_group_at_end(stack.kafka_bootstrap, group, [names.DELAYED, names.REFILED])
    policy = services.start("policy")
    # The suite publishes over HTTP only; no need to join the shared dwell.publish group.
    admission = services.start("admission", env={"DWELL_INGRESS_ENABLED": "false"})
    strict_admission = services.start("admission", env={
        "DWELL_INGRESS_ENABLED": "false", "DWELL_DELAYED_DELIVERY_DELIVER_AT_TIME_STRICT": "true"})
    tracker = services.start("tracker", env={
        "DWELL_REDIS_URL": redis_url, "DWELL_TRACKER_GROUP_ID": group,
        "DWELL_RESTAGE_LEAD_MS": str(RESTAGE_LEAD_MS),
        "DWELL_RESTAGE_CHUNK_MS": str(RESTAGE_CHUNK_MS), "DWELL_RESTAGE_LEASE_MS": "3000",
        "DWELL_RESTAGE_INTERVAL_MS": "200",
        # The trim goes round often, so that a consumer holds its messages across rounds.
        "DWELL_LOWMARK_INTERVAL_MS": str(LOWMARK_INTERVAL_MS),
        "DWELL_TRIM_INTERVAL_MS": str(TRIM_INTERVAL_MS)})
    jars = ",".join(str(p) for p in devstack.spark_kafka_jars())
    log_dir = stack.state / "test-logs"
    env = dict(os.environ) | stack.service_env() | {
        "DWELL_REDIS_URL": redis_url, "DWELL_SPARK_JARS": jars,
        "DWELL_SPARK_CHECKPOINT_DIR": str(tmp_path_factory.mktemp("spark-checkpoints")),
        "DWELL_ACKS_STARTING_OFFSETS": "latest", "PYSPARK_PYTHON": sys.executable,
        "DWELL_DRAIN_TRIGGER_MS": str(DRAIN_TRIGGER_MS),
        "DWELL_BACKOFF_TRIGGER_MS": str(BACKOFF_TRIGGER_MS),
        "DWELL_REDELIVERY_TICK_MS": str(REDELIVERY_TICK_MS),
        "DWELL_DRAIN_LEASE_MS": str(DRAIN_LEASE_MS),
        "DWELL_LOG_LEVEL": "info"}
    spark = SparkApp(env, log_dir)
    try:
        spark.start()
        yield Dwell(admission.url, strict_admission.url, tracker.url, policy.url,
                    stack.kafka_bootstrap, redis_url, spark, group)
    finally:
        spark.stop()
        print(f"spark app start times (s): {[round(s, 1) for s in spark.starts]}")
        services.stop_all(since)


def make_namespace(policy: httpx.Client, tenant: str) -> None:
    """The tenant and its namespace `ns`, with delayed delivery (tickTime 1 s, max delay
    60 s), through the policy service's client ``policy``."""
    _ok(policy.put(f"/admin/v2/tenants/{tenant}",
                   json={"adminRoles": [], "allowedClusters": []}))
    _ok(policy.put(f"/admin/v2/namespaces/{tenant}/ns"))
    _ok(policy.post(f"/admin/v2/namespaces/{tenant}/ns/delayedDelivery",
                    json={"active": True, "tickTime": TICK_MS,
                          "maxDeliveryDelayInMillis": 60000}))


def make_topic(e2e: Dwell, tenant: str, admission: str | None = None) -> str:
    """A namespace with delayed delivery (tickTime 1 s, max delay 60 s) and its topic,
    once ``admission`` (default: the main one) has the policy from the feed."""
    with httpx.Client(base_url=e2e.policy, timeout=10) as policy:
        make_namespace(policy, tenant)
    topic = f"persistent://{tenant}/ns/orders"
    # The namespace and its max delay reach admission through the policy feed: poll
    # until a too-long delay is refused (a probe that is never stored).
    with httpx.Client(base_url=admission or e2e.admission, timeout=10) as client:
        deadline = time.monotonic() + 15
        while True:
            r = client.post(f"/topics/persistent/{tenant}/ns/orders",
                            json={"producerName": "probe",
                                  "messages": [{"payload": "x", "deliverAfterMs": 120000}]})
            body = r.json() if r.status_code == 200 else {}
            results = body.get("messagePublishResults", [{}])
            if r.status_code == 200 and results[0].get("errorCode") == 2:
                return topic
            assert time.monotonic() < deadline, f"policy never reached admission: {r.text}"
            time.sleep(0.1)


def new_tenant() -> str:
    return "t" + uuid.uuid4().hex[:10]


def consumer(e2e: Dwell, topic: str, sub: str, **kw) -> Consumer:
    return Consumer(topic, sub, bootstrap=e2e.bootstrap, tracker_url=e2e.tracker,
                    initial_position="earliest", **kw)


def warm_redelivery_path(e2e: Dwell, timeout: float = 120) -> None:
    """Messages delivered, redelivered after a 1 s ack timeout, then acked, until a
    redelivery comes within a second and the drain's margin of its due time, as a warm
    backoff brings it (or until ``timeout``). The first consumer events an app reads, and
    the first keys it writes, take several backoff micro-batches longer than later ones
    (~2.5 s per batch instead of ~0.5-1 s on this 2-core box, measured, and
    longer while another process takes a core), which a scenario timing its first
    redeliveries would otherwise measure."""
    ack_timeout_ms = 1000
    warm_ms = REDELIVERY_TICK_MS + SPARK_MARGIN_MS + 1000
    deadline = time.monotonic() + timeout
    topic = make_topic(e2e, new_tenant())
    c = consumer(e2e, topic, "warm", ack_timeout_ms=ack_timeout_ms)
    late: list[int] = []
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            while not late or (late[-1] > warm_ms and time.monotonic() < deadline):
                mid = p.send(f"warm-{len(late)}".encode())
                first = receive_one(c, timeout)
                again = receive_one(c, timeout)
                c.acknowledge(again.msg)
                assert first.msg.message_id == again.msg.message_id == mid
                late.append(again.after - first.before - ack_timeout_ms)
    finally:
        c.close()
    print(f"redelivery path warm: ms late per round {late}")


@dataclass(frozen=True)
class Received:
    """A message and when the receive call that returned it started and ended (ms): the
    SDK stamps its delivered event between the two."""

    before: int
    after: int
    msg: Message


def receive_one(c: Consumer, timeout: float) -> Received:
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"nothing received within {timeout}s"
        before = now_ms()
        m = c.receive(0.05)
        if m is not None:
            return Received(before, now_ms(), m)


def receive_all(consumers: dict[str, Consumer], want: int,
                timeout: float) -> dict[str, list[Received]]:
    """Poll every consumer until each has ``want`` messages."""
    got: dict[str, list[Received]] = {s: [] for s in consumers}
    deadline = time.monotonic() + timeout
    while any(len(v) < want for v in got.values()):
        assert time.monotonic() < deadline, {s: len(v) for s, v in got.items()}
        for sub, c in consumers.items():
            before = now_ms()
            m = c.receive(0.05)
            if m is not None:
                got[sub].append(Received(before, now_ms(), m))
    return got


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The scenarios that kill and restart the shared Spark app run after the other e2e
    tests, which then all start on the app as it first warmed up. After such a restart
    the backoff query has been seen to take minutes to decide again (an open issue in
    the notes), which would fail the timed redelivery scenarios for a reason of their
    neighbours' making."""
    restarting = [i for i in items if i.path.name == "test_delivery_recovery.py"]
    if not restarting:
        return
    rest = [i for i in items if i not in restarting]
    e2e = [n for n, i in enumerate(rest) if i.path.parent.name == "e2e"]
    at = e2e[-1] + 1 if e2e else len(rest)
    items[:] = rest[:at] + restarting + rest[at:]
