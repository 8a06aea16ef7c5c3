"""The kube tier's API and helm, as the suites that install the chart use them
(tests/kube on kwok's node, tests/kubelet on the real one): httpx with the admin token for
everything a kubectl would do, so that no kubectl is assumed on the machine."""

from __future__ import annotations

import functools
import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from dwell_dev import kubestack, testkit
from dwell_dev.devinstall import ROOT

CHART = ROOT / "charts" / "dwell"

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
