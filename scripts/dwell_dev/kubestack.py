"""The kube tier of the local stack: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (the kubelet: it reports pods Running without running containers)
on 127.0.0.1, with a CA, serving certificates, service-account keys and an admin token made
at each start under `.dwell/<profile>/kube/`, and a kubeconfig there for helm and kubectl.

The binaries are built from the Go module proxy by the wrapper modules in scripts/kube/
and cached under `.dwell/cache/kube/<versions>-<digest>/`; a warm start takes seconds.
Standard library (and the openssl command) only, like devstack.py, which calls it:
`make kube-up` / `make kube-down`; tests/kube starts it with the test profile.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dwell_dev import devinstall, devstack
from dwell_dev.devinstall import CACHE, ROOT, say
from dwell_dev.devstack import Proc, Stack

KUBE_MODULES = ROOT / "scripts" / "kube"
KUBE_CACHE = CACHE / "kube"

# Ports of the dev profile; every other profile adds its offset (DWELL_TEST_PORT_OFFSET for
# the test profile), as devstack.py does for Redis and Kafka.
_DEV_PORTS = {"etcd": 2379, "etcd_peer": 2380, "kube-apiserver": 6443,
              "kube-controller-manager": 10257, "kube-scheduler": 10259, "kwok": 10247}
PROCESSES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.1/16"
NODE_NAME = "kwok-node-0"
# kwok's own stage configs, from its module: nodes come up Ready and keep heart-beating,
# pods go Pending -> Running (Ready), a Job's pods complete, deleted pods go.
KWOK_STAGES = ("kustomize/stage/node/fast/node-initialize.yaml",
               "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
               "kustomize/stage/pod/fast/pod-ready.yaml",
               "kustomize/stage/pod/fast/pod-complete.yaml",
               "kustomize/stage/pod/fast/pod-delete.yaml")
# The Kubeflow Spark Operator's published module, for its CustomResourceDefinitions.
SPARK_OPERATOR_MODULE = "github.com/kubeflow/spark-operator/v2"
SPARK_OPERATOR_VERSION = "v2.3.0"


# ---------------------------------------------------------------- build


def _required(module_dir: Path, path: str) -> str:
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(path)} (v\S+)",
                  (KUBE_MODULES / module_dir / "go.mod").read_text(), re.M)
    if not m:
        raise RuntimeError(f"scripts/kube/{module_dir}/go.mod does not require {path}")
    return m[1]


def versions() -> dict[str, str]:
    """The pinned versions, as the wrapper modules require them."""
    return {"kubernetes": _required(Path("k8s"), "k8s.io/kubernetes"),
            "etcd": _required(Path("etcd"), "go.etcd.io/etcd/server/v3"),
            "kwok": _required(Path("kwok"), "sigs.k8s.io/kwok")}


# module folder -> (output name -> package)
_BUILDS = {
    "etcd": {"etcd": "go.etcd.io/etcd/server/v3"},
    "kwok": {"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
    "k8s": {name: f"k8s.io/kubernetes/cmd/{name}" for name in
            ("kube-apiserver", "kube-controller-manager", "kube-scheduler")},
}


def _go_env() -> dict[str, str]:
    return dict(os.environ, CGO_ENABLED="0")


def _ldflags(module: str, v: dict[str, str]) -> str:
    """Kubernetes' binaries say their version as its release builds stamp it (helm checks
    a chart's kubeVersion against it); a plain go build says v0.0.0-master."""
    flags = "-s -w"
    if module == "k8s":
        major, minor = v["kubernetes"].lstrip("v").split(".")[:2]
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += (f" -X {pkg}.gitVersion={v['kubernetes']} -X {pkg}.gitMajor={major}"
                      f" -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean")
    return flags


