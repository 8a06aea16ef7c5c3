"""The kube tier for tests/kube, started once per session (dwell_dev.kubestack, test
profile): a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, and kwok
as the kubelet, on 127.0.0.1. kwok reports pods Running and Ready without running their
containers: these tests prove what the API server accepts and what the controllers, helm
and Spark ask of it, never that an image starts."""

from __future__ import annotations

import functools
import os
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dwell_dev import devinstall, kubestack, testkit

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dwell"
# Token auth is on by default and needs the Secret holding its key: every scenario but
# ci/'s names one (a scenario's own values file may name another); ci/'s install as they
# are, with the keys the chart makes.
TOKEN_SECRET = "dwell-token-keys"
# ci/: what installs as it is on any cluster, as chart-testing installs it; examples/: what
# needs more around it (external servers, Secrets, an operator's CRDs, a local image).
VALUES_FILES = {p.name.removesuffix("-values.yaml"): p
                for d in ("ci", "examples") for p in sorted((CHART / d).glob("*-values.yaml"))}
# The chart's scenarios: its defaults and every values file.
SCENARIOS = {"defaults": [], **{name: ["-f", str(p)] for name, p in VALUES_FILES.items()}}
SCENARIOS = {name: args if name in VALUES_FILES and VALUES_FILES[name].parent.name == "ci"
             else ["--set", f"auth.existingSecret={TOKEN_SECRET}", *args]
             for name, args in SCENARIOS.items()}

# Each poll is a call to the API server: a slower beat than the other suites'.
wait_for = functools.partial(testkit.wait_for, interval=0.3)


@dataclass
class Kube:
    """The running tier: its API (httpx with the admin token) and helm on it. Everything a
    kubectl would do here goes to the API directly: no kubectl is assumed on the machine."""

    tier: kubestack.KubeStack
    api: httpx.Client
    helm_bin: Path
    _resources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, KUBECONFIG=str(self.tier.kubeconfig),
                    HELM_CACHE_HOME="/tmp/dwell-helm-cache",
                    HELM_CONFIG_HOME=str(self.tier.dir / "helm-config"),
                    HELM_DATA_HOME=str(self.tier.dir / "helm-data"))

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
        return dict(r.json())

    def items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        r = self.api.get(path, params=params)
        assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text}"
        return list(r.json()["items"])

    # -- discovery: where a kind lives, as kubectl's REST mapper finds it
    def resources(self, group_version: str, fresh: bool = False) -> list[dict[str, Any]]:
        if fresh or group_version not in self._resources:
            base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
            r = self.api.get(base)
            self._resources[group_version] = (r.json()["resources"]
                                              if r.status_code == 200 else [])
        return self._resources[group_version]

    def collection(self, doc: dict[str, Any], ns: str) -> str:
        gv, kind = doc["apiVersion"], doc["kind"]
        for fresh in (False, True):
            for res in self.resources(gv, fresh):
                if res["kind"] == kind and "/" not in res["name"]:
                    base = "/api/v1" if gv == "v1" else f"/apis/{gv}"
                    scope = f"/namespaces/{ns}" if res["namespaced"] else ""
                    return f"{base}{scope}/{res['name']}"
        raise AssertionError(f"the API server does not know {gv} {kind}")

    def create(self, doc: dict[str, Any], ns: str, dry_run: bool = False) -> httpx.Response:
        """POST the object with strict field validation (kubectl --validate=strict), and
        with dryRun=All for a server-side dry run (kubectl --dry-run=server)."""
        params = {"fieldValidation": "Strict"} | ({"dryRun": "All"} if dry_run else {})
        return self.api.post(self.collection(doc, ns), json=doc, params=params)

    def namespaced_objects(self, ns: str) -> set[tuple[str, str]]:
        """(kind, name) of everything listable in a namespace, events aside."""
        versions = ["v1"] + [g["preferredVersion"]["groupVersion"]
                             for g in self.get("/apis")["groups"]]
        found = set()
        for gv in versions:
            base = "/api/v1" if gv == "v1" else f"/apis/{gv}"
            for res in self.resources(gv, fresh=True):
                if (not res["namespaced"] or "/" in res["name"] or "list" not in res["verbs"]
                        or res["kind"] == "Event"):
                    continue
                for o in self.items(f"{base}/namespaces/{ns}/{res['name']}"):
                    found.add((res["kind"], o["metadata"]["name"]))
        return found

    def table(self, path: str) -> str:
        """A list as `kubectl get -o wide` prints it: the server's own Table columns."""
        r = self.api.get(path, headers={"Accept": "application/json;as=Table;v=v1;"
                                                  "g=meta.k8s.io"})
        assert r.status_code == 200, r.text
        t = r.json()
        rows = [[c["name"].upper() for c in t["columnDefinitions"]]]
        rows += [[str(v) for v in row["cells"]] for row in t["rows"]]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("   ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)
                                    ).rstrip() for row in rows)

    def namespace(self, prefix: str) -> str:
        """A fresh namespace, once its default ServiceAccount exists (pods need it)."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        r = self.api.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": name}})
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
    started = not any(tier.pid(n) for n in kubestack.PROCESSES)
    tier.up()
    print(f"kube tier up in {time.monotonic() - t0:.1f}s "
          f"({'started' if started else 'already running'})")
    api = httpx.Client(base_url=tier.server, verify=ssl.create_default_context(
        cafile=str(tier.ca)), timeout=30,
                       headers={"Authorization": f"Bearer {tier.token}"})
    wait_for(lambda: api.get(f"/api/v1/nodes/{kubestack.NODE_NAME}").json().get(
        "status", {}).get("conditions"), 60, "kwok to report the node")
    try:
        yield Kube(tier, api, devinstall.helm_bin())
    finally:
        api.close()
        if started and os.environ.get("DWELL_TEST_KEEP_SERVERS") != "1":
            tier.down()


@pytest.fixture(scope="session")
def spark_operator_crds(kube: Kube) -> list[str]:
    """The Kubeflow Spark Operator's CRDs, from its published module, installed and
    Established."""
    names = []
    for crd in kubestack.spark_operator_crds():
        doc = yaml.safe_load(crd.read_text())
        r = kube.create(doc, "")
        assert r.status_code in (201, 409), r.text
        names.append(doc["metadata"]["name"])
    for name in names:
        wait_for(lambda n=name: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
            .get("status", {}).get("conditions") or []), 60, f"CRD {name} established")
    return names
