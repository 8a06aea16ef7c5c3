"""Delivery end to end: policy, admission, tracker and the Spark app (drain + backoff) as
real processes on the test Redis/Kafka, driven through the SDK.

The tracker and the Spark app use their own Redis database and a fresh tracker group that
starts at the current end of dwell.delayed, so this module drains only what is published
while it runs, and never claims buckets other suites' tracker tests are looking at."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.client import (
    Consumer,
    ExponentialRedeliveryBackoff,
    Message,
    NotAllowedError,
    Producer,
)
from dwell.core import topics as names
from dwell.core.topics import TopicName, dlq_topic

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import devstack  # noqa: E402

TICK_MS = 1000
# How late the Spark drain may be beyond Pulsar's own bound (tickTime + 1 s): one drain
# trigger (250 ms) plus one Spark job that reads and writes the bucket (~0.3-0.8 s here,
# measured; the rest is headroom for the 2 shared cores).
SPARK_MARGIN_MS = 1500
E2E_REDIS_DB = 7


@dataclass
class Stack:
    admission: str
    tracker: str
    policy: str
    bootstrap: str
    spark_log: Path


def _ok(r: httpx.Response) -> httpx.Response:
    assert r.status_code < 300, (r.status_code, r.text)
    return r


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"spark app exited {proc.returncode}:\n"
                               + log.read_text(errors="replace")[-4000:])
        if line in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"spark app not running after {timeout}s:\n"
                       + log.read_text(errors="replace")[-4000:])


@pytest.fixture(scope="module")
def e2e(services, stack: devstack.Stack, tmp_path_factory) -> Iterator[Stack]:  # noqa: ANN001
    redis_url = stack.redis_url.rsplit("/", 1)[0] + f"/{E2E_REDIS_DB}"
    redis_adapter.connect(redis_url).flushdb()
    group = f"dwell-tracker-e2e-{uuid.uuid4().hex[:8]}"
    # The fresh group starts where dwell.delayed ends now, not at its beginning.
    ends = kafka.end_offsets(stack.kafka_bootstrap, names.DELAYED)
    c = kafka.Consumer(stack.kafka_bootstrap, group)
    c.commit({(names.DELAYED, p): o for p, o in ends.items()})
    c.close()
    policy = services.start("policy")
    admission = services.start("admission")
    tracker = services.start("tracker", env={"DWELL_REDIS_URL": redis_url,
                                             "DWELL_TRACKER_GROUP_ID": group})
    jars = ",".join(str(p) for p in devstack.spark_kafka_jars())
    log = stack.state / "test-logs" / f"spark-{uuid.uuid4().hex[:6]}.log"
    env = dict(os.environ) | stack.service_env() | {
        "DWELL_REDIS_URL": redis_url, "DWELL_SPARK_JARS": jars,
        "DWELL_SPARK_CHECKPOINT_DIR": str(tmp_path_factory.mktemp("spark-checkpoints")),
        "DWELL_ACKS_STARTING_OFFSETS": "latest", "PYSPARK_PYTHON": sys.executable,
        "DWELL_LOG_LEVEL": "info"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dwell_spark"], cwd=ROOT / "spark",
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_for_line(proc, log, "drain ready", 120)
        _wait_for_line(proc, log, "backoff ready", 60)
        yield Stack(admission.url, tracker.url, policy.url, stack.kafka_bootstrap, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_topic(e2e: Stack, unique: str) -> str:
    with httpx.Client(base_url=e2e.policy, timeout=10) as policy:
        _ok(policy.put(f"/admin/v2/tenants/{unique}",
                       json={"adminRoles": [], "allowedClusters": []}))
        _ok(policy.put(f"/admin/v2/namespaces/{unique}/ns"))
        _ok(policy.post(f"/admin/v2/namespaces/{unique}/ns/delayedDelivery",
                        json={"active": True, "tickTime": TICK_MS,
                              "maxDeliveryDelayInMillis": 60000}))
    topic = f"persistent://{unique}/ns/orders"
    # The namespace and its max delay reach admission through the policy feed: poll
    # until a too-long delay is refused (a probe that is never stored).
    with httpx.Client(base_url=e2e.admission, timeout=10) as admission:
        deadline = time.monotonic() + 15
        while True:
            r = admission.post(f"/topics/persistent/{unique}/ns/orders",
                               json={"producerName": "probe",
                                     "messages": [{"payload": "x", "deliverAfterMs": 120000}]})
            body = r.json() if r.status_code == 200 else {}
            results = body.get("messagePublishResults", [{}])
            if r.status_code == 200 and results[0].get("errorCode") == 2:
                return topic
            assert time.monotonic() < deadline, f"policy never reached admission: {r.text}"
            time.sleep(0.1)


def consumer(e2e: Stack, topic: str, sub: str, **kw) -> Consumer:  # noqa: ANN003
    return Consumer(topic, sub, bootstrap=e2e.bootstrap, tracker_url=e2e.tracker,
                    initial_position="earliest", **kw)


def receive_all(consumers: dict[str, Consumer], want: int,
                timeout: float) -> dict[str, list[tuple[int, Message]]]:
    """Poll every consumer until each has ``want`` messages; (receive time ms, message)."""
    got: dict[str, list[tuple[int, Message]]] = {s: [] for s in consumers}
    deadline = time.monotonic() + timeout
    while any(len(v) < want for v in got.values()):
        assert time.monotonic() < deadline, {s: len(v) for s, v in got.items()}
        for sub, c in consumers.items():
            m = c.receive(0.05)
            if m is not None:
                got[sub].append((int(time.time() * 1000), m))
    return got


def test_delayed_messages_reach_each_subscription_once_on_time(e2e: Stack, unique: str) -> None:
    topic = make_topic(e2e, unique)
    subs = {s: consumer(e2e, topic, s) for s in ("billing", "audit")}
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            ids = {p.send(b"in-2s", key="k2", properties={"a": "1"}, deliver_after=2000): 2000,
                   p.send(b"in-5s", key="k5", deliver_after=5000): 5000}
        got = receive_all(subs, 2, timeout=20)
        # Nothing more arrives: no duplicates survive to the application.
        for c in subs.values():
            assert c.receive(1.5) is None
        lateness = []
        for sub, msgs in got.items():
            assert sorted(m.message_id for _, m in msgs) == sorted(ids), sub
            for received, m in msgs:
                assert m.deliver_at is not None and m.redelivery_count == 0
                assert received >= m.deliver_at - TICK_MS, (sub, received - m.deliver_at)
                assert received <= m.deliver_at + TICK_MS + 1000 + SPARK_MARGIN_MS, \
                    (sub, received - m.deliver_at)
                lateness.append(received - m.deliver_at)
                subs[sub].acknowledge(m)
        first = next(m for _, m in got["billing"] if m.value == b"in-2s")
        assert first.key == "k2" and first.properties == {"a": "1"}
        print(f"lateness ms (received - deliverAt): {sorted(lateness)}")
    finally:
        for c in subs.values():
            c.close()


def test_max_delay_rejection_is_typed(e2e: Stack, unique: str) -> None:
    topic = make_topic(e2e, unique)
    with Producer(topic, admission_url=e2e.admission) as p, \
            pytest.raises(NotAllowedError, match="Exceeds max allowed delivery delay"):
        p.send(b"x", deliver_after=120000)


def test_nack_backoff_then_dead_letter(e2e: Stack, unique: str) -> None:
    topic = make_topic(e2e, unique)
    backoff = ExponentialRedeliveryBackoff.builder().min_delay_ms(1000).max_delay_ms(4000) \
        .multiplier(2).build()
    c = consumer(e2e, topic, "work", negative_ack_redelivery_backoff=backoff,
                 max_redeliver_count=2)
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"job", key="j")
        nacked_at = []
        for expected_count in (0, 1, 2):
            got = receive_all({"work": c}, 1, timeout=15)["work"]
            received, m = got[0]
            assert m.message_id == mid and m.redelivery_count == expected_count
            assert m.value == b"job" and m.key == "j"
            if nacked_at:
                # Redelivery n comes backoff.next(n - 1) after the nack, never earlier.
                assert received >= nacked_at[-1] + backoff.next(expected_count - 1)
            nacked_at.append(int(time.time() * 1000))
            c.negative_acknowledge(m)
        # Past maxRedeliverCount the message goes to the DLQ, not back to the consumer.
        assert c.receive(3) is None
        dlq = dlq_topic(TopicName.parse(topic), "work")
        reader = kafka.Consumer(e2e.bootstrap, f"dlq-{unique}", [dlq])
        try:
            deadline = time.monotonic() + 15
            recs: list[kafka.Record] = []
            while not recs:
                assert time.monotonic() < deadline, "nothing on the DLQ"
                recs = reader.poll(10, 0.5)
        finally:
            reader.close()
        assert recs[0].value == b"job" and recs[0].header("dwell-message-id") == mid
        assert recs[0].header("dwell-redelivery-count") == "2"
    finally:
        c.close()


def test_ack_timeout_redelivers_with_backoff_until_acked(e2e: Stack, unique: str) -> None:
    topic = make_topic(e2e, unique)
    backoff = ExponentialRedeliveryBackoff(min_delay_ms=500, max_delay_ms=5000, multiplier=2)
    c = consumer(e2e, topic, "slow", ack_timeout_ms=1000, ack_timeout_redelivery_backoff=backoff)
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"late-ack", deliver_after=1000)
        received, first = receive_all({"slow": c}, 1, timeout=15)["slow"][0]
        assert first.message_id == mid and first.redelivery_count == 0
        # Not acked: back after ackTimeout + backoff.next(0), as redelivery 1.
        again_at, again = receive_all({"slow": c}, 1, timeout=15)["slow"][0]
        assert again.message_id == mid and again.redelivery_count == 1
        assert again_at >= received + 1000 + backoff.next(0)
        c.acknowledge(again)
        # Acked: the timer is gone, nothing comes back after ackTimeout + next(1).
        assert c.receive((1000 + backoff.next(1) + 2000) / 1000) is None
    finally:
        c.close()
