"""A property-based fuzz (hypothesis) of every input dwell reads, against its processes
running for real: forged records on `dwell.publish`, `dwell.policies` and `dwell.acks`
(values and headers), and HTTP requests on the three services' routes (bodies and
headers). After each input's fuzz:

- no process died: policy, admission, tracker and the Spark app are alive, and each
  answers /healthz 200;
- no HTTP answer was a 5xx;
- no reader stalled: a normal input of the same kind is handled within PROBE_S (a
  publish is delivered, a policy change is applied, an ack event is processed);
- each process's peak resident memory stayed within RSS_BOUND_MIB (VmHWM, reset before
  each input, and VmRSS sampled while it runs);
- no ack event copies another topic's record into the sender's retry or DLQ topic.

Everything runs on a Redis and Kafka of this module's own: forged `dwell.policies`
records are replayed by every admission that starts on a Kafka, and forged requests on
`dwell.publish` are read by every admission of its group, so none of them may reach the
other suites' servers. `make test` sends CASES per input; `make fuzz` (DWELL_FUZZ_FULL=1)
FULL_CASES. A summary table (cases per input, crashes, 5xx, worst RSS per process) is
printed at the end either way."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import topics as names
from dwell_dev import devstack
from dwell_dev.procs import alive
from dwell_dev.testkit import free_port, private_stack, read_until, wait_for

from . import strategies as hs

FULL = os.environ.get("DWELL_FUZZ_FULL") == "1"
CASES = 100
FULL_CASES = 2000
# A reader that has not handled a normal input this long after the fuzz has stalled: the
# backlog of forged records takes seconds on this 2-core box; a Spark micro-batch under
# load takes up to ~3 s.
PROBE_S = 30.0
# Peak resident memory per process. An idle service takes ~100 MiB here; a bounded
# reader holds a few records of at most ~1 MiB at once, and the Spark driver and JVM run
# with their settings' heaps. Past these, memory grows with the input.
RSS_BOUND_MIB = {"policy": 256, "admission": 256, "tracker": 256, "spark-driver": 512,
                 "spark-jvm": 1536}
# The Spark app's readers of dwell.acks warm up minutes after its start on this 2-core box.
SPARK_READY_S = 900.0
SERVICES = ("policy", "admission", "tracker")
PROCESSES = (*SERVICES, "spark")
SECRET = b"secret-of-victim"
# A Kafka record bigger than the broker's default max.message.bytes is refused by Kafka.
KAFKA_MAX_RECORD = 1_000_000


def hypothesis_settings() -> settings:
    return settings(max_examples=FULL_CASES if FULL else CASES, deadline=None,
                    derandomize=True, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- processes and memory


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process (KiB); empty once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in text.splitlines())
            if k in ("VmRSS", "VmHWM")}


def _java_child(pid: int) -> int | None:
    """The Spark driver's JVM: its child process running java."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            if ppid == pid and b"java" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except (OSError, IndexError, ValueError):
            continue
    return None


@dataclass
class Watch:
    """The pids of one input's run, their peak memory and whether they died."""

    pids: dict[str, int]
    peak_kib: dict[str, int] = field(default_factory=dict)
    died: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        for name, pid in self.pids.items():
            st_ = _status(pid)
            if not st_ or not alive(pid):
                self.died.add(name)
                continue
            self.peak_kib[name] = max(self.peak_kib.get(name, 0), st_.get("VmRSS", 0),
                                      st_.get("VmHWM", 0))

    def run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self.sample()


@dataclass
class Outcome:
    """What one input's fuzz saw, for the summary table."""

    cases: int = 0
    refused_by_kafka: int = 0
    status: dict[str, int] = field(default_factory=dict)
    five_xx: list[str] = field(default_factory=list)
    crashed: set[str] = field(default_factory=set)
    peak_mib: dict[str, float] = field(default_factory=dict)
    stalled: list[str] = field(default_factory=list)