def bin_dir() -> Path:
    """The cached binaries (and kwok's stage configs), built once per version stamp."""
    v = versions()
    files = sorted(KUBE_MODULES.glob("*/go.*")) + sorted(KUBE_MODULES.glob("stages/*.yaml"))
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    dest = KUBE_CACHE / f"k8s-{v['kubernetes']}-etcd-{v['etcd']}-kwok-{v['kwok']}-{digest}"
    if (dest / ".complete").exists():
        return dest
    if not shutil.which("go"):
        sys.exit("dwell: go is needed to build the kube tier (Kubernetes, etcd and kwok "
                 "from the Go module proxy)")
    say(f"building Kubernetes {v['kubernetes']}, etcd {v['etcd']} and kwok {v['kwok']} "
        f"from the Go module proxy (once; minutes of Go compilation) into "
        f"{dest.relative_to(ROOT)}")
    t0 = time.monotonic()
    partial = KUBE_CACHE / f".partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "stages").mkdir(parents=True)
    for module, outputs in _BUILDS.items():
        for name, package in outputs.items():
            subprocess.run(["go", "build", "-trimpath", f"-ldflags={_ldflags(module, v)}",
                            "-o", str(partial / name), package],
                           cwd=KUBE_MODULES / module, env=_go_env(), check=True)
    kwok_src = _module_dir(KUBE_MODULES / "kwok", f"sigs.k8s.io/kwok@{v['kwok']}")
    for stage in KWOK_STAGES:
        shutil.copy(kwok_src / stage, partial / "stages" / Path(stage).name)
    for stage in sorted(KUBE_MODULES.glob("stages/*.yaml")):
        shutil.copy(stage, partial / "stages" / stage.name)
    (partial / ".complete").write_text(json.dumps(v) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    partial.rename(dest)
    say(f"kube tier built in {time.monotonic() - t0:.0f}s")
    return dest


def _module_dir(cwd: Path, module_at_version: str) -> Path:
    got = subprocess.run(["go", "mod", "download", "-json", module_at_version], cwd=cwd,
                         env=_go_env(), check=True, capture_output=True, text=True)
    return Path(json.loads(got.stdout)["Dir"])


def spark_operator_crds() -> list[Path]:
    """The Kubeflow Spark Operator's CRDs (config/crd/bases) from its published Go module,
    copied once into .dwell/cache/kube/spark-operator-<version>/."""
    dest = KUBE_CACHE / f"spark-operator-{SPARK_OPERATOR_VERSION}"
    if not (dest / ".complete").exists():
        src = _module_dir(KUBE_MODULES / "kwok",
                          f"{SPARK_OPERATOR_MODULE}@{SPARK_OPERATOR_VERSION}")
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for crd in sorted((src / "config" / "crd" / "bases").glob("*.yaml")):
            shutil.copy(crd, dest / crd.name)
            (dest / crd.name).chmod(0o644)
        (dest / ".complete").write_text(f"{SPARK_OPERATOR_MODULE}@{SPARK_OPERATOR_VERSION}\n")
    return sorted(dest.glob("*.yaml"))


# ---------------------------------------------------------------- certificates


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_credentials(d: Path) -> str:
    """A CA, the API server's serving certificate, the service-account key pair and an
    admin token (system:masters) in d; returns the token."""
    if not shutil.which("openssl"):
        sys.exit("dwell: the openssl command is needed to make the kube tier's certificates")
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "30", "-subj", "/CN=dwell-kube-ca", cwd=d)
    sans = ["IP:127.0.0.1", f"IP:{SERVICE_CIDR.rsplit('.', 1)[0]}.1", "DNS:localhost",
            "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local"]
    (d / "apiserver.ext").write_text(f"subjectAltName={','.join(sans)}\n"
                                     "extendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key",
             "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver", cwd=d)
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "apiserver.crt", "-days", "30",
             "-extfile", "apiserver.ext", cwd=d)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "sa.key", cwd=d)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    token = secrets.token_hex(24)
    (d / "tokens.csv").write_text(f'{token},dwell-admin,dwell-admin,"system:masters"\n')
    for f in ("ca.key", "apiserver.key", "sa.key", "tokens.csv"):
        (d / f).chmod(0o600)
    return token


