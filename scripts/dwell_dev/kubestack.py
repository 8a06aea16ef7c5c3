"""The kube tier of the local stack: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and a node, with a CA, serving certificates, service-account keys and tokens
made at each start under `.dwell/<profile>/kube/`, and a kubeconfig there for helm and
kubectl. The node is either real (dwell_dev.kubenode: containerd, a kubelet, kube-proxy and
CoreDNS; pods run) or kwok's (pods are reported Running without running any container: fast
dry runs of the chart). With kwok everything listens on 127.0.0.1; with the real node the
API server and the node listen on the pod bridge's address, which pods reach.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dwell_dev import devinstall, devstack, kubenode
from dwell_dev.devinstall import CACHE, ROOT, say
from dwell_dev.devstack import Proc, Stack

KUBE_MODULES = ROOT / "scripts" / "kube"
KUBE_CACHE = CACHE / "kube"

# Ports of the dev profile; every other profile adds its offset (DWELL_TEST_PORT_OFFSET for
# the test profile), as devstack.py does for Redis and Kafka.
_DEV_PORTS = {"etcd": 2379, "etcd_peer": 2380, "kube-apiserver": 6443,
              "kube-controller-manager": 10257, "kube-scheduler": 10259, "kwok": 10247,
              "kubelet": 10250, "kubelet_healthz": 10248, "kube-proxy": 10256,
              "kube-proxy_metrics": 10249, "coredns": 8181}
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The processes of a tier with kwok's fake node, and with the real one.
PROCESSES = (*CONTROL_PLANE, "kwok")
REAL_PROCESSES = (*CONTROL_PLANE, *kubenode.NODE_PROCESSES)
NODES = ("real", "kwok")
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


def _cached_build(dest: Path, builds: dict[str, dict[str, str]], what: str,
                  finish: Callable[[Path], None], stamp: dict[str, str]) -> Path:
    """`builds` (module folder -> output name -> package) compiled into a fresh folder,
    `finish` adding the rest, then renamed to `dest`: a build cut short leaves no
    `.complete`, so the next start builds again."""
    if (dest / ".complete").exists():
        return dest
    if not shutil.which("go"):
        sys.exit(f"dwell: go is needed to build {what} from the Go module proxy")
    say(f"building {what} from the Go module proxy (once; minutes of Go compilation) into "
        f"{dest.relative_to(ROOT)}")
    t0 = time.monotonic()
    partial = KUBE_CACHE / f".partial-{dest.name.split('-')[0]}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    v = versions()
    for module, outputs in builds.items():
        for name, package in outputs.items():
            subprocess.run(["go", "build", "-trimpath", f"-ldflags={_ldflags(module, v)}",
                            "-o", str(partial / name), package],
                           cwd=KUBE_MODULES / module, env=_go_env(), check=True)
    finish(partial)
    (partial / ".complete").write_text(json.dumps(stamp) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    partial.rename(dest)
    say(f"{what} built in {time.monotonic() - t0:.0f}s")
    return dest


def bin_dir() -> Path:
    """The cached binaries (and kwok's stage configs), built once per version stamp."""
    v = versions()
    files = sorted(KUBE_MODULES.glob("*/go.*")) + sorted(KUBE_MODULES.glob("stages/*.yaml"))
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    dest = KUBE_CACHE / f"k8s-{v['kubernetes']}-etcd-{v['etcd']}-kwok-{v['kwok']}-{digest}"

    def stages(partial: Path) -> None:
        (partial / "stages").mkdir()
        kwok_src = _module_dir(KUBE_MODULES / "kwok", f"sigs.k8s.io/kwok@{v['kwok']}")
        for stage in KWOK_STAGES:
            shutil.copy(kwok_src / stage, partial / "stages" / Path(stage).name)
        for stage in sorted(KUBE_MODULES.glob("stages/*.yaml")):
            shutil.copy(stage, partial / "stages" / stage.name)

    return _cached_build(dest, _BUILDS, f"Kubernetes {v['kubernetes']}, etcd {v['etcd']} "
                                        f"and kwok {v['kwok']}", stages, v)


# The real node's binaries: module folder -> (output name -> package).
_NODE_BUILDS = {
    "k8s": {name: f"k8s.io/kubernetes/cmd/{name}" for name in
            ("kubelet", "kube-proxy", "kubectl")},
    "coredns": {"coredns": "."},
    "pause": {"pause": "."},
}


def node_bin_dir() -> Path:
    """The real node's binaries (kubelet, kube-proxy, kubectl, CoreDNS, the sandbox
    process and its image archive), built once per version stamp."""
    v = versions()
    coredns = _required(Path("coredns"), "github.com/coredns/coredns")
    files = sorted(KUBE_MODULES.glob("k8s/go.*")) + sorted(
        f for d in ("coredns", "pause") for f in (KUBE_MODULES / d).iterdir())
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    dest = KUBE_CACHE / f"node-{v['kubernetes']}-coredns-{coredns}-{digest}"
    return _cached_build(
        dest, _NODE_BUILDS, f"the kube tier's node (kubelet, kube-proxy and kubectl "
                            f"{v['kubernetes']}, CoreDNS {coredns})",
        lambda partial: kubenode.pause_archive(partial / "pause", partial / "pause.oci.tar"),
        v | {"coredns": coredns})


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


def _signed(d: Path, name: str, subject: str, ext: str) -> None:
    """name.key and name.crt, signed by d's CA."""
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "30",
             "-extfile", f"{name}.ext", cwd=d)
    (d / f"{name}.key").chmod(0o600)