@dataclass
class Fuzz:
    stack: devstack.Stack
    urls: dict[str, str]
    redis_url: str
    producer: confluent_kafka.Producer
    secret_ids: list[str]
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return self.stack.kafka_bootstrap

    def pids(self) -> dict[str, int]:
        out = {n: pid for n in PROCESSES if (pid := self.stack.pid(n))}
        if "spark" in out:
            out["spark-driver"] = out.pop("spark")
            if (jvm := _java_child(out["spark-driver"])) is not None:
                out["spark-jvm"] = jvm
        return out

    def watch(self) -> Watch:
        """Start watching every live process, their peak memory reset to now."""
        pids = self.pids()
        for pid in pids.values():
            with contextlib.suppress(OSError):  # gone already: the watch reports it
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        w = Watch(pids)
        threading.Thread(target=w.run, daemon=True).start()
        return w

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                headers: list[tuple[str, bytes]], outcome: Outcome) -> None:
        outcome.cases += 1
        size = len(value or b"") + len(key or b"") + sum(len(k) + len(v) for k, v in headers)
        if size > KAFKA_MAX_RECORD:
            outcome.refused_by_kafka += 1
            return
        while True:
            try:
                self.producer.produce(topic, value, key, headers=headers)
                break
            except BufferError:
                self.producer.poll(0.1)
            except confluent_kafka.KafkaException:
                outcome.refused_by_kafka += 1
                break
        self.producer.poll(0)


@pytest.fixture(scope="module")
def fuzz(request: pytest.FixtureRequest) -> Iterator[Fuzz]:
    """Redis, Kafka, the three services and the Spark app, all of this module's own;
    tenants `fz` (the fuzzer's), `victim` (another tenant, whose ready topic holds a
    secret on every partition) and `probe` (the normal inputs', named by no strategy)."""
    # Kept where the next run replaces them (pytest's temporary folders rotate).
    logs = devstack.STATE_ROOT / "fuzz-logs"
    shutil.rmtree(logs, ignore_errors=True)
    with private_stack("fuzz") as stack:
        stack.ports["spark"] = free_port()
        try:
            stack.start("redis")
            stack.start("kafka")
            kafka.ensure_dwell_topics(stack.kafka_bootstrap)
            for name in PROCESSES:
                stack.start(name)
            # /readyz answers once the drain runs; the ack readers warm up after it.
            spark_log = stack.log_dir / "spark.log"
            wait_for(lambda: "backoff first batch done" in spark_log.read_text(errors="replace"),
                     SPARK_READY_S, "the Spark app's 'backoff first batch done'")
            urls = {n: f"http://127.0.0.1:{stack.ports[n]}" for n in SERVICES}
            for tenant in (hs.OWN, hs.VICTIM, "probe"):
                make_namespace(urls["policy"], tenant)
            secret_ids = plant_secret(urls["admission"], stack.kafka_bootstrap)
            producer = confluent_kafka.Producer({
                "bootstrap.servers": stack.kafka_bootstrap, "linger.ms": 5,
                "message.max.bytes": KAFKA_MAX_RECORD + 100_000,
                # The broker stops before this producer is collected: its reconnects are noise.
                "log_level": 2})
            f = Fuzz(stack, urls, stack.redis_url, producer, secret_ids)
            yield f
            producer.flush(30)
            report(request, f, logs)
        finally:
            stack.down(["spark", *reversed(SERVICES)])
            # The processes' logs outlive the stack's state: a crash's traceback is there.
            shutil.copytree(stack.log_dir, logs, dirs_exist_ok=True)


