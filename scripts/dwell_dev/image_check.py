"""`make images-check` (scripts/images.py check): the images `make images` built, run with
podman on the host network against the test profile's Redis and Kafka (started here
unless they run, stopped again if started here). The services image runs policy,
admission and tracker as the chart does (uid 10001, read-only root, /tmp a tmpfs), the
Spark image runs the drain app in local mode; a delayed message published over HTTP must
reach a subscriber no earlier than its delay. Then the Spark image's
`spark-submit --version` must name pyproject.toml's pyspark.

Needs .venv (it imports devstack and dwell, and consumes with dwell's SDK).
"""

from __future__ import annotations

import contextlib
import re
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from dwell.adapters.kafka import ensure_dwell_topics
from dwell.client import Consumer
from dwell.core import topics as names
from dwell.tracker import recovery
from dwell_dev import devstack, images, say
from dwell_dev.testkit import redis_db_url, wait_for

# The services' ports in these checks: the test profile's, 300 up, so that a test
# suite's own services on that profile can run at the same time.
PORT_SHIFT = 300
REDIS_DB = 9
DELAY_MS = 3000



@dataclass
class Containers:
    """The containers this check started, by name, so that it removes exactly those."""

    prefix: str
    names: list[str]

    def run(self, name: str, image: str, env: dict[str, str], *argv: str) -> str:
        full = f"{self.prefix}-{name}"
        args = ["run", "-d", "--name", full, "--network", "host", "--read-only",
                "--tmpfs", "/tmp:rw,size=1g,mode=1777"]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        images.podman(*args, image, *argv, capture=True)
        self.names.append(full)
        return full

    def logs(self, name: str) -> str:
        got = images.podman("logs", name, capture=True, check=False)
        return got.stdout + got.stderr

    def running(self, name: str) -> bool:
        got = images.podman("inspect", "--format", "{{.State.Running}}", name, capture=True,
                            check=False)
        return got.stdout.strip() == "true"

    def remove_all(self) -> None:
        for name in reversed(self.names):
            images.podman("rm", "-f", "-t", "5", name, capture=True, check=False)
        self.names.clear()


@contextlib.contextmanager
def backing_servers() -> Iterator[devstack.Stack]:
    stack = devstack.Stack("test")
    started = [n for n in ("redis", "kafka") if stack.start(n) is not None]
    try:
        ensure_dwell_topics(stack.kafka_bootstrap)
        yield stack
    finally:
        stack.down(started)


def healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=2).status_code == 200
    return False


def spark_version() -> str:
    """`spark-submit --version` in the Spark image: Spark's own banner, its version."""
    got = images.podman("run", "--rm", "--network", "host", images.IMAGES["dwell-spark"][1],
                        "spark-submit", "--version", capture=True, timeout=300)
    text = got.stdout + got.stderr
    m = re.search(r"version (\d+\.\d+\.\d+)", text)
    if not m:
        raise RuntimeError(f"spark-submit --version printed no version:\n{text}")
    return m.group(1)