# The real node's users, besides the admin: name -> (user, group).
NODE_USERS = {"kubelet": (f"system:node:{kubenode.NODE_NAME}", "system:nodes"),
              "kube-proxy": ("system:kube-proxy", ""),
              "coredns": ("dwell:coredns", "")}


def make_credentials(d: Path, node_ip: str | None = None) -> str:
    """A CA, the API server's serving certificate, the service-account key pair and an
    admin token (system:masters) in d; returns the token. With a real node at node_ip,
    also the kubelet's serving certificate, the API server's client certificate for the
    kubelet, and a token each for the kubelet, kube-proxy and CoreDNS."""
    if not shutil.which("openssl"):
        sys.exit("dwell: the openssl command is needed to make the kube tier's certificates")
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "30", "-subj", "/CN=dwell-kube-ca", cwd=d)
    sans = ["IP:127.0.0.1", f"IP:{SERVICE_CIDR.rsplit('.', 1)[0]}.1", "DNS:localhost",
            "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local"]
    if node_ip:
        sans.append(f"IP:{node_ip}")
    _signed(d, "apiserver", "/CN=kube-apiserver",
            f"subjectAltName={','.join(sans)}\nextendedKeyUsage=serverAuth\n")
    if node_ip:
        _signed(d, "kubelet", f"/CN={kubenode.NODE_NAME}",
                f"subjectAltName=IP:{node_ip},DNS:{kubenode.NODE_NAME}\n"
                "extendedKeyUsage=serverAuth\n")
        _signed(d, "apiserver-kubelet-client",
                "/O=system:masters/CN=kube-apiserver-kubelet-client",
                "extendedKeyUsage=clientAuth\n")
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "sa.key", cwd=d)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    token = secrets.token_hex(24)
    lines = [f'{token},dwell-admin,dwell-admin,"system:masters"']
    if node_ip:
        for name, (user, group) in NODE_USERS.items():
            node_token = secrets.token_hex(24)
            (d / f"{name}.token").write_text(node_token)
            (d / f"{name}.token").chmod(0o600)
            lines.append(f'{node_token},{user},{user}' + (f',"{group}"' if group else ""))
    (d / "tokens.csv").write_text("\n".join(lines) + "\n")
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
    .dwell/<profile>/kube/; the real node's state in .dwell/<profile>/kube-node/.

    `node`: "real" or "kwok"; None takes the node the running tier has (kwok if none runs).
    """

    def __init__(self, profile: str = "dev", node: str | None = None) -> None:
        super().__init__(profile)
        offset = self.ports["redis"] - devstack.PROFILES["dev"]["redis"]
        self.kube_ports = {name: port + offset for name, port in _DEV_PORTS.items()}
        self.dir = self.state / "kube"
        self.node_dir = self.state / "kube-node"
        self.kubeconfig = self.dir / "kubeconfig"
        self.ca = self.dir / "ca.crt"
        if node is None:
            mode = self.node_dir / "mode"
            node = mode.read_text().strip() if mode.exists() and self._running() else "kwok"
        if node not in NODES:
            raise ValueError(f"unknown node {node!r} (have {', '.join(NODES)})")
        self.node = node
        self.processes = REAL_PROCESSES if node == "real" else PROCESSES

    def _running(self) -> bool:
        return any(self.pid(n) for n in (*PROCESSES, *kubenode.NODE_PROCESSES))

    @property
    def host(self) -> str:
        """Where the API server listens: the pod bridge's address with a real node."""
        return kubenode.NODE_IP if self.node == "real" else "127.0.0.1"

    def where(self, name: str) -> str:
        """host:port a process of the tier listens on ("" for containerd's socket)."""
        port = self.kube_ports.get(name)
        if not port:
            return ""
        bridged = name == "kube-apiserver" or name in kubenode.NODE_PROCESSES
        return f"{self.host if bridged else '127.0.0.1'}:{port}"

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.kube_ports['kube-apiserver']}"

    @property
    def token(self) -> str:
        return (self.dir / "tokens.csv").read_text().split(",", 1)[0]

    @property
    def containerd_sock(self) -> Path:
        return self.node_dir / "containerd.sock"

    def available(self) -> list[str]:
        return list(self.processes)

    def proc_port(self, name: str) -> int:
        return self.kube_ports.get(name, 0)

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
        if name in kubenode.NODE_PROCESSES:
            return self._node_proc(name)
        if name == "kube-apiserver":
            if self.node == "real":
                # Pods reach it through the `kubernetes` Service, whose endpoint is the
                # bridge address; it asks kubelets for logs and exec by their InternalIP.
                where = ["--kubelet-preferred-address-types", "InternalIP,Hostname",
                         "--kubelet-client-certificate", str(d / "apiserver-kubelet-client.crt"),
                         "--kubelet-client-key", str(d / "apiserver-kubelet-client.key"),
                         "--kubelet-certificate-authority", str(d / "ca.crt")]
            else:
                # The `kubernetes` Service's endpoint would be 127.0.0.1, which the
                # API refuses for an Endpoints object: nothing with kwok needs it.
                where = ["--endpoint-reconciler-type", "none"]
            return Proc(name, [
                str(b / "kube-apiserver"), "--bind-address", self.host,
                "--advertise-address", self.host, "--secure-port", str(p[name]),
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
                "--authorization-mode", "Node,RBAC", *where,
                "--profiling=false", "--v", "1"],
                # Ready is told by _wait_ready (on the bridge address with a real node).
                p[name] if self.node == "kwok" else 0, start_timeout=120)
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

    def _node_kubeconfig(self, name: str) -> Path:
        path = self.node_dir / f"{name}.kubeconfig"
        write_kubeconfig(path, self.server, self.ca, (self.dir / f"{name}.token").read_text())
        return path

    def _node_proc(self, name: str) -> Proc:
        nb, n, p, env = node_bin_dir(), self.node_dir, self.kube_ports, kubenode.environ()
        if name == "containerd":
            conf = n / "containerd.toml"
            conf.write_text(kubenode.containerd_config(n, self.containerd_sock))
            (n / "cni").mkdir(parents=True, exist_ok=True)
            (n / "cni" / "10-dwell.conflist").write_text(
                json.dumps(kubenode.cni_config(n), indent=2) + "\n")
            return Proc(name, ["containerd", "--config", str(conf)], 0, env=env)
        if name == "kubelet":
            conf = n / "kubelet.json"
            conf.write_text(json.dumps(kubenode.kubelet_config(
                n, self.containerd_sock, self.dir,
                {"kubelet": p["kubelet"], "kubelet_healthz": p["kubelet_healthz"]}), indent=2))
            return Proc(name, [str(nb / "kubelet"), "--config", str(conf),
                               "--kubeconfig", str(self._node_kubeconfig("kubelet")),
                               "--hostname-override", kubenode.NODE_NAME,
                               "--node-ip", kubenode.NODE_IP, "--root-dir", str(n / "kubelet"),
                               "--v", "1"], 0, env=env,
                        health_url=f"http://127.0.0.1:{p['kubelet_healthz']}/healthz",
                        start_timeout=90)
        if name == "kube-proxy":
            return Proc(name, [str(nb / "kube-proxy"),
                               "--kubeconfig", str(self._node_kubeconfig("kube-proxy")),
                               "--hostname-override", kubenode.NODE_NAME,
                               "--proxy-mode", "iptables", "--cluster-cidr", kubenode.POD_SUBNET,
                               "--bind-address", kubenode.NODE_IP,
                               "--nodeport-addresses", f"{kubenode.NODE_IP}/32",
                               "--healthz-bind-address", f"127.0.0.1:{p['kube-proxy']}",
                               "--metrics-bind-address",
                               f"127.0.0.1:{p['kube-proxy_metrics']}",
                               # Leave the host's conntrack table size as it is.
                               "--conntrack-max-per-core", "0", "--v", "1"], 0, env=env,
                        health_url=f"http://127.0.0.1:{p['kube-proxy_metrics']}/healthz",
                        start_timeout=60)
        if name == "coredns":
            corefile = n / "Corefile"
            corefile.write_text(kubenode.coredns_corefile(self._node_kubeconfig("coredns"),
                                                          p["coredns"]))
            return Proc(name, [str(nb / "coredns"), "-conf", str(corefile)], 0, env=env,
                        health_url=f"http://127.0.0.1:{p['coredns']}/health", start_timeout=60)
        raise ValueError(f"unknown node process {name!r}")

    def _coredns_rbac(self) -> None:
        """What CoreDNS's kubernetes plugin reads, for its own user."""
        user = NODE_USERS["coredns"][0]
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "dwell:coredns"},
                "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods",
                                                             "namespaces"],
                           "verbs": ["list", "watch"]},
                          {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                           "verbs": ["list", "watch"]}]}
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "dwell:coredns"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": "dwell:coredns"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                 "name": user}]}
        for path, body in (("clusterroles", role), ("clusterrolebindings", binding)):
            status, got = self.api("POST", f"/apis/rbac.authorization.k8s.io/v1/{path}", body)
            if status not in (201, 409):
                raise RuntimeError(f"creating {path} dwell:coredns: {status} {got}")

    def _local_storage(self) -> None:
        """The cluster's default StorageClass on the real node: statically made hostPath
        volumes under kube-node/volumes/, bound when a pod first uses a claim (no
        provisioner image is needed). Writable by any user: pods run as non-root."""
        sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
              "metadata": {"name": kubenode.STORAGE_CLASS, "annotations": {
                  "storageclass.kubernetes.io/is-default-class": "true"}},
              "provisioner": "kubernetes.io/no-provisioner",
              "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Retain"}
        status, got = self.api("POST", "/apis/storage.k8s.io/v1/storageclasses", sc)
        if status not in (201, 409):
            raise RuntimeError(f"creating StorageClass {kubenode.STORAGE_CLASS}: {status} {got}")
        for i in range(kubenode.VOLUMES):
            path = self.node_dir / "volumes" / f"pv-{i}"
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o1777)
            pv = {"apiVersion": "v1", "kind": "PersistentVolume",
                  "metadata": {"name": f"dwell-local-{i}"},
                  "spec": {"capacity": {"storage": kubenode.VOLUME_SIZE},
                           "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                           "persistentVolumeReclaimPolicy": "Retain",
                           "storageClassName": kubenode.STORAGE_CLASS,
                           "hostPath": {"path": str(path), "type": "Directory"}}}
            status, got = self.api("POST", "/api/v1/persistentvolumes", pv)
            if status not in (201, 409):
                raise RuntimeError(f"creating PersistentVolume dwell-local-{i}: {status} {got}")

    def delete_pods(self, timeout: float = 60.0) -> None:
        """Delete every pod, and wait until the kubelet has torn them down (CNI releases
        their addresses and rules): before the node stops."""
        status, got = self.api("GET", "/api/v1/pods")
        if status != 200 or not isinstance(got, dict):
            return
        for pod in got.get("items", []):
            m = pod["metadata"]
            self.api("DELETE", f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}",
                     {"gracePeriodSeconds": 5})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, got = self.api("GET", "/api/v1/pods")
            if status != 200 or not isinstance(got, dict) or not got.get("items"):
                return
            time.sleep(1)
        say(f"warning: pods still there after {timeout:.0f}s; stopping the node anyway")

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
        real = self.node == "real"
        mode = self.node_dir / "mode"
        if self._running() and mode.exists() and mode.read_text().strip() != self.node:
            raise RuntimeError(f"the {self.profile} kube tier runs with the "
                               f"{mode.read_text().strip()} node; kube-down first")
        if not self._running():
            if real:
                self._claim_the_node()
            shutil.rmtree(self.dir, ignore_errors=True)
            token = make_credentials(self.dir, kubenode.NODE_IP if real else None)
            write_kubeconfig(self.kubeconfig, self.server, self.ca, token)
            self.node_dir.mkdir(parents=True, exist_ok=True)
            (self.node_dir / "mode").write_text(self.node + "\n")
        if real:
            kubenode.ensure_packages()
            kubenode.make_bridge()
            kubenode.enable_forwarding(self.node_dir)
        for name in names or self.processes:
            took = self.start(name)
            say(f"{name:<23} " + ("already running" if took is None else
                                  f"up in {took:4.1f}s") + f"  {self.where(name)}".rstrip())
            if name == "kube-apiserver":
                self._wait_ready()
                if real:
                    self._coredns_rbac()
                    self._local_storage()
                else:
                    self._ensure_node()
            elif name == "containerd":
                kubenode.wait_socket(self.containerd_sock)
                kubenode.import_image(self.containerd_sock, node_bin_dir() / "pause.oci.tar")
            elif name == "kubelet":
                took = kubenode.node_ready_wait(lambda path: self.api("GET", path))
                say(f"{'':<23} node {kubenode.NODE_NAME} Ready in {took:.1f}s")
        say(f"kubeconfig: {self.kubeconfig.relative_to(ROOT)}")

    def _claim_the_node(self) -> None:
        """One real node per machine: it owns the bridge and its address."""
        for profile in devstack.PROFILES:
            if profile != self.profile:
                other = KubeStack(profile)
                if other.node == "real":
                    raise RuntimeError(f"the {profile} profile's kube tier runs the real "
                                       f"node; stop it first (kube-down)")

    def down(self, names: list[str] | None = None) -> None:
        real = self.node == "real"
        if real and not names and self.pid("kube-apiserver") and self.pid("kubelet"):
            # With no controllers left to make them again, the pods go for good.
            for name in ("kube-controller-manager", "kube-scheduler"):
                if self.stop(name):
                    say(f"{name:<23} stopped")
            self.delete_pods()
        for name in names or list(reversed(self.processes)):
            if self.stop(name):
                say(f"{name:<23} stopped")
        if real and not self._running():
            kubenode.restore_host(self.node_dir, node_bin_dir() / "kube-proxy")
            say("host restored: iptables chains, the pod bridge, mounts, cgroups, ip_forward")

    def images(self) -> list[str]:
        """The images containerd holds for the cluster."""
        got = kubenode.ctr(self.containerd_sock, "images", "list", "--quiet")
        return [line for line in got.stdout.splitlines() if not line.startswith("sha256:")]

    def import_images(self, archives: list[Path]) -> None:
        for archive in archives:
            t0 = time.monotonic()
            kubenode.import_image(self.containerd_sock, archive)
            say(f"imported {archive.name} into the node's containerd in "
                f"{time.monotonic() - t0:.1f}s")

    def status(self) -> list[tuple[str, int | None, int]]:
        return [(n, self.pid(n), self.kube_ports.get(n, 0)) for n in self.processes]