def make_namespace(policy: str, tenant: str) -> None:
    with httpx.Client(base_url=policy, timeout=30) as c:
        for method, path, body in (
                ("PUT", f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": []}),
                ("PUT", f"/admin/v2/namespaces/{tenant}/ns", None),
                ("POST", f"/admin/v2/namespaces/{tenant}/ns/delayedDelivery",
                 {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 60_000})):
            r = c.request(method, path, json=body)
            assert r.status_code < 300, (path, r.status_code, r.text)


def plant_secret(admission: str, bootstrap: str) -> list[str]:
    """The victim's ready topic, created by a publish, then SECRET at the start of each of
    its partitions: the messageIds an ack event of another topic must not be able to use."""
    path = "/topics/persistent/victim/ns/secret"
    with httpx.Client(base_url=admission, timeout=30) as c:
        wait_for(lambda: c.post(path, json={"messages": [{"payload": "first"}]}).status_code
                 == 200, 30, "the victim's namespace at admission")
    ready = "victim.ns.secret"
    p = kafka.Producer(bootstrap, linger_ms=0)
    ids = []
    for part in kafka.end_offsets(bootstrap, ready):
        _, off = p.send(ready, SECRET, b"k", partition=part).result(15)
        ids.append(f"{ready}:{part}:{off}")
    p.close()
    return ids


# ---------------------------------------------------------------- the properties


def check_after(f: Fuzz, w: Watch, outcome: Outcome, probe: Callable[[], None]) -> None:
    """The properties every input's fuzz must leave true (module docstring)."""
    f.producer.flush(60)
    try:
        probe()
    except (AssertionError, httpx.HTTPError, kafka.KafkaUnavailable) as exc:
        outcome.stalled.append(f"{type(exc).__name__}: {str(exc)[:300]}")
    w.stop()
    outcome.crashed = set(w.died)
    outcome.peak_mib = {n: kib / 1024 for n, kib in w.peak_kib.items()}
    unhealthy = []
    for name in SERVICES:
        try:
            code = httpx.get(f.urls[name] + "/healthz", timeout=10).status_code
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        if code != 200:
            unhealthy.append(f"{name}: {code}")
    over = {n: round(mib) for n, mib in outcome.peak_mib.items()
            if mib > RSS_BOUND_MIB[n]}
    problems = [*(f"{n} died" for n in sorted(outcome.crashed)), *unhealthy,
                *(f"5xx: {x}" for x in outcome.five_xx[:5]),
                *(f"stalled: {x}" for x in outcome.stalled),
                *(f"RSS over bound (MiB): {n} {mib} > {RSS_BOUND_MIB[n]}"
                  for n, mib in over.items())]
    assert not problems, f"{len(outcome.five_xx)} 5xx; " + "; ".join(problems)


def probe_publish(f: Fuzz) -> None:
    """A well-formed request on dwell.publish is answered on dwell.publish.results and its
    message reaches the ready topic."""
    producer_name = "probe-" + uuid.uuid4().hex[:8]
    ready = "probe.ns.delivered"
    with httpx.Client(base_url=f.urls["admission"], timeout=30) as c:  # creates the topic
        r = c.post("/topics/persistent/probe/ns/delivered", json={"messages": [
            {"payload": "warm"}]})
        assert r.status_code == 200, r.text
    starts = kafka.end_offsets(f.bootstrap, ready)
    req = {"topic": "persistent://probe/ns/delivered", "producerName": producer_name,
           "messages": [{"payload": producer_name}]}
    f.producer.produce(names.PUBLISH, json.dumps(req).encode(), b"persistent://probe/ns/x")
    f.producer.flush(30)
    got = read_until(f.bootstrap, ready, starts,
                     lambda recs: any(r.value == producer_name.encode() for r in recs),
                     PROBE_S)
    assert any(r.value == producer_name.encode() for r in got), \
        f"a normal dwell.publish request not delivered in {PROBE_S}s"


def probe_policy(f: Fuzz) -> None:
    """A new namespace's max delay, set on the policy service, is applied by admission."""
    ns = "p" + uuid.uuid4().hex[:8]
    with httpx.Client(base_url=f.urls["policy"], timeout=30) as c:
        for method, path, body in (
                ("PUT", f"/admin/v2/namespaces/probe/{ns}", None),
                ("POST", f"/admin/v2/namespaces/probe/{ns}/delayedDelivery",
                 {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 5000})):
            r = c.request(method, path, json=body)
            assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text[:200]}"
    deadline = time.monotonic() + PROBE_S
    with httpx.Client(base_url=f.urls["admission"], timeout=30) as c:
        while True:
            r = c.post(f"/topics/persistent/probe/{ns}/x", json={"messages": [
                {"payload": "x", "deliverAfterMs": 120_000}]})
            if r.status_code == 200 and r.json()["messagePublishResults"][0]["errorCode"] == 2:
                return
            assert time.monotonic() < deadline, \
                f"a normal policy change not applied by admission in {PROBE_S}s: {r.text[:200]}"
            time.sleep(0.2)


