"""Apache Pulsar's own admin tools against the policy service: `pulsar-admin`
(PulsarAdminTool from `pulsar-client-tools`, resolved from Maven Central into the download
cache by devstack) with `webServiceUrl` pointing at a real policy service."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from dwell_dev import devinstall

HERE = Path(__file__).resolve().parent
TOOL = "org.apache.pulsar.admin.cli.PulsarAdminTool"
# Broker defaults of the service under test, so that `-ap` answers are predictable.
BROKER = {"DWELL_DELAYED_DELIVERY_ENABLED": "true", "DWELL_DELAYED_DELIVERY_TICK_TIME_MS": "1000",
          "DWELL_DELAYED_DELIVERY_MAX_DELAY_MS": "0", "DWELL_DELAYED_DELIVERY_FIXED_DELAY_MS": "0",
          "DWELL_CLUSTER": "standalone"}


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str


class PulsarAdmin:
    """Runs pulsar-admin command lines, either one JVM per command (`cli`, exactly what the
    `pulsar-admin` script does) or many commands in one JVM (`batch`, AdminBatch.java: the
    same PulsarAdminTool parsing, calls and printing)."""

    def __init__(self, libs: Path, conf: Path) -> None:
        self.classpath = f"{libs}/*"
        self.conf = conf
        self.jvm_runs = 0

    def _java(self, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
        self.jvm_runs += 1
        env = dict(os.environ, JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1 -Xshare:auto")
        return subprocess.run(["java", "-cp", self.classpath, *argv], capture_output=True,
                              text=True, timeout=timeout, env=env, check=False)

    def cli(self, *args: str) -> Result:
        done = self._java(TOOL, str(self.conf), *args, timeout=120)
        return Result(done.returncode, done.stdout, _jvm_noise(done.stderr))

    def batch(self, commands: Sequence[Sequence[str]], workdir: Path) -> list[Result]:
        script = workdir / "commands.tsv"
        script.write_text("".join("\t".join(cmd) + "\n" for cmd in commands))
        done = self._java(str(HERE / "AdminBatch.java"), str(self.conf), str(script),
                          timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert len(lines) == len(commands), (done.returncode, done.stdout, done.stderr)
        return [Result(int(r["rc"]), r["out"], r["err"]) for r in map(json.loads, lines)]


def _jvm_noise(err: str) -> str:
    # The JVM announces JAVA_TOOL_OPTIONS on stderr; it is no part of pulsar-admin's output.
    return "".join(line for line in err.splitlines(keepends=True)
                   if not line.startswith("Picked up JAVA_TOOL_OPTIONS"))


@pytest.fixture(scope="session")
def pulsar_admin_libs() -> Path:
    return devinstall.pulsar_admin_libs()


@pytest.fixture(scope="module")
def tracker(services):  # type: ignore[no-untyped-def]
    svc = services.start("tracker", env={"DWELL_STATS_REFRESH_S": "1"})
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def policy(services, tracker):  # type: ignore[no-untyped-def]
    svc = services.start("policy", env=BROKER | {"DWELL_TRACKER_URL": tracker.url})
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def pulsar_admin(policy, pulsar_admin_libs: Path,  # type: ignore[no-untyped-def]
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarAdmin]:
    conf = tmp_path_factory.mktemp("pulsar-admin") / "client.conf"
    conf.write_text(f"webServiceUrl={policy.url}\n")
    yield PulsarAdmin(pulsar_admin_libs, conf)
