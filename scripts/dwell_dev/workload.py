"""The workload of the fault suite (tests/faults) and of bench/soak.py, and its
bookkeeping: a generator that publishes over HTTP with mixed delays, a checker that reads
the ready topics with a plain Kafka consumer, an SDK consumer in a process of its own,
and the row each scenario prints.

Every message's payload is a unique id, so the checker can tell, per accepted message,
whether it arrived, how often, and how early or late against the deliverAt admission
answered with."""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, TopicPartition

from dwell.adapters import kafka
from dwell.core.topics import TopicName
from dwell_dev import devstack
from dwell_dev.procs import Child

# Re-exported: the fault suite and the soak take it from workload.
from dwell_dev.testkit import now_ms

TICK_MS = 1000


# ---------------------------------------------------------------- the stack

# The fault suite's and the soak's process settings: a short drain lease and restage lead,
# so that delays of a few seconds take the re-filing path and a killed drain's claims
# come back within seconds.
PROCESS_SETTINGS = {
    "DWELL_DRAIN_TRIGGER_MS": "250", "DWELL_DRAIN_LEASE_MS": "5000",
    "DWELL_RESTAGE_LEAD_MS": "4000", "DWELL_RESTAGE_CHUNK_MS": "2000",
    "DWELL_RESTAGE_LEASE_MS": "3000", "DWELL_RESTAGE_INTERVAL_MS": "200",
    # A loop stuck for this long fails the tracker's /healthz (each scenario checks it).
    "DWELL_STALL_TIMEOUT_MS": "60000",
    "DWELL_LOG_LEVEL": "info",
}