def register(f: Fuzz, topic: str, sub: str) -> None:
    """The subscription registered at the tracker, as the SDK does before its first ack
    event: events of unknown subscriptions are set aside."""
    path = topic.replace("persistent://", "/v1/topics/persistent/", 1)
    r = httpx.put(f"{f.urls['tracker']}{path}/subscriptions/{sub}", json={}, timeout=30)
    assert r.status_code < 300, f"tracker: {r.status_code} {r.text[:200]}"


def probe_acks(f: Fuzz) -> None:
    """A well-formed `delivered` event reaches the subscription's redelivery index."""
    topic, sub = "persistent://probe/ns/acks", "s" + uuid.uuid4().hex[:6]
    register(f, topic, sub)
    mid = "probe.ns.acks:0:0"
    event = {"event": "delivered", "topic": topic, "subscription": sub, "messageId": mid,
             "ts": int(time.time() * 1000), "ackTimeoutMs": 600_000}
    f.producer.produce(names.ACKS, json.dumps(event).encode(), f"{topic}/{sub}".encode())
    f.producer.flush(30)
    r = redis_adapter.connect(f.redis_url)
    deadline = time.monotonic() + PROBE_S
    while not r.hexists(keys.sub_counts(topic, sub), mid):
        assert time.monotonic() < deadline, \
            f"a normal ack event not processed by the Spark app in {PROBE_S}s"
        time.sleep(0.2)


def probe_http(f: Fuzz) -> None:
    """Each service still answers a normal request: a publish, a policy change read back,
    a subscription registered and read back."""
    with httpx.Client(timeout=30) as c:
        r = c.post(f.urls["admission"] + "/topics/persistent/probe/ns/http",
                   json={"messages": [{"payload": "x"}]})
        assert r.status_code == 200 and r.json()["messagePublishResults"][0]["errorCode"] == 0, \
            f"admission: {r.status_code} {r.text[:200]}"
        pol = {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 7000}
        path = f.urls["policy"] + "/admin/v2/namespaces/probe/ns/delayedDelivery"
        r = c.post(path, json=pol)
        assert r.status_code == 204, f"policy: {r.status_code} {r.text[:200]}"
        assert c.get(path).json()["maxDeliveryDelayInMillis"] == 7000
        path = f.urls["tracker"] + "/v1/topics/persistent/probe/ns/http/subscriptions/s"
        r = c.put(path, json={"ackTimeoutMs": 30_000})
        assert r.status_code == 200, f"tracker: {r.status_code} {r.text[:200]}"
        assert c.get(path).json()["ackTimeoutMs"] == 30_000


# ---------------------------------------------------------------- Kafka inputs


def test_ack_events_copy_only_their_own_topics_records(fuzz: Fuzz) -> None:
    """Ack events of the fuzzer's topic naming the victim's records (every partition), as
    dead letters and as redeliveries: none of them may put a record of another topic on
    the fuzzer's retry or DLQ topics."""
    outcome = fuzz.outcomes.setdefault("dwell.acks (messageIds)", Outcome())
    w = fuzz.watch()
    topic = f"persistent://{hs.OWN}/ns/a"
    register(fuzz, topic, "s")
    now = int(time.time() * 1000)
    for mid in fuzz.secret_ids:
        for count, extra in ((1, {"maxRedeliverCount": 1}),
                             (0, {"negativeAckRedeliveryBackoff": {
                                 "minDelayMs": 1, "maxDelayMs": 1, "multiplier": 1.0}})):
            event = {"event": "nack", "topic": topic, "subscription": "s", "messageId": mid,
                     "redeliveryCount": count, "ts": now} | extra
            fuzz.produce(names.ACKS, json.dumps(event).encode(), f"{topic}/s".encode(), [],
                         outcome)
    check_after(fuzz, w, outcome, lambda: probe_acks(fuzz))
    # The redeliveries were due at once: past the probe, the drain has had its rounds.
    # Nothing was ever published to the fuzzer's topic `a`, so anything on its
    # subscription's retry or DLQ topic was copied from another topic.
    leaked: list[str] = []

    def look() -> bool:
        for t in (f"{hs.OWN}.ns.a-s-DLQ", f"{hs.OWN}.ns.a-s-RETRY"):
            try:
                parts = kafka.partitions(fuzz.bootstrap, t, timeout=5)
            except kafka.KafkaUnavailable:
                continue  # never created: nothing copied there
            recs = kafka.read_from(fuzz.bootstrap, t, dict.fromkeys(parts, 0), 5)
            leaked.extend(f"{t}@{r.partition}:{r.offset} {(r.value or b'')[:40]!r}"
                          for r in recs)
        return bool(leaked)

    wait_for_quiet(look, 15)
    assert not leaked, f"another topic's records copied: {leaked[:5]} ({len(leaked)})"


