"""The kube tier's real node: containerd and runc (Debian's), the bridge and portmap CNI
plugins, a kubelet, kube-proxy (iptables) and CoreDNS, so that pods really run.

Everything the node serves sits on the pod bridge `cni0` (NODE_IP): the kubelet, CoreDNS
(the pods' cluster DNS), and the API server itself, which pods reach through the
`kubernetes` Service. The bridge is made before the kubelet starts and is reachable only
from this machine. State (containerd's root, the kubelet's, CNI's leases) lives under
`.dwell/<profile>/kube-node/`.

Two settings this kind of VM needs, found by running it:
- the capability bounding set lacks CAP_SYS_RESOURCE, so runc cannot raise a container's
  oom_score_adj and every sandbox fails (`can't get final child's PID from pipe: EOF`):
  containerd's CRI runs with `restrict_oom_score_adj`;
- the host runs cgroup v1 and its PID 1 is not systemd: the kubelet and runc use the
  cgroupfs driver and the kubelet is told cgroup v1 is expected.

`down` deletes the pods first (so CNI releases their addresses and rules), stops the
processes, and removes what the node added to the host: kube-proxy's and CNI's iptables
chains, the bridge, the kubelet's mounts and cgroups; ip_forward is put back.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dwell_dev.devinstall import ROOT, apt_install, say

NODE_NAME = "dwell-node-0"
BRIDGE = "cni0"
POD_SUBNET = "10.244.0.0/24"
NODE_IP = "10.244.0.1"
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN = Path("/usr/lib/cni")
# The sandbox ("pause") image: a static Go binary, made into an image by this module.
PAUSE_IMAGE = "dwell.local/pause:1"
PAUSE_MODULE = ROOT / "scripts" / "kube" / "pause"
# command -> Debian package
APT_PACKAGES = {"containerd": "containerd", "runc": "runc", "iptables": "iptables",
                "conntrack": "conntrack", str(CNI_BIN / "bridge"): "containernetworking-plugins"}
NODE_PROCESSES = ("containerd", "kubelet", "kube-proxy", "coredns")
# The default StorageClass: VOLUMES hostPath PersistentVolumes made at start.
STORAGE_CLASS = "dwell-local"
VOLUMES = 12
VOLUME_SIZE = "100Gi"


def ensure_packages() -> None:
    for command, package in APT_PACKAGES.items():
        if not (shutil.which(command) or Path(command).exists()):
            apt_install(package, "the kube tier's node")


def containerd_config(state: Path, sock: Path) -> str:
    return f"""\
version = 2
root = "{state / 'containerd'}"
state = "{state / 'containerd-state'}"
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # runc cannot raise oom_score_adj without CAP_SYS_RESOURCE (absent in this kind of VM).
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{state / 'cni'}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
"""


def cni_config(state: Path) -> dict[str, object]:
    return {"cniVersion": "1.0.0", "name": "dwell", "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
         "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET,
                                                     "gateway": NODE_IP}]],
                  "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(state / "cni-ipam")}},
        {"type": "portmap", "capabilities": {"portMappings": True}}]}


def kubelet_config(state: Path, sock: Path, kube_dir: Path,
                   ports: dict[str, int]) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": ports["kubelet"], "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": ports["kubelet_healthz"],
        "tlsCertFile": str(kube_dir / "kubelet.crt"),
        "tlsPrivateKeyFile": str(kube_dir / "kubelet.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(kube_dir / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{sock}",
        "clusterDNS": [NODE_IP], "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "/etc/resolv.conf", "failSwapOn": False,
        # A development node on a shared disk: evict only when it is really full.
        "evictionHard": {"memory.available": "200Mi", "nodefs.available": "2%",
                         "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
        "serializeImagePulls": False, "maxPods": 110,
        "nodeStatusReportFrequency": "10s", "syncFrequency": "10s",
        "podLogsDir": str(state / "pod-logs"),
        "staticPodPath": "", "enableServer": True, "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
    }


def coredns_corefile(kubeconfig: Path, health_port: int) -> str:
    return f"""\
.:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{health_port}
    cache 30
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    forward . /etc/resolv.conf
}}
"""


# ---------------------------------------------------------------- the sandbox image


def pause_archive(binary: Path, dest: Path) -> Path:
    """An OCI image archive holding only `binary` as /pause, its entrypoint: the sandbox
    image containerd starts for every pod, made here because no registry serves one."""
    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w") as t:
        info = tarfile.TarInfo("pause")
        info.mode, info.size, info.mtime = 0o755, binary.stat().st_size, 0
        with binary.open("rb") as f:
            t.addfile(info, f)
    diff_id = "sha256:" + hashlib.sha256(layer_tar.getvalue()).hexdigest()
    layer_digest, layer = blob(gzip.compress(layer_tar.getvalue(), mtime=0))
    config_digest, config = blob(json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode())
    manifest_digest, manifest = blob(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": len(layer)}]}).encode())
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": manifest_digest, "size": len(manifest),
        "annotations": {"io.containerd.image.name": PAUSE_IMAGE,
                        "org.opencontainers.image.ref.name": PAUSE_IMAGE}}]}).encode()
    with tarfile.open(dest, "w") as t:
        for name, data in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                           ("index.json", index),
                           *[(f"blobs/sha256/{d.split(':')[1]}", b) for d, b in
                             ((layer_digest, layer), (config_digest, config),
                              (manifest_digest, manifest))]]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            t.addfile(info, io.BytesIO(data))
    return dest


# ---------------------------------------------------------------- the host


def _run(*argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


def make_bridge() -> None:
    """The pod bridge with the node's address, before the kubelet binds to it (the bridge
    plugin takes it as it finds it)."""
    if _run("ip", "link", "show", BRIDGE).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge", check=True)
    addrs = _run("ip", "-4", "-o", "addr", "show", "dev", BRIDGE).stdout
    if f" {NODE_IP}/" not in addrs:
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE, check=True)
    _run("ip", "link", "set", BRIDGE, "up", check=True)


def enable_forwarding(state: Path) -> None:
    """Pods reach each other's Services through the bridge and NAT: ip_forward on,
    remembering what it was so that `down` puts it back."""
    knob = Path("/proc/sys/net/ipv4/ip_forward")
    saved = state / "ip_forward.saved"
    if not saved.exists():
        saved.write_text(knob.read_text())
    knob.write_text("1\n")
    bridged = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if not bridged.exists():
        say("warning: br_netfilter is not loaded: a pod cannot reach a Service whose "
            "endpoint is on the same bridge")


def _kill_containers(state: Path) -> None:
    """Every process left in the kubepods cgroups, and containerd's shims for this node
    (a container outlives containerd, the kubelet and its shim unless killed)."""
    pids: set[int] = set()
    for procs in Path("/sys/fs/cgroup").glob("*/kubepods/**/cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(p) for p in procs.read_text().split()}
    sock = str(state / "containerd.sock").encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (proc / "cmdline").read_bytes()
                if b"containerd-shim" in cmd and sock in cmd:
                    pids.add(int(proc.name))
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if pids:
        time.sleep(1)


def _delete_rules(table: str) -> None:
    """Jumps into CNI's and kube-proxy's chains from the built-in chains, then the chains."""
    rules = _run("iptables-save", "-t", table).stdout.splitlines()
    chains = [line[1:].split()[0] for line in rules if line.startswith(":")]
    ours = [c for c in chains if c.startswith(("CNI-", "KUBE-"))]
    for line in rules:
        if line.startswith("-A ") and any(f"-j {c}" in line for c in ours):
            _run("iptables", "-t", table, "-D", *shlex.split(line)[1:])
    for c in ours:
        _run("iptables", "-t", table, "-F", c)
    for c in ours:
        _run("iptables", "-t", table, "-X", c)


def restore_host(state: Path, kube_proxy: Path | None) -> None:
    """Undo what the node changed on the host; each step is safe to run twice."""
    _kill_containers(state)
    if kube_proxy is not None and kube_proxy.exists():
        _run(str(kube_proxy), "--cleanup")
    for table in ("nat", "filter", "mangle"):
        _delete_rules(table)
    _run("ip", "link", "delete", BRIDGE)
    for mount in reversed(Path("/proc/self/mounts").read_text().splitlines()):
        target = mount.split()[1]
        if target.startswith(str(state)) or target.startswith("/run/netns/cni-"):
            _run("umount", "-l", target)
    for netns in Path("/run/netns").glob("cni-*"):
        with contextlib.suppress(OSError):
            netns.unlink()
    # The kubelet's links to the containers' logs (these live in state/pod-logs).
    for link in Path("/var/log/containers").glob("*.log"):
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(str(state)):
                link.unlink()
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        kubepods = hierarchy / "kubepods"
        if kubepods.is_dir():
            for d in sorted(kubepods.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if d.is_dir():
                    with contextlib.suppress(OSError):
                        d.rmdir()
            with contextlib.suppress(OSError):
                kubepods.rmdir()
    saved = state / "ip_forward.saved"
    if saved.exists():
        Path("/proc/sys/net/ipv4/ip_forward").write_text(saved.read_text())
        saved.unlink()


def wait_socket(sock: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not sock.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"containerd's socket {sock} did not appear in {timeout:.0f}s")
        time.sleep(0.2)


def ctr(sock: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctr", "--address", str(sock), "--namespace", "k8s.io", *args],
                          check=check, capture_output=True, text=True)


def import_image(sock: Path, archive: Path) -> None:
    ctr(sock, "images", "import", "--all-platforms", str(archive))


def node_ready_wait(api_get: Callable[[str], tuple[int, Any]], timeout: float = 120.0) -> float:
    """Seconds until the kubelet's node reports Ready."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        status, node = api_get(f"/api/v1/nodes/{NODE_NAME}")
        if status == 200 and isinstance(node, dict):
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get(
                "conditions", [])}
            if conds.get("Ready") == "True":
                return time.monotonic() - t0
        time.sleep(0.5)
    raise RuntimeError(f"node {NODE_NAME} not Ready within {timeout:.0f}s")


def environ() -> dict[str, str]:
    # The kubelet and containerd find iptables, mount and the CNI plugins on PATH.
    path = os.environ.get("PATH", "/usr/bin:/bin")
    return {"PATH": f"{path}:/usr/sbin:/sbin"}
