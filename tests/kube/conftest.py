"""The kube tier for tests/kube, started once per session (scripts/kubestack.py, test
profile): a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, and kwok
as the kubelet, on 127.0.0.1. kwok reports pods Running and Ready without running their
containers: these tests prove what the API server accepts and what the controllers, helm
and Spark ask of it, never that an image starts."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

import devstack
import kubestack

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dwell"
# The chart's scenarios: its defaults and every charts/dwell/ci/<name>-values.yaml.
SCENARIOS = {"defaults": [], **{p.name.removesuffix("-values.yaml"): ["-f", str(p)]
                                for p in sorted((CHART / "ci").glob("*-values.yaml"))}}

T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float, what: str, interval: float = 0.3) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Kube:
    """The running tier: its API (httpx, the admin token), kubectl and helm on it."""

    tier: kubestack.KubeStack
    api: httpx.Client
    kubectl_bin: Path
    helm_bin: Path

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, KUBECONFIG=str(self.tier.kubeconfig),
                    HELM_CACHE_HOME="/tmp/dwell-helm-cache",
                    HELM_CONFIG_HOME=str(self.tier.dir / "helm-config"),
                    HELM_DATA_HOME=str(self.tier.dir / "helm-data"))

    def kubectl(self, *args: str, stdin: str | None = None,
                check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        got = subprocess.run([str(self.kubectl_bin), *args], input=stdin, text=True,
                             capture_output=True, env=self.env, timeout=timeout)
        if check:
            assert got.returncode == 0, f"kubectl {' '.join(args)}:\n{got.stderr}"
        return got

    def helm(self, *args: str, check: bool = True,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
        got = subprocess.run([str(self.helm_bin), *args], text=True, capture_output=True,
                             env=self.env, timeout=timeout)
        if check:
            assert got.returncode == 0, f"helm {' '.join(args)}:\n{got.stdout}{got.stderr}"
        return got

    def get(self, path: str) -> dict[str, Any]:
        r = self.api.get(path)
        assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text}"
        return r.json()

    def items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        r = self.api.get(path, params=params)
        assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text}"
        return list(r.json()["items"])

    def namespace(self, prefix: str) -> str:
        """A fresh namespace, once its default ServiceAccount exists (pods need it)."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        r = self.api.post("/api/v1/namespaces",
                          json={"metadata": {"name": name}})
        assert r.status_code == 201, r.text
        wait_for(lambda: self.api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"
                                      ).status_code == 200, 60, f"{name}'s default account")
        return name

    def delete_namespace(self, name: str) -> None:
        self.api.delete(f"/api/v1/namespaces/{name}")

    def render(self, release: str, namespace: str, *args: str) -> list[dict[str, Any]]:
        got = self.helm("template", release, str(CHART), "--namespace", namespace,
                        "--kube-version", self.server_version(), *args)
        return [d for d in yaml.safe_load_all(got.stdout) if d]

    def server_version(self) -> str:
        return str(self.get("/version")["gitVersion"]).lstrip("v")


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    tier = kubestack.KubeStack("test")
    t0 = time.monotonic()
    bins = kubestack.bin_dir()
    started = not any(tier.pid(n) for n in kubestack.PROCESSES)
    tier.up()
    print(f"kube tier up in {time.monotonic() - t0:.1f}s "
          f"({'started' if started else 'already running'})")
    api = httpx.Client(base_url=tier.server, verify=str(tier.ca), timeout=30,
                       headers={"Authorization": f"Bearer {tier.token}"})
    wait_for(lambda: api.get(f"/api/v1/nodes/{kubestack.NODE_NAME}").json().get(
        "status", {}).get("conditions"), 60, "kwok to report the node")
    try:
        yield Kube(tier, api, bins / "kubectl", devstack.helm_bin())
    finally:
        api.close()
        if started and os.environ.get("DWELL_TEST_KEEP_SERVERS") != "1":
            tier.down()


@pytest.fixture(scope="session")
def spark_operator_crds(kube: Kube) -> list[str]:
    """The Kubeflow Spark Operator's CRDs, from its published module, installed and
    Established (server-side apply: they are too large for the last-applied annotation)."""
    names = []
    for crd in kubestack.spark_operator_crds():
        kube.kubectl("apply", "--server-side", "-f", str(crd))
        names.append(yaml.safe_load(crd.read_text())["metadata"]["name"])
    for name in names:
        wait_for(lambda n=name: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
            .get("status", {}).get("conditions", [])), 60, f"CRD {name} established")
    return names


def as_json(docs: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