def wait_for_quiet(found: Callable[[], bool], seconds: float) -> None:
    """Poll ``found`` for ``seconds`` (a copy is made a drain round or two after the
    event), stopping as soon as it holds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not found():
        time.sleep(1)


def test_publish_records(fuzz: Fuzz) -> None:
    outcome = fuzz.outcomes.setdefault(names.PUBLISH, Outcome())
    w = fuzz.watch()

    @hypothesis_settings()
    @given(value=hs.encoded(hs.publish_request(with_topic=True)),
           key=st.one_of(st.none(), st.sampled_from(hs.TOPICS).map(str.encode)),
           headers=hs.headers(hs.PUBLISH_HEADERS))
    # Each of these found a bug: a request of many bad items (memory grew with their
    # square) and one nested past Python's recursion limit (the reader's thread died).
    @example(value=json.dumps({"topic": "persistent://hostile/ns/x",
                               "messages": [1] * 2000}).encode(), key=None, headers=[])
    @example(value=hs.DEEP_OBJECT, key=None, headers=[])
    def case(value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        fuzz.produce(names.PUBLISH, value, key, headers, outcome)

    case()
    check_after(fuzz, w, outcome, lambda: probe_publish(fuzz))


def test_policy_records(fuzz: Fuzz) -> None:
    outcome = fuzz.outcomes.setdefault(names.POLICIES, Outcome())
    w = fuzz.watch()

    @hypothesis_settings()
    @given(scope=hs.policy_scope(), value=hs.policy_value(),
           headers=hs.headers(hs.POLICY_HEADERS))
    # This found a bug: a tenant record whose `tenant` is not an object (the feed's
    # follower thread died; admission applied no policy change after it).
    @example(scope=f"tenant:{hs.OWN}", value=b'{"version": 1, "tenant": "x"}', headers=[])
    def case(scope: str, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        fuzz.produce(names.POLICIES, value, scope.encode(errors="surrogatepass"), headers,
                     outcome)

    case()
    check_after(fuzz, w, outcome, lambda: probe_policy(fuzz))


def test_ack_events(fuzz: Fuzz) -> None:
    outcome = fuzz.outcomes.setdefault(names.ACKS, Outcome())
    # Subscription `s` registered on the real topics, so events naming it are judged on
    # their fields, past the registry's check.
    for topic in (f"persistent://{hs.OWN}/ns/x", f"persistent://{hs.VICTIM}/ns/secret"):
        register(fuzz, topic, "s")
    w = fuzz.watch()

    @hypothesis_settings()
    @given(value=hs.encoded(hs.ack_event()),
           key=st.one_of(st.none(), st.just(b"persistent://fz/ns/x/s"), st.binary(max_size=8)),
           headers=hs.headers(hs.ACK_HEADERS))
    # Each of these found a bug: an event nested past Python's recursion limit (the
    # check failed), one naming a position past its partition's end (the
    # backoff's batch waited for it, failed twice and stopped the app), `ts` = Long.MAX
    # (the backoff's arithmetic overflowed).
    @example(value=hs.DEEP_OBJECT, key=None, headers=[])
    @example(value=json.dumps({"event": "nack", "topic": f"persistent://{hs.OWN}/ns/x",
                               "subscription": "s", "messageId": "dwell.delayed:0:999999",
                               "redeliveryCount": 1, "maxRedeliverCount": 1, "ts": 1}).encode(),
             key=None, headers=[])
    @example(value=json.dumps({"event": "nack", "topic": hs.WARM_UP_TOPIC, "subscription": "x",
                               "messageId": "dwell.delayed:0:0", "ts": hs.LONG_MAX}).encode(),
             key=None, headers=[])
    def case(value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        fuzz.produce(names.ACKS, value, key, headers, outcome)

    case()
    check_after(fuzz, w, outcome, lambda: probe_acks(fuzz))


# ---------------------------------------------------------------- HTTP inputs


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")


ROUTES: dict[str, list[tuple[str, str, str]]] = {
    # service: (method, path with {t} {ns} {x} {sub} {p}, body kind)
    "admission": [("POST", "/topics/{domain}/{t}/{ns}/{x}", "publish"),
                  ("POST", "/topics/{domain}/{t}/{ns}/{x}/partitions/{p}", "publish")],
    "policy": [("PUT", "/admin/v2/tenants/{t}", "tenant"),
               ("POST", "/admin/v2/tenants/{t}", "tenant"),
               ("GET", "/admin/v2/tenants/{t}", "none"),
               ("PUT", "/admin/v2/namespaces/{t}/{ns}", "any"),
               ("GET", "/admin/v2/namespaces/{t}/{ns}", "none"),
               ("POST", "/admin/v2/namespaces/{t}/{ns}/delayedDelivery", "delayed"),
               ("GET", "/admin/v2/namespaces/{t}/{ns}/delayedDelivery", "none"),
               ("POST", "/admin/v2/persistent/{t}/{ns}/{x}/delayedDelivery", "delayed"),
               ("GET", "/admin/v2/persistent/{t}/{ns}/{x}/delayedDelivery?applied=true",
                "none"),
               ("PUT", "/admin/v2/persistent/{t}/{ns}/{x}/partitions", "number"),
               ("PUT", "/admin/v2/persistent/{t}/{ns}/{x}", "any")],
    "tracker": [("PUT", "/v1/topics/{domain}/{t}/{ns}/{x}/subscriptions/{sub}", "subscription"),
                ("GET", "/v1/topics/{domain}/{t}/{ns}/{x}/subscriptions/{sub}", "none"),
                ("GET", "/v1/topics/{domain}/{t}/{ns}/{x}/stats", "none"),
                ("GET", "/admin/v2/persistent/{t}/{ns}/{x}/stats", "none"),
                ("GET", "/v1/stats", "none")],
}

BODIES: dict[str, st.SearchStrategy[Any]] = {
    "publish": hs.publish_request(with_topic=False),
    "tenant": hs.tenant_info(),
    "delayed": hs.delayed_delivery(),
    "subscription": hs.shaped(hs.subscription_settings()),
    "number": hs.numbers(),
    "any": hs.values(),
}


def body_for(kind: str) -> st.SearchStrategy[bytes | None]:
    if kind == "none":
        return st.one_of(st.none(), hs.encoded(hs.values()))
    return st.one_of(hs.encoded(BODIES[kind]), hs.oversized_body(), st.none())


def request_case(service: str) -> st.SearchStrategy[tuple[str, str, bytes | None]]:
    # The fuzzer's tenant and the victim's (as the route's tenant) but never `probe`.
    names_ = st.fixed_dictionaries({
        "domain": st.sampled_from(["persistent", "non-persistent", "kafka", ""]),
        "t": st.sampled_from(hs.TENANTS), "ns": st.sampled_from(["ns", "x" * 300, "..", "n s"]),
        "x": st.sampled_from(["x", "secret", "a" * 300, "x-partition-7", "ü"]),
        "sub": st.sampled_from(["s", "a" * 300, "s-DLQ", "ü"]),
        "p": st.sampled_from(["0", "-1", str(hs.LONG_MAX), "x"])})
    return st.sampled_from(ROUTES[service]).flatmap(lambda route: st.tuples(
        st.just(route[0]),
        names_.map(lambda n: route[1].format(**{k: _seg(v) for k, v in n.items()})),
        body_for(route[2])))


# Inputs every run sends first, each one that found a bug: a tenant too big for one Kafka
# record (500, then a policy service that never gets ready again), objects nested past
# Python's recursion limit (500 RecursionError), and arrays nested deeper still (admission's
# native parser overflowed its stack: the process died). Admission's run is the last one.
KNOWN_HTTP: dict[str, list[tuple[str, str, bytes]]] = {
    # On `probe`, a namespace the forged policy records never name: admission knows it.
    "admission": [("POST", "/topics/persistent/probe/ns/deep", hs.DEEP_OBJECT),
                  ("POST", "/topics/persistent/probe/ns/deep", hs.DEEP_ARRAY)],
    "policy": [("PUT", f"/admin/v2/tenants/{hs.OWN}big", json.dumps(
        {"adminRoles": [f"role-{i:010d}" for i in range(90_000)]}).encode()),
               ("POST", f"/admin/v2/namespaces/{hs.OWN}/ns/delayedDelivery", hs.DEEP_OBJECT)],
    "tracker": [("PUT", f"/v1/topics/persistent/{hs.OWN}/ns/x/subscriptions/s",
                 hs.DEEP_OBJECT)],
}


@pytest.mark.parametrize("service", ["policy", "tracker", "admission"])
def test_http_requests(fuzz: Fuzz, service: str) -> None:
    outcome = fuzz.outcomes.setdefault(f"HTTP {service}", Outcome())
    w = fuzz.watch()
    client = httpx.Client(base_url=fuzz.urls[service], timeout=60)

    def case(req: tuple[str, str, bytes | None], headers: list[tuple[str, str]]) -> None:
        method, path, body = req
        outcome.cases += 1
        try:
            r = client.request(method, path, content=body, headers=headers)
            code = str(r.status_code)
            if r.status_code >= 500:
                outcome.five_xx.append(
                    f"{method} {path[:80]} body {len(body or b'')} B {body[:12] if body else ''!r}"
                    f" headers {len(headers)} ({sum(len(v) for _, v in headers)} B): "
                    f"{r.status_code} {r.text[:120]}")
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        outcome.status[code] = outcome.status.get(code, 0) + 1

    for known in KNOWN_HTTP[service]:
        case = example(req=known, headers=[("content-type", "application/json")])(case)
    try:
        hypothesis_settings()(given(req=request_case(service), headers=hs.http_headers())(
            case))()
    finally:
        client.close()
    check_after(fuzz, w, outcome, lambda: probe_http(fuzz))


# ---------------------------------------------------------------- the summary


def report(request: pytest.FixtureRequest, f: Fuzz, logs: Path) -> None:
    procs = ("policy", "admission", "tracker", "spark-driver", "spark-jvm")
    lines = [f"fuzz summary ({'make fuzz' if FULL else 'short form'}; RSS bound MiB: "
             + ", ".join(f"{p} {RSS_BOUND_MIB[p]}" for p in procs) + ")",
             f"{'input':<26}{'cases':>7}{'kafka-refused':>14}{'crashes':>8}{'5xx':>6}"
             f"{'stalled':>8}  worst RSS MiB (" + " / ".join(procs) + ")"]
    notes = []
    for name, o in f.outcomes.items():
        rss = " / ".join(f"{o.peak_mib[p]:.0f}" if p in o.peak_mib else "-" for p in procs)
        lines.append(f"{name:<26}{o.cases:>7}{o.refused_by_kafka:>14}{len(o.crashed):>8}"
                     f"{len(o.five_xx):>6}{len(o.stalled):>8}  {rss}")
        if o.status:
            notes.append(f"{name}: answers " + ", ".join(
                f"{k} x{v}" for k, v in sorted(o.status.items())))
        if o.crashed:
            notes.append(f"{name}: died while it ran: {', '.join(sorted(o.crashed))}")
        notes += [f"{name}: 5xx: {x}" for x in o.five_xx[:3]]
        notes += [f"{name}: stalled: {x.splitlines()[0]}" for x in o.stalled]
    text = "\n".join([*lines, *notes, f"the processes' logs: {logs}"])
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("\n" + text)
    else:
        print(text)
