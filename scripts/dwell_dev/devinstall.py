"""What the local stack needs on the machine, installed when missing: the venv with dwell,
Debian's redis-server and openssl, the jars of Kafka, pulsar-admin and Spark's Kafka
connector (resolved from Maven Central with mvn), and the chart's tools (helm built from
its Go module, promtool). Everything lands under `.venv/` and `.dwell/cache/`; each step
is stamped and skipped once done.

Standard library only, like devstack.py, which runs it (`devstack.py install`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dwell_dev import ROOT, say

STATE_ROOT = ROOT / ".dwell"
CACHE = STATE_ROOT / "cache"
VENV = ROOT / ".venv"
VENV_PY = VENV / "bin" / "python"
KAFKA_DIR = ROOT / "scripts" / "kafka"
PULSAR_DIR = ROOT / "scripts" / "pulsar"
SPARK_DIR = ROOT / "spark"


# ---------------------------------------------------------------- install


def _stamp_ok(stamp: Path, digest: str) -> bool:
    return stamp.exists() and stamp.read_text() == digest


def _drop_old_paths() -> None:
    """A venv made before the tooling was a package found it through a .pth file; the
    editable installs replace it."""
    for pth in VENV.glob("lib/python3*/site-packages/dwell-dev-paths.pth"):
        pth.unlink()


def install_python(extras: str = "dev,spark") -> None:
    """Create .venv and install, editable and at constraints.txt's versions, dwell-client
    (client/), dwell with its extras, the Spark app (spark/) and this tooling (scripts/),
    once per change of their pyproject files or the constraints."""
    inputs = ("pyproject.toml", "client/pyproject.toml", "spark/pyproject.toml",
              "scripts/pyproject.toml", "constraints.txt")
    digest = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in inputs)
                            + extras.encode()).hexdigest()
    stamp = VENV / ".dwell-installed"
    if VENV_PY.exists() and _stamp_ok(stamp, digest):
        return
    t0 = time.monotonic()
    if not VENV_PY.exists():
        say("creating .venv")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    say(f"pip install -c constraints.txt -e client -e '.[{extras}]' -e spark -e scripts "
        "(first run downloads ~600 MB)")
    subprocess.run([str(VENV_PY), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                    "-c", "constraints.txt", "-e", "./client", "-e", f".[{extras}]",
                    "-e", "./spark", "-e", "./scripts"], check=True, cwd=ROOT)
    _drop_old_paths()
    stamp.write_text(digest)
    say(f"python packages ready in {time.monotonic() - t0:.0f}s")


def redis_server_bin() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if found:
        return found
    # Debian starts its own redis on 6379 after install; ours must own that port.
    apt_install("redis-server", "redis-server")
    return "/usr/bin/redis-server"


def apt_install(package: str, what: str) -> None:
    """Install a Debian package (as root, with apt-get) for `what`, and stop the server
    the package may have started: dwell runs only its own processes."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit(f"dwell: {what} is missing; install Debian's {package} package")
    say(f"installing Debian's {package} for {what} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["service", package, "stop"], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _mvn_copy(pom: Path, dest: Path) -> None:
    """Resolve a pom's runtime dependencies from Maven Central into dest, once."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    stamp = dest / ".resolved"
    if _stamp_ok(stamp, digest):
        return
    if not shutil.which("mvn"):
        sys.exit("dwell: mvn (Apache Maven) is needed to fetch jars from Maven Central")
    say(f"resolving {pom.relative_to(ROOT)} from Maven Central into {dest.relative_to(ROOT)}")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    subprocess.run(["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                    f"-DoutputDirectory={dest}", "-DincludeScope=runtime"], check=True)
    stamp.write_text(digest)


def kafka_libs() -> Path:
    dest = CACHE / "kafka-libs"
    _mvn_copy(KAFKA_DIR / "pom.xml", dest)
    return dest


def pulsar_admin_libs() -> Path:
    """Apache Pulsar's pulsar-admin (PulsarAdminTool) and Java admin client, which
    tests/compat runs against the policy service."""
    dest = CACHE / "pulsar-admin-libs"
    _mvn_copy(PULSAR_DIR / "pom.xml", dest)
    return dest


def spark_kafka_jars() -> list[Path]:
    """Spark's Kafka connector and its dependencies, for spark.jars (no Ivy at run time)."""
    pom = SPARK_DIR / "pom.xml"
    if not pom.exists():
        return []
    dest = CACHE / "spark-jars"
    _mvn_copy(pom, dest)
    return sorted(dest.glob("*.jar"))


# The chart's tools (tests/chart): Helm from its Go module (Debian has no helm package),
# promtool from Debian's prometheus package. Only `make test` and `make chart` need them.
HELM_VERSION = "v3.16.4"
# The flags helm's own Makefile sets: its version, and the Kubernetes version `helm template`
# assumes (a plain go install says v1.20, below the chart's kubeVersion; 1.31 is what helm
# 3.16's release builds say).
HELM_LDFLAGS = (f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION} "
                "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 "
                "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=31")
TOOLS_BIN = CACHE / "bin"


def helm_bin() -> Path:
    """Helm HELM_VERSION, built once with `go install` into .dwell/cache/bin."""
    helm = TOOLS_BIN / "helm"
    stamp = TOOLS_BIN / ".helm-version"
    if helm.exists() and _stamp_ok(stamp, HELM_LDFLAGS):
        return helm
    if not shutil.which("go"):
        sys.exit("dwell: go is needed to build helm (go install helm.sh/helm/v3/cmd/helm)")
    say(f"building helm {HELM_VERSION} with go install (once; ~3 min on 2 cores)")
    TOOLS_BIN.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "install", "-ldflags", HELM_LDFLAGS,
                    f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"], check=True,
                   env=dict(os.environ, GOBIN=str(TOOLS_BIN), CGO_ENABLED="0"))
    stamp.write_text(HELM_LDFLAGS)
    return helm


def promtool_bin() -> Path:
    """promtool, which checks the chart's alert rules (Debian's prometheus package)."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    # The package starts its own server where it can; dwell only wants the checker.
    apt_install("prometheus", "promtool")
    return Path("/usr/bin/promtool")


def install(with_python: bool = True) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    redis_server_bin()
    if not shutil.which("openssl"):  # --secure makes its certificates with it
        apt_install("openssl", "openssl")
    if not shutil.which("java"):
        sys.exit("dwell: java (17+) is needed to run Apache Kafka")
    kafka_libs()
    if with_python:
        install_python()
    spark_kafka_jars()