def pyspark_pin() -> str:
    extra = tomllib.loads((images.ROOT / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["spark"]
    return next(d.split("==")[1] for d in extra if d.startswith("pyspark=="))


def delayed_publish(ports: dict[str, int], bootstrap: str) -> int:
    """A namespace with delayed delivery, a message published with deliverAfterMs, and
    the ms between publish and its arrival at a new subscription."""
    tenant = "img" + uuid.uuid4().hex[:8]
    base = {s: f"http://127.0.0.1:{ports[s]}" for s in ("policy", "admission", "tracker")}
    with httpx.Client(base_url=base["policy"], timeout=10) as policy:
        for path, body in [(f"/admin/v2/tenants/{tenant}",
                            {"adminRoles": [], "allowedClusters": []}),
                           (f"/admin/v2/namespaces/{tenant}/ns", None)]:
            r = policy.put(path, json=body)
            r.raise_for_status()
        policy.post(f"/admin/v2/namespaces/{tenant}/ns/delayedDelivery",
                    json={"active": True, "tickTime": 1000,
                          "maxDeliveryDelayInMillis": 60000}).raise_for_status()
    path = f"/topics/persistent/{tenant}/ns/orders"
    with httpx.Client(base_url=base["admission"], timeout=10) as admission:
        # The namespace reaches admission through the policy feed: until then a delay
        # over the max is not refused (errorCode 2).
        def refused() -> bool:
            r = admission.post(path, json={"producerName": "probe", "messages": [
                {"payload": "x", "deliverAfterMs": 120000}]})
            return r.status_code == 200 and \
                r.json()["messagePublishResults"][0].get("errorCode") == 2
        wait_for(refused, 30, "the namespace's policy at admission", interval=0.2)
        payload = f"delayed-{uuid.uuid4().hex[:6]}"
        topic = f"persistent://{tenant}/ns/orders"
        with Consumer(topic, "images-check", bootstrap=bootstrap, tracker_url=base["tracker"],
                      initial_position="earliest") as consumer:
            sent = time.time()
            r = admission.post(path, json={"producerName": "images-check", "messages": [
                {"payload": payload, "deliverAfterMs": DELAY_MS}]})
            r.raise_for_status()
            result = r.json()["messagePublishResults"][0]
            if result.get("errorCode"):
                raise RuntimeError(f"publish refused: {result}")
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                msg = consumer.receive(0.2)
                if msg is None:
                    continue
                took = round((time.time() - sent) * 1000)
                if msg.data() != payload.encode():
                    raise RuntimeError(f"received {msg.data()!r}, published {payload!r}")
                if took < DELAY_MS:
                    raise RuntimeError(f"delivered after {took} ms, delay was {DELAY_MS} ms")
                consumer.acknowledge(msg)
                return took
    raise RuntimeError(f"the delayed message did not arrive within 90 s ({names.DELAYED})")


def main() -> dict[str, object]:
    """Runs the checks; returns what they measured (the test asserts on it too)."""
    t0 = time.monotonic()
    out: dict[str, object] = {}
    for _, tag in images.IMAGES.values():
        if images.podman("image", "exists", tag, check=False).returncode:
            raise RuntimeError(f"{tag} is not built: run `make images` first")
    version = spark_version()
    say(f"dwell-spark: spark-submit --version says {version}")
    if version != pyspark_pin():
        raise RuntimeError(f"spark {version} in the image, pyproject pins {pyspark_pin()}")
    out["spark_version"] = version
    containers = Containers(f"dwell-check-{devstack.PROFILES['test']['redis']}", [])
    with backing_servers() as stack:
        ports = {s: stack.ports[s] + PORT_SHIFT
                 for s in ("policy", "admission", "tracker", "spark")}
        redis_url = redis_db_url(stack, REDIS_DB)
        group = f"dwell-tracker-images-{uuid.uuid4().hex[:8]}"
        recovery.start_group_at_end(stack.kafka_bootstrap, group, [names.DELAYED,
                                                                  names.REFILED])
        common = {"DWELL_REDIS_URL": redis_url, "DWELL_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
                  "DWELL_HTTP_HOST": "127.0.0.1",
                  "DWELL_POLICY_URL": f"http://127.0.0.1:{ports['policy']}",
                  "DWELL_TRACKER_URL": f"http://127.0.0.1:{ports['tracker']}"}
        try:
            import redis

            redis.Redis.from_url(redis_url).flushdb()
            for svc in ("policy", "admission", "tracker"):
                env = common | {"DWELL_HTTP_PORT": str(ports[svc])}
                if svc == "tracker":
                    env["DWELL_TRACKER_GROUP_ID"] = group
                if svc == "admission":
                    env["DWELL_INGRESS_ENABLED"] = "false"
                containers.run(svc, images.IMAGES["dwell"][1], env, "python", "-m",
                               f"dwell.{svc}")
            spark = containers.run("spark", images.IMAGES["dwell-spark"][1], common | {
                "DWELL_SPARK_METRICS_PORT": str(ports["spark"]),
                "DWELL_SPARK_CHECKPOINT_DIR": "/tmp/checkpoints",
                "DWELL_ACKS_STARTING_OFFSETS": "latest",
                "DWELL_DRAIN_TRIGGER_MS": "250", "DWELL_LOG_LEVEL": "info"},
                "python", "-m", "dwell_spark")
            for svc in ("policy", "admission", "tracker"):
                url = f"http://127.0.0.1:{ports[svc]}/healthz"
                name = f"{containers.prefix}-{svc}"
                wait_for(lambda u=url, n=name: healthy(u) or (
                    None if containers.running(n) else _exited(containers, n)),
                    90, f"{svc} {url}")
                say(f"dwell image: {svc} /healthz 200 on 127.0.0.1:{ports[svc]}")
            t1 = time.monotonic()
            wait_for(lambda: "drain ready" in containers.logs(spark) or (
                None if containers.running(spark) else _exited(containers, spark)),
                300, "the Spark app's drain")
            say(f"dwell-spark image: drain ready in {time.monotonic() - t1:.0f}s")
            took = delayed_publish(ports, stack.kafka_bootstrap)
            say(f"a message published with deliverAfterMs={DELAY_MS} arrived after {took} ms")
            out["delivered_after_ms"] = took
        except Exception:
            for name in containers.names:
                print(f"--- {name}\n{containers.logs(name)[-3000:]}", flush=True)
            raise
        finally:
            containers.remove_all()
    out["seconds"] = round(time.monotonic() - t0)
    say(f"image checks passed in {out['seconds']}s")
    return out


def _exited(containers: Containers, name: str) -> None:
    raise RuntimeError(f"{name} exited:\n{containers.logs(name)[-3000:]}")
