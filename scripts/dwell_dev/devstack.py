"""The local stack: installs what is missing (devinstall.py) and runs Redis, Apache Kafka
(KRaft) and dwell's processes on 127.0.0.1, with pid files and logs under `.dwell/`.

Standard library only, so it runs before the venv exists. `make run|up|down|test`
call it; the test suite imports it to start its own servers on other ports.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import string
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from dwell_dev import kubenode, secure_stack
from dwell_dev.devinstall import (
    KAFKA_DIR,
    ROOT,
    SPARK_DIR,
    STATE_ROOT,
    VENV,
    VENV_PY,
    kafka_libs,
    redis_server_bin,
    say,
    spark_kafka_jars,
)
from dwell_dev.procs import Child, ChildFailed

# Ports per profile. The test profile sits DWELL_TEST_PORT_OFFSET (10000) above, so
# that `make test` never touches a stack started with `make up`; a second checkout
# testing on the same machine sets another offset.
_DEV_PORTS = {"redis": 6379, "kafka": 9092, "kafka_controller": 9093, "kafka_pods": 9094,
              "policy": 8081, "admission": 8082, "tracker": 8083, "spark": 8084}
_TEST_OFFSET = int(os.environ.get("DWELL_TEST_PORT_OFFSET", "10000"))
# The fault suite (tests/faults) kills and wipes its servers: it runs its own, 500 above
# the test profile, so the other suites' Redis and Kafka never see its faults.
PROFILES: dict[str, dict[str, int]] = {
    "dev": _DEV_PORTS,
    "test": {name: port + _TEST_OFFSET for name, port in _DEV_PORTS.items()},
    "faults": {name: port + _TEST_OFFSET + 500 for name, port in _DEV_PORTS.items()},
    # bench/burst.py and bench/soak.py: a whole stack of their own, beside the suites'.
    "bench": {name: port + _TEST_OFFSET + 700 for name, port in _DEV_PORTS.items()},
    # tests/secure: a stack started --secure (SASL_SSL Kafka, TLS Redis, HTTPS).
    "secure": {name: port + _TEST_OFFSET + 900 for name, port in _DEV_PORTS.items()},
    # tests/kubelet (make kube-test): the real node's tier, and the Redis and Kafka its
    # pods use.
    "kube": {name: port + _TEST_OFFSET + 1100 for name, port in _DEV_PORTS.items()},
}
SERVICES = ("policy", "admission", "tracker")


# ---------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    health_url: str | None = None
    cwd: Path = ROOT
    start_timeout: float = 60.0
    # The CA of an https:// health_url; the DWELL_* settings a readiness check connects with.
    ca_dir: Path | None = None
    check_env: dict[str, str] = field(default_factory=dict)


class Stack:
    def __init__(self, profile: str = "dev", secure: bool | None = None,
                 pods: bool = False) -> None:
        """`secure`: SASL_SSL Kafka, TLS Redis and HTTPS (dwell_dev.secure_stack); None
        takes what the profile was last started with. `pods`: Redis and Kafka also listen
        on the kube tier's pod bridge (kubenode.NODE_IP, which only this machine and its
        pods reach), for a chart installed with them as external servers."""
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}")
        self.profile = profile
        self.ports = PROFILES[profile]
        self.state = STATE_ROOT / profile
        self.run_dir = self.state / "run"
        self.log_dir = self.state / "logs"
        self.secure = secure_stack.enabled(self.state) if secure is None else secure
        self.pki = secure_stack.folder(self.state)
        if pods and self.secure:
            raise ValueError("Redis and Kafka for pods are plain; not with secure")
        self.pod_address = kubenode.NODE_IP if pods else None

    @property
    def scheme(self) -> str:
        return "https" if self.secure else "http"

    # -- environment shared by every dwell process of this profile
    @property
    def redis_url(self) -> str:
        return f"{'rediss' if self.secure else 'redis'}://127.0.0.1:{self.ports['redis']}/0"

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports['kafka']}"

    def service_env(self) -> dict[str, str]:
        return {
            "DWELL_REDIS_URL": self.redis_url,
            "DWELL_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "DWELL_POLICY_URL": f"{self.scheme}://127.0.0.1:{self.ports['policy']}",
            "DWELL_ADMISSION_URL": f"{self.scheme}://127.0.0.1:{self.ports['admission']}",
            "DWELL_TRACKER_URL": f"{self.scheme}://127.0.0.1:{self.ports['tracker']}",
            "DWELL_SPARK_CHECKPOINT_DIR": str(self.state / "spark-checkpoints"),
        } | (self._secure_client_env() if self.secure else {})

    def _secure_client_env(self) -> dict[str, str]:
        secure_stack.ensure_pki(self.state)
        secure_stack.admin_token(self.pki, VENV / "bin" / "dwell-admin")
        return secure_stack.client_env(self.pki)

    def _server_env(self, component: str) -> dict[str, str]:
        """A dwell process's HTTPS and token settings and its own Kafka principal."""
        if not self.secure:
            return {}
        return (secure_stack.server_env(self.pki)
                | secure_stack.component_env(self.pki, component))

    # -- process definitions
    def redis(self) -> Proc:
        data = self.state / "redis"
        data.mkdir(parents=True, exist_ok=True)
        listen = (secure_stack.redis_args(secure_stack.ensure_pki(self.state),
                                          self.ports["redis"]) if self.secure
                  else ["--port", str(self.ports["redis"])])
        bind = ["127.0.0.1", *([self.pod_address] if self.pod_address else [])]
        return Proc("redis", [redis_server_bin(), "--bind", *bind, *listen,
                              "--dir", str(data),
                              "--appendonly", "yes", "--appendfsync", "everysec",
                              # With pods: no password, and reachable only from this
                              # machine and its pods (the bridge is not routed).
                              "--save", "", "--protected-mode",
                              "no" if self.pod_address else "yes",
                              "--daemonize", "no"], self.ports["redis"])

    def kafka(self) -> Proc:
        libs = kafka_libs()
        # The secured broker keeps its own log dir: its SCRAM user is made at format time.
        kdir = self.state / ("kafka-secure" if self.secure else "kafka")
        data = kdir / "data"
        kdir.mkdir(parents=True, exist_ok=True)
        props = kdir / "server.properties"
        tpl = string.Template((KAFKA_DIR / "server.properties.template").read_text())
        text = tpl.substitute(port=self.ports["kafka"],
                              controller_port=self.ports["kafka_controller"], data_dir=data)
        if self.pod_address:
            pods = f"PODS://{self.pod_address}:{self.ports['kafka_pods']}"
            text = (text.replace("\nlisteners=", f"\nlisteners={pods},")
                    .replace("\nadvertised.listeners=", f"\nadvertised.listeners={pods},")
                    .replace("\nlistener.security.protocol.map=",
                             "\nlistener.security.protocol.map=PODS:PLAINTEXT,"))
        check_env = self.service_env()
        if self.secure:
            pki = secure_stack.ensure_pki(self.state)
            text += secure_stack.kafka_properties(pki, self.ports["kafka"],
                                                  self.ports["kafka_controller"])
            # Until the ACLs are made only the broker's own login may do anything.
            check_env |= secure_stack.broker_env(pki)
        props.write_text(text)
        props.chmod(0o600)
        cp = f"{libs}/*"
        if not (data / "meta.properties").exists():
            # Kafka wants the 22-char base64 form; StorageTool makes one for us.
            cluster_id = subprocess.run(
                ["java", "-cp", cp, "kafka.tools.StorageTool", "random-uuid"],
                check=True, capture_output=True, text=True).stdout.strip()
            say(f"formatting Kafka log dir {data.relative_to(ROOT)} (KRaft)")
            subprocess.run(["java", "-cp", cp, "kafka.tools.StorageTool", "format", "-t",
                            cluster_id, "-c", str(props)], check=True,
                           capture_output=True)
        jvm = secure_stack.kafka_jvm_args(secure_stack.ensure_pki(self.state)) \
            if self.secure else []
        return Proc("kafka", ["java", "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", *jvm,
                              f"-Dlog4j2.configurationFile={KAFKA_DIR / 'log4j2.properties'}",
                              "-cp", cp, "kafka.Kafka", str(props)],
                    self.ports["kafka"], start_timeout=90, check_env=check_env)

    def service(self, name: str) -> Proc:
        env = self.service_env() | self._server_env(name) | {
            "DWELL_HTTP_PORT": str(self.ports[name])}
        return Proc(name, [str(VENV_PY), "-m", f"dwell.{name}"], self.ports[name], env,
                    health_url=f"{self.scheme}://127.0.0.1:{self.ports[name]}/healthz",
                    ca_dir=self.pki if self.secure else None)

    def spark(self) -> Proc:
        jars = ",".join(str(p) for p in spark_kafka_jars())
        port = self.ports["spark"]
        env = self.service_env() | self._server_env("spark") | {
            "DWELL_SPARK_JARS": jars, "PYSPARK_PYTHON": str(VENV_PY),
            "DWELL_SPARK_METRICS_PORT": str(port)}
        return Proc("spark", [str(VENV_PY), "-m", "dwell_spark"], port, env, cwd=SPARK_DIR,
                    health_url=f"{self.scheme}://127.0.0.1:{port}/readyz", start_timeout=600,
                    ca_dir=self.pki if self.secure else None)

    def proc(self, name: str) -> Proc:
        if name == "redis":
            return self.redis()
        if name == "kafka":
            return self.kafka()
        if name == "spark":
            return self.spark()
        return self.service(name)

    def available(self) -> list[str]:
        """Processes this checkout can run: a service joins once its package has a __main__."""
        names = ["redis", "kafka"]
        names += [s for s in SERVICES if (ROOT / "services" / "dwell" / s / "__main__.py").exists()]
        if (SPARK_DIR / "dwell_spark" / "__main__.py").exists():
            names.append("spark")
        return names

    # -- pid files
    def _pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        try:
            pid = int(self._pidfile(name).read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self._pidfile(name).unlink(missing_ok=True)
            return None
        except PermissionError:
            pass
        return pid

    def start(self, name: str) -> float | None:
        """Start one process unless it runs; returns seconds to healthy, None if already up."""
        if self.pid(name):
            return None
        p = self.proc(name)
        if p.port and port_open(p.port):
            raise RuntimeError(f"port {p.port} for {name} is taken by a process dwell did not "
                               f"start; stop it or use another profile")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        child = Child.spawn(name, p.argv, self.log_dir / f"{name}.log", p.env, cwd=p.cwd)
        self._pidfile(name).write_text(f"{child.pid}\n")
        try:
            return child.wait_until(lambda: _healthy(p), p.start_timeout, "healthy")
        except ChildFailed:
            child.stop()
            self._pidfile(name).unlink(missing_ok=True)
            raise

    def data_dir(self, name: str) -> Path | None:
        """Where ``name`` keeps its data (Redis' append-only file, Kafka's log dir), if it
        keeps any."""
        if name == "redis":
            return self.state / "redis"
        if name == "kafka":
            return self.state / ("kafka-secure" if self.secure else "kafka") / "data"
        return None

    def discard(self, name: str) -> None:
        """Delete the data of ``name``, which must not be running. For the stacks of tests
        and benchmarks only: their Kafka would otherwise keep every run's records, and a
        benchmark writes gigabytes."""
        if self.pid(name):
            raise RuntimeError(f"{name} runs; stop it before discarding its data")
        data = self.data_dir(name)
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)

    def start_empty(self, name: str) -> float | None:
        """:meth:`start`, with no data left from a previous run, unless ``name`` already runs
        (then it is used as it is)."""
        if self.pid(name):
            return None
        self.discard(name)
        return self.start(name)

    def stop(self, name: str, timeout: float = 20.0) -> bool:
        pid = self.pid(name)
        if not pid:
            return False
        Child(name, pid, self.log_dir / f"{name}.log").stop(timeout)
        self._pidfile(name).unlink(missing_ok=True)
        return True

    def up(self, names: list[str] | None = None) -> None:
        names = names or self.available()
        for name in names:
            took = self.start(name)
            port = self.proc_port(name)
            where = f"127.0.0.1:{port}" + (" (local[2], metrics)" if name == "spark" else "")
            if took is None:
                say(f"{name:<9} already running  {where}")
            else:
                say(f"{name:<9} up in {took:4.1f}s      {where}")
            if name == "kafka":
                # Before the services: on the secured stack they connect as principals
                # that exist once the ACLs are applied.
                if self.secure:
                    apply_kafka_acls(self)
                _ensure_dwell_topics(self)

    def proc_port(self, name: str) -> int:
        return self.ports.get(name, 0)

    def down(self, names: list[str] | None = None) -> None:
        # Stop in reverse dependency order: consumers before the servers they use.
        names = names or ["spark", *reversed(SERVICES), "kafka", "redis"]
        for name in names:
            if self.stop(name):
                say(f"{name:<9} stopped")

    def status(self) -> list[tuple[str, int | None, int]]:
        return [(n, self.pid(n), self.proc_port(n)) for n in self.available()]