def main(profile: str, cmd: str, node: str = "real") -> int:
    """devstack.py's kube-up / kube-down / kube-status / kube-build / kube-images."""
    kube = KubeStack(profile, node if cmd in ("kube-up", "kube-build") else None)
    if cmd == "kube-build":
        say(f"kube tier binaries in {bin_dir().relative_to(ROOT)}")
        if kube.node == "real":
            say(f"node binaries in {node_bin_dir().relative_to(ROOT)}")
    elif cmd == "kube-up":
        t0 = time.monotonic()
        bin_dir()
        if kube.node == "real":
            node_bin_dir()
        kube.up()
        say(f"kube tier up in {time.monotonic() - t0:.1f}s ({kube.node} node); "
            f"export KUBECONFIG={kube.kubeconfig} (helm: "
            f"{devinstall.helm_bin().relative_to(ROOT)})")
    elif cmd == "kube-down":
        kube.down()
    elif cmd == "kube-images":
        if kube.node != "real" or not kube.pid("containerd"):
            sys.exit("dwell: kube-images needs the real node running (make kube-up)")
        archives = sorted((devinstall.STATE_ROOT / "images").glob("*.tar"))
        if not archives:
            sys.exit("dwell: no images in .dwell/images: run `make images` first")
        kube.import_images(archives)
        for ref in kube.images():
            say(ref)
    elif cmd == "kube-status":
        say(f"{kube.node} node")
        for name, pid, _port in kube.status():
            state = f"running (pid {pid})" if pid else "stopped"
            say(f"{name:<23} {state:<22} {kube.where(name)}".rstrip())
    return 0