def write_kubeconfig(path: Path, server: str, ca: Path, token: str) -> None:
    # JSON is YAML: kubectl, helm and Spark's client read it as a kubeconfig.
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dwell",
        "clusters": [{"name": "dwell", "cluster": {"server": server,
                                                   "certificate-authority": str(ca)}}],
        "users": [{"name": "dwell-admin", "user": {"token": token}}],
        "contexts": [{"name": "dwell", "context": {"cluster": "dwell",
                                                   "user": "dwell-admin"}}],
    }, indent=2) + "\n")
    path.chmod(0o600)


# ---------------------------------------------------------------- processes


class KubeStack(Stack):
    """The kube tier of one profile: its pid files and logs sit beside the profile's
    others (.dwell/<profile>/run, logs); certificates, etcd's data and the kubeconfig in
    .dwell/<profile>/kube/."""

    def __init__(self, profile: str = "dev") -> None:
        super().__init__(profile)
        offset = self.ports["redis"] - devstack.PROFILES["dev"]["redis"]
        self.kube_ports = {name: port + offset for name, port in _DEV_PORTS.items()}
        self.dir = self.state / "kube"
        self.kubeconfig = self.dir / "kubeconfig"
        self.ca = self.dir / "ca.crt"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.kube_ports['kube-apiserver']}"

    @property
    def token(self) -> str:
        return (self.dir / "tokens.csv").read_text().split(",", 1)[0]

    def available(self) -> list[str]:
        return list(PROCESSES)

    def proc_port(self, name: str) -> int:
        return self.kube_ports[name]

    def proc(self, name: str) -> Proc:
        b = bin_dir()
        d, p = self.dir, self.kube_ports
        if name == "etcd":
            peer = f"http://127.0.0.1:{p['etcd_peer']}"
            client = f"http://127.0.0.1:{p['etcd']}"
            return Proc(name, [str(b / "etcd"), "--name", "dwell", "--data-dir",
                               str(d / "etcd"), "--listen-client-urls", client,
                               "--advertise-client-urls", client,
                               "--listen-peer-urls", peer,
                               "--initial-advertise-peer-urls", peer,
                               "--initial-cluster", f"dwell={peer}",
                               # A throwaway cluster: no fsync, no waiting on the disk.
                               "--unsafe-no-fsync", "--log-level", "warn"],
                        p["etcd"], health_url=f"{client}/health")
        if name == "kube-apiserver":
            return Proc(name, [
                str(b / "kube-apiserver"), "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1", "--secure-port", str(p[name]),
                "--etcd-servers", f"http://127.0.0.1:{p['etcd']}",
                "--cert-dir", str(d / "apiserver-certs"),
                "--tls-cert-file", str(d / "apiserver.crt"),
                "--tls-private-key-file", str(d / "apiserver.key"),
                "--client-ca-file", str(d / "ca.crt"),
                "--token-auth-file", str(d / "tokens.csv"),
                "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file", str(d / "sa.pub"),
                "--service-account-signing-key-file", str(d / "sa.key"),
                "--service-cluster-ip-range", SERVICE_CIDR,
                "--authorization-mode", "Node,RBAC",
                # The `kubernetes` Service's endpoint would be 127.0.0.1, which the
                # API refuses for an Endpoints object: nothing in the tier needs it.
                "--endpoint-reconciler-type", "none",
                "--profiling=false", "--v", "1"], p[name], start_timeout=120)
        if name in ("kube-controller-manager", "kube-scheduler"):
            argv = [str(b / name), "--kubeconfig", str(self.kubeconfig),
                    "--bind-address", "127.0.0.1", "--secure-port", str(p[name]),
                    "--cert-dir", str(d / f"{name}-certs"), "--leader-elect=false",
                    "--profiling=false"]
            if name == "kube-controller-manager":
                argv += ["--service-account-private-key-file", str(d / "sa.key"),
                         "--root-ca-file", str(d / "ca.crt"),
                         "--cluster-signing-cert-file", str(d / "ca.crt"),
                         "--cluster-signing-key-file", str(d / "ca.key"),
                         "--use-service-account-credentials=false",
                         "--service-cluster-ip-range", SERVICE_CIDR]
            return Proc(name, argv, p[name], start_timeout=90)
        if name == "kwok":
            argv = [str(b / "kwok"), "--kubeconfig", str(self.kubeconfig),
                    "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
                    "--cidr", POD_CIDR, "--node-ip", "127.0.0.1",
                    "--server-address", f"127.0.0.1:{p[name]}"]
            for stage in sorted((b / "stages").glob("*.yaml")):
                argv += ["--config", str(stage)]
            return Proc(name, argv, p[name], start_timeout=60)
        raise ValueError(f"unknown kube process {name!r}")

    # -- the API, for readiness and the node (urllib: no client library needed)
    def api(self, method: str, path: str, body: dict[str, Any] | None = None,
            timeout: float = 10.0) -> tuple[int, dict[str, Any] | str]:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        req = urllib.request.Request(
            self.server + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
                status, raw = r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read().decode()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def _wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if self.api("GET", "/readyz", timeout=3)[0] == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"kube-apiserver not ready within {timeout:.0f}s; see "
                           f"{(self.log_dir / 'kube-apiserver.log').relative_to(ROOT)}")

    def _ensure_node(self) -> None:
        """The one fake node kwok manages: roomy enough for every chart scenario."""
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE_NAME, "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "type": "kwok"}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"},
                       "capacity": {"cpu": "64", "memory": "256Gi", "pods": "250"}}}
        status, got = self.api("POST", "/api/v1/nodes", node)
        if status not in (201, 409):
            raise RuntimeError(f"creating node {NODE_NAME}: {status} {got}")

    def up(self, names: list[str] | None = None) -> None:
        """Start the tier (an empty cluster with fresh credentials unless it runs)."""
        if not any(self.pid(n) for n in PROCESSES):
            shutil.rmtree(self.dir, ignore_errors=True)
            token = make_credentials(self.dir)
            write_kubeconfig(self.kubeconfig, self.server, self.ca, token)
        for name in names or PROCESSES:
            took = self.start(name)
            where = f"127.0.0.1:{self.kube_ports[name]}"
            say(f"{name:<23} " + ("already running" if took is None else
                                  f"up in {took:4.1f}s") + f"  {where}")
            if name == "kube-apiserver":
                self._wait_ready()
                self._ensure_node()
        say(f"kubeconfig: {self.kubeconfig.relative_to(ROOT)}")

    def down(self, names: list[str] | None = None) -> None:
        for name in names or list(reversed(PROCESSES)):
            if self.stop(name):
                say(f"{name:<23} stopped")

    def status(self) -> list[tuple[str, int | None, int]]:
        return [(n, self.pid(n), self.kube_ports[n]) for n in PROCESSES]


def main(profile: str, cmd: str) -> int:
    """devstack.py's kube-up / kube-down / kube-status / kube-build."""
    kube = KubeStack(profile)
    if cmd == "kube-build":
        say(f"kube tier binaries in {bin_dir().relative_to(ROOT)}")
    elif cmd == "kube-up":
        t0 = time.monotonic()
        bin_dir()
        kube.up()
        say(f"kube tier up in {time.monotonic() - t0:.1f}s; "
            f"export KUBECONFIG={kube.kubeconfig} (helm: "
            f"{devinstall.helm_bin().relative_to(ROOT)})")
    elif cmd == "kube-down":
        kube.down()
    elif cmd == "kube-status":
        for name, pid, port in kube.status():
            state = f"running (pid {pid})" if pid else "stopped"
            say(f"{name:<23} {state:<22} 127.0.0.1:{port}")
    return 0