def _ensure_dwell_topics(stack: Stack) -> None:
    """dwell's own topics, created once the broker is up (auto-create is off)."""
    code = (
        "import sys; from dwell.adapters.kafka import ensure_dwell_topics;"
        "ensure_dwell_topics(sys.argv[1])"
    )
    env = dict(os.environ) | stack.service_env()
    if stack.secure:
        env |= secure_stack.broker_env(stack.pki)
    if VENV_PY.exists() and (ROOT / "client" / "src" / "dwell" / "adapters" / "kafka").is_dir():
        subprocess.run([str(VENV_PY), "-c", code, stack.kafka_bootstrap], check=True, env=env)


def kafka_acls(stack: Stack, cmd: str) -> str:
    """dwell_dev.kafka_acls (it needs the venv's confluent-kafka), logged in as the
    broker's super-user; its output."""
    spec = secure_stack.acl_spec(stack.pki, stack.kafka_bootstrap)
    done = subprocess.run([str(VENV_PY), "-m", "dwell_dev.kafka_acls", cmd],
                          input=json.dumps(spec), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"kafka_acls.py {cmd} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def apply_kafka_acls(stack: Stack) -> None:
    """The secured stack's SCRAM users and ACLs (dwell_dev.kafka_acls), made idempotently
    each time its Kafka is started."""
    say(kafka_acls(stack, "apply").strip())


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _healthy(p: Proc) -> bool:
    if p.health_url:
        try:
            ctx = secure_stack.client_context(p.ca_dir) if p.ca_dir else None
            with urllib.request.urlopen(p.health_url, timeout=1, context=ctx) as r:
                return r.status == 200
        except OSError:
            return False
    if p.name == "kafka":
        return port_open(p.port) and _kafka_ready(p.port, p.check_env)
    if p.port:
        return port_open(p.port)
    return True


def _kafka_ready(port: int, env: dict[str, str]) -> bool:
    # The listener opens before the broker has joined its own quorum; a metadata
    # request answering with a broker list means it takes produce requests. The
    # adapter's ping connects with the stack's DWELL_KAFKA_* settings (SASL_SSL).
    if not VENV_PY.exists():
        return True
    code = ("import sys; from dwell.adapters.kafka import ping;"
            f"sys.exit(0 if ping('127.0.0.1:{port}', 3) else 1)")
    return subprocess.run([str(VENV_PY), "-c", code], capture_output=True,
                          env=dict(os.environ) | env).returncode == 0