class FaultStack(devstack.Stack):
    """devstack's stack with the settings above, and the faults a scenario injects."""

    def service_env(self) -> dict[str, str]:
        return super().service_env() | PROCESS_SETTINGS

    DWELL = ("policy", "admission", "tracker", "spark")

    def start_all(self) -> None:
        """Everything afresh: what runs is stopped, then Redis and Kafka are started empty
        (Kafka with dwell's topics), then dwell's processes."""
        self.down()
        for name in ("redis", "kafka"):
            self.start_empty(name)
        kafka.ensure_dwell_topics(self.kafka_bootstrap)
        for name in self.DWELL:
            self.start(name)

    def kill9(self, name: str) -> None:
        pid = self.pid(name)
        assert pid, f"{name} is not running"
        # Its whole session: its forks (Redis' rewrite child) hold the listening socket.
        Child(name, pid, self.log_dir / f"{name}.log").kill()
        port = self.ports.get(name)
        while port and devstack.port_open(port):
            time.sleep(0.05)
        self._pidfile(name).unlink(missing_ok=True)

    def spark_python_workers(self) -> list[int]:
        """Python processes of the Spark app other than its driver: PySpark's worker
        daemon and the workers it forked."""
        driver = self.pid("spark")
        assert driver, "the Spark app is not running"
        out = []
        for pid in _descendants(driver):
            argv = _cmdline(pid).split()
            # The JVM's command line names the daemon module too (a --conf): match argv[0].
            if argv and Path(argv[0].decode()).name.startswith("python") and any(
                    a.endswith(b"daemon") or b"pyspark.worker" in a for a in argv[1:]):
                out.append(pid)
        return sorted(out)

    def make_namespace(self, tenant: str) -> None:
        """Tenant ``tenant`` with namespace ``ns``: delayed delivery on, tick 1 s, max 10 min."""
        base = f"http://127.0.0.1:{self.ports['policy']}"
        with httpx.Client(base_url=base, timeout=10) as c:
            for method, path, body in (
                    ("PUT", f"/admin/v2/tenants/{tenant}",
                     {"adminRoles": [], "allowedClusters": []}),
                    ("PUT", f"/admin/v2/namespaces/{tenant}/ns", None),
                    ("POST", f"/admin/v2/namespaces/{tenant}/ns/delayedDelivery",
                     {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 600_000})):
                r = c.request(method, path, json=body)
                assert r.status_code < 300, (path, r.status_code, r.text)

    def memory_maps(self) -> dict[str, dict[str, int]]:
        """:func:`memory_map_kib` of dwell's Python services (the Spark app: its driver)."""
        return {("spark-driver(py)" if n == "spark" else n): memory_map_kib(pid)
                for n in ("policy", "admission", "tracker", "spark")
                if (pid := self.pid(n))}

    def allocators(self) -> dict[str, dict[str, float]]:
        """Each Python service's allocator figures (MiB), from its /metrics
        (dwell.memory.AllocatorCollector): glibc's in_use, free and mapped bytes, and
        Python's allocated blocks (thousands)."""
        out: dict[str, dict[str, float]] = {}
        for name in ("policy", "admission", "tracker", "spark"):
            try:
                text = httpx.get(f"http://127.0.0.1:{self.ports[name]}/metrics",
                                 timeout=5).text
            except httpx.HTTPError:
                continue
            fig: dict[str, float] = {}
            for line in text.splitlines():
                if line.startswith("dwell_process_allocator_bytes{"):
                    state = line.split('state="', 1)[1].split('"', 1)[0]
                    fig[state] = float(line.rsplit(" ", 1)[1]) / 2**20
                elif line.startswith("dwell_process_python_blocks "):
                    fig["py_kblocks"] = float(line.rsplit(" ", 1)[1]) / 1000
            out["spark-driver(py)" if name == "spark" else name] = fig
        return out

    def rss_kib(self) -> dict[str, int]:
        """Resident memory of each running process (KiB); the Spark app split into its
        JVM, its driver's Python and the rest of its Python processes."""
        out: dict[str, int] = {}
        for name in ("redis", "kafka", "policy", "admission", "tracker", "spark"):
            pid = self.pid(name)
            if not pid:
                continue
            if name != "spark":
                out[name] = _rss_kib(pid)
                continue
            out["spark-driver(py)"] = _rss_kib(pid)
            for child in _descendants(pid):
                cmd = _cmdline(child)
                key = "spark-jvm" if b"java" in cmd else "spark-workers(py)"
                out[key] = out.get(key, 0) + _rss_kib(child)
        return out


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (PySpark's worker daemon leaves the driver's process
    group, so a group is not enough)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def memory_map_kib(pid: int) -> dict[str, int]:
    """Where a process's resident memory sits (KiB): `heap` (the main allocator arena),
    `anon` (thread arenas, Python's object arenas, large allocations), `file` (code and
    data of the executables and libraries)."""
    out = {"heap": 0, "anon": 0, "file": 0}
    kind = "anon"
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) == 6 else ""
            kind = "heap" if name == "[heap]" else "file" if name.startswith("/") else "anon"
        elif line.startswith("Rss:"):
            out[kind] += int(line.split()[1])
    return out


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------- generator


@dataclass
class Published:
    """What the generator knows of what it sent: accepted ids with their deliverAt, and
    what admission refused (503s and requests that got no answer)."""

    deliver_at: dict[str, int] = field(default_factory=dict)
    topic_of: dict[str, str] = field(default_factory=dict)
    message_id: dict[str, str] = field(default_factory=dict)  # the id admission returned
    schedule_key: dict[str, str] = field(default_factory=dict)  # of those sent with one
    refused: int = 0  # messages of requests answered 503 (with Retry-After)
    refused_without_retry_after: int = 0
    unanswered: int = 0  # messages of requests that timed out or hit a closed port
    other_errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, ids: list[str], topic: str, send_ms: int, resp: httpx.Response) -> None:
        with self.lock:
            if resp.status_code == 503:
                self.refused += len(ids)
                if "retry-after" not in resp.headers:
                    self.refused_without_retry_after += len(ids)
                return
            if resp.status_code != 200:
                self.other_errors.append(f"{resp.status_code} {resp.text[:200]}")
                return
            for mid, res in zip(ids, resp.json()["messagePublishResults"], strict=True):
                if res.get("errorCode") == 0:
                    self.deliver_at[mid] = int(res.get("deliverAt") or send_ms)
                    self.topic_of[mid] = topic
                    self.message_id[mid] = res["messageId"]
                else:
                    self.other_errors.append(json.dumps(res)[:200])


