"""The chart on the kube tier's real node (`make kube-test`, not part of `make test`):
containerd runs dwell's own images (`make images`, imported into the node, never pulled),
the Spark driver runs in a pod and creates executor pods that do the work, Services and
cluster DNS connect the processes. Redis and Kafka run on the host (profile `kube`) and
the pods reach them on the pod bridge: the chart's in-chart Redis and Kafka use Docker
Hub's images, which this machine cannot pull.

The tests on the host reach the cluster the way a user on the node would: Services by
their ClusterIP (kube-proxy's rules), pods by their IP on the bridge, Kafka on 127.0.0.1.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from dwell.smoke import signed_token
from dwell_dev import devinstall, devstack, kubenode, kubestack
from dwell_dev.kubeclient import CHART, Kube, wait_for

HERE = Path(__file__).parent
IMAGES = devinstall.STATE_ROOT / "images"
ARCHIVES = ("dwell.oci.tar", "dwell-spark.oci.tar")
RELEASE = "dwell"
SUPER_USER = "admin"


@dataclass
class Cluster:
    kube: Kube
    stack: devstack.Stack
    namespace: str
    token: str

    @property
    def kafka_bootstrap(self) -> str:
        return self.stack.kafka_bootstrap

    def service_url(self, component: str, port: int) -> str:
        svc = self.kube.get(f"/api/v1/namespaces/{self.namespace}/services/"
                            f"{RELEASE}-{component}")
        return f"http://{svc['spec']['clusterIP']}:{port}"

    def pods(self, selector: str | None = None) -> list[dict[str, Any]]:
        return self.kube.items(f"/api/v1/namespaces/{self.namespace}/pods", selector)

    def pod_log(self, name: str) -> str:
        r = self.kube.api.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}/log")
        assert r.status_code == 200, r.text
        return r.text

    def table(self) -> str:
        return self.kube.table(f"/api/v1/namespaces/{self.namespace}/pods")

    def all_ready(self) -> bool:
        pods = self.pods()
        return bool(pods) and all(
            p["status"].get("phase") == "Running" and all(
                c.get("ready") for c in p["status"].get("containerStatuses", []))
            for p in pods if not p["metadata"].get("deletionTimestamp"))

    def client_env(self) -> dict[str, str]:
        """What dwell's SDK on the host needs to use the release."""
        return dict(os.environ, DWELL_KAFKA_BOOTSTRAP=self.kafka_bootstrap,
                    DWELL_ADMISSION_URL=self.service_url("admission", 8082),
                    DWELL_POLICY_URL=self.service_url("policy", 8081),
                    DWELL_TRACKER_URL=self.service_url("tracker", 8083),
                    DWELL_AUTH_PARAMS=f"token:{self.token}")


def values_file(stack: devstack.Stack, dest: Path) -> Path:
    text = (HERE / "host-values.yaml").read_text()
    text = (text.replace("REDIS_HOST", kubenode.NODE_IP)
            .replace("REDIS_PORT", str(stack.ports["redis"]))
            .replace("KAFKA_BOOTSTRAP", f"{kubenode.NODE_IP}:{stack.ports['kafka_pods']}"))
    dest.write_text(text)
    return dest


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    missing = [a for a in ARCHIVES if not (IMAGES / a).exists()]
    if missing:
        pytest.fail(f"no {', '.join(missing)} in {IMAGES}: run `make images` (make kube-test "
                    f"does)")
    keep = os.environ.get("DWELL_TEST_KEEP_SERVERS") == "1"
    tier = kubestack.KubeStack("kube", node="real")
    stack = devstack.Stack("kube", pods=True)
    t0 = time.monotonic()
    kubestack.bin_dir()
    kubestack.node_bin_dir()
    tier.up()
    print(f"kube tier up in {time.monotonic() - t0:.1f}s (real node)")
    tier.import_images([IMAGES / a for a in ARCHIVES])
    stack.up(["redis", "kafka"])
    api = httpx.Client(base_url=tier.server, timeout=30,
                       verify=ssl.create_default_context(cafile=str(tier.ca)),
                       headers={"Authorization": f"Bearer {tier.token}"})
    kube = Kube(tier, api, devinstall.helm_bin())
    ns = kube.namespace("dwell")
    try:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.monotonic()
            kube.helm("install", RELEASE, str(CHART), "--namespace", ns,
                      "-f", str(values_file(stack, Path(d) / "values.yaml")),
                      "--wait", "--timeout", "10m", timeout=700)
        print(f"helm install --wait: {time.monotonic() - t0:.1f}s")
        # The key the chart made (auth.generateKeys), as the smoke test's hook reads it.
        keys = kube.get(f"/api/v1/namespaces/{ns}/secrets/{RELEASE}-token-keys")["data"]
        token = signed_token(f"data:;base64,{keys['secret.key']}", SUPER_USER)
        c = Cluster(kube, stack, ns, token)
        wait_for(c.all_ready, 300, "every pod Ready")
        yield c
    finally:
        api.close()
        if not keep:
            tier.down()
            stack.down(["kafka", "redis"])


def unique() -> str:
    return f"k{uuid.uuid4().hex[:8]}"
