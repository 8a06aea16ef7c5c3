"""The kube tier for tests/kube, started once per session (dwell_dev.kubestack, test
profile): a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, and kwok
as the kubelet, on 127.0.0.1. kwok reports pods Running and Ready without running their
containers: these tests prove what the API server accepts and what the controllers, helm
and Spark ask of it, never that an image starts."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from dwell_dev import devinstall, kubestack
from dwell_dev.kubeclient import CHART, Kube, wait_for

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