class Generator(threading.Thread):
    """Publishes ``rate`` messages a second over HTTP, in requests of ``batch``, each with
    a delay drawn uniformly from 0..``max_delay_ms`` (a fifth of them immediate), spread
    over ``topics``, until stopped; with ``token`` as its bearer token."""

    def __init__(self, admission: str, topics: list[str], *, rate: int, max_delay_ms: int,
                 batch: int = 20, seed: int = 1, token: str | None = None) -> None:
        super().__init__(name="fault-generator", daemon=True)
        self.admission = admission
        self.topics = topics
        self.rate = rate
        self.max_delay_ms = max_delay_ms
        self.batch = batch
        self.rng = random.Random(seed)
        self.out = Published()
        self.prefix = uuid.uuid4().hex[:6]
        self.seq = 0
        self.stopping = threading.Event()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def run(self) -> None:
        interval = self.batch / self.rate
        next_at = time.monotonic()
        # Longer than admission's publish timeout (10 s): a request Kafka cannot take
        # gets its 503 rather than no answer.
        with httpx.Client(base_url=self.admission, timeout=15, headers=self.headers) as client:
            while not self.stopping.is_set():
                topic = self.topics[self.seq // self.batch % len(self.topics)]
                self.send(client, topic)
                next_at += interval
                self.stopping.wait(max(0.0, next_at - time.monotonic()))

    def send(self, client: httpx.Client, topic: str, count: int | None = None,
             deliver_at: int | None = None, keyed: float = 0.0) -> None:
        """One request of ``count`` messages (the batch size unless given); a share
        ``keyed`` of them carry a schedule key, their own id."""
        ids, msgs = [], []
        for _ in range(count or self.batch):
            mid = f"{self.prefix}-{self.seq}"
            self.seq += 1
            msg: dict[str, object] = {"payload": mid}
            if keyed and self.rng.random() < keyed:
                msg["scheduleKey"] = mid
                with self.out.lock:
                    self.out.schedule_key[mid] = mid
            if deliver_at is not None:
                msg["deliverAt"] = deliver_at
            elif self.rng.random() >= 0.2:
                msg["deliverAfterMs"] = self.rng.randrange(0, self.max_delay_ms + 1)
            ids.append(mid)
            msgs.append(msg)
        t = TopicName.parse(topic)
        send_ms = now_ms()
        try:
            resp = client.post(f"/topics/persistent/{t.tenant}/{t.namespace}/{t.local}",
                               json={"producerName": "faults", "messages": msgs})
        except httpx.HTTPError:
            with self.out.lock:
                self.out.unanswered += len(ids)
            return
        self.out.record(ids, topic, send_ms, resp)

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(30)


# ---------------------------------------------------------------- checker


class Checker(threading.Thread):
    """Reads the ready topics from their beginning with a plain confluent-kafka consumer
    (read_committed, no group) and notes when each payload id arrived."""

    def __init__(self, bootstrap: str, ready_topics: list[str]) -> None:
        super().__init__(name="fault-checker", daemon=True)
        self.arrivals: dict[str, list[int]] = defaultdict(list)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.error: str | None = None
        for t in ready_topics:
            kafka.ensure_topic(bootstrap, t, 4)
        self.consumer = KafkaConsumer({
            "bootstrap.servers": bootstrap, "group.id": f"faults-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "fetch.wait.max.ms": 20, "socket.connection.setup.timeout.ms": 5000})
        self.consumer.assign([TopicPartition(t, p, 0) for t in ready_topics
                              for p in kafka.partitions(bootstrap, t)])

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                msgs = self.consumer.consume(10000, 0.1)
                t = now_ms()
                with self.lock:
                    for m in msgs:
                        if m.error() is not None:
                            if m.error().code() != KafkaError._PARTITION_EOF:
                                self.error = m.error().str()
                            continue
                        self.arrivals[m.value().decode()].append(t)
        finally:
            self.consumer.close()

    def delivered(self, ids: set[str]) -> int:
        with self.lock:
            return sum(1 for i in ids if i in self.arrivals)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


# ---------------------------------------------------------------- SDK consumer


class SdkReader:
    """dwell's SDK Consumer in a process of its own (dwell_dev.sdk_reader): it receives and
    acknowledges everything and logs each id as received, then as acknowledged, so the
    suite can kill -9 it and count what the SDK let through twice."""

    def __init__(self, topic: str, subscription: str, env: dict[str, str], log_dir: Path) -> None:
        self.topic = topic
        self.subscription = subscription
        self.env = env
        self.out = log_dir / f"sdk-{subscription}-{uuid.uuid4().hex[:6]}.log"
        self.child: Child | None = None

    def start(self) -> None:
        self.child = Child.spawn(f"sdk reader {self.subscription}",
                                 [sys.executable, "-m", "dwell_dev.sdk_reader", self.topic,
                                  self.subscription, str(self.out)],
                                 Path(str(self.out) + ".err"), self.env)

    def kill(self) -> None:
        assert self.child is not None
        self.child.kill()

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(timeout=15)

    def duplicates(self) -> tuple[int, int]:
        """(ids received, ids the SDK handed over again after their first copy was
        acknowledged). A message received, not acknowledged and received again after a
        crash is a redelivery, as in Pulsar, not a duplicate."""
        acked: set[str] = set()
        seen: set[str] = set()
        dups = 0
        if not self.out.exists():
            return 0, 0
        for line in self.out.read_text().splitlines():
            kind, _, mid = line.partition(" ")
            if kind == "recv":
                if mid in acked:
                    dups += 1
                seen.add(mid)
            elif kind == "ack":
                acked.add(mid)
        return len(seen), dups


# ---------------------------------------------------------------- a scenario's outcome


@dataclass
class Row:
    scenario: str
    accepted: int
    delivered: int
    lost: int
    early: int
    kafka_duplicates: int
    sdk_duplicates: int
    recover_s: float
    refused: int

    HEADER = ("scenario", "accepted", "delivered", "lost", "early>tick", "dup(kafka)",
              "dup(SDK)", "recover s", "refused 503")

    def cells(self) -> tuple[str, ...]:
        return (self.scenario, str(self.accepted), str(self.delivered), str(self.lost),
                str(self.early), str(self.kafka_duplicates), str(self.sdk_duplicates),
                f"{self.recover_s:.1f}", str(self.refused))


def outcome(scenario: str, pub: Published, checker: Checker, sdk: SdkReader | None,
            fault_ms: int) -> Row:
    """The row of one scenario. ``recover_s``: the worst lateness of a message due after
    the fault began (how long delivery took to come back), in seconds."""
    with pub.lock, checker.lock:
        accepted = dict(pub.deliver_at)
        arrivals = {i: list(checker.arrivals.get(i, ())) for i in accepted}
    delivered = sum(1 for a in arrivals.values() if a)
    early = sum(1 for i, a in arrivals.items() if a and min(a) < accepted[i] - TICK_MS)
    dups = sum(len(a) - 1 for a in arrivals.values() if len(a) > 1)
    after = [min(a) - accepted[i] for i, a in arrivals.items() if a and accepted[i] >= fault_ms]
    sdk_dups = sdk.duplicates()[1] if sdk is not None else 0
    return Row(scenario, len(accepted), delivered, len(accepted) - delivered, early, dups,
               sdk_dups, max(after, default=0) / 1000, pub.refused)


def wait_delivered(pub: Published, checker: Checker, timeout_s: float,
                   sdk: SdkReader | None = None, sdk_ids: set[str] | None = None) -> None:
    """Until every accepted message has arrived on its ready topic (and the SDK consumer
    has seen every one of ``sdk_ids``), or ``timeout_s`` after the last one was due."""
    with pub.lock:
        ids = set(pub.deliver_at)
        last_due = max(pub.deliver_at.values(), default=now_ms())
    deadline = max(time.monotonic(), time.monotonic() + (last_due - now_ms()) / 1000) + timeout_s
    while time.monotonic() < deadline:
        if checker.delivered(ids) == len(ids) and (
                sdk is None or not sdk_ids or sdk.duplicates()[0] >= len(sdk_ids)):
            return
        time.sleep(0.5)


def format_table(rows: list[Row]) -> str:
    table = [Row.HEADER, *(r.cells() for r in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(Row.HEADER))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(r, widths, strict=True))) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
