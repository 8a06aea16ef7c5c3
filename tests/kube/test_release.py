"""One release of the chart (charts/dwell/ci/minimal-values.yaml as it is, as chart-testing
installs it: no Secret made beforehand, the token keys made by the chart) through its life
on the kube tier, in order: `helm install --wait`, Spark on Kubernetes from the installed driver's
own spark-submit line, `helm upgrade` rolling exactly the pods whose template changed,
`helm test`, and `helm uninstall` leaving only what the chart keeps on purpose.

kwok runs no container: pods are Running and Ready because kwok says so. What this proves
is what the API server, its controllers, helm and Spark do with the chart's objects;
that the containers work is proven by the e2e suite (tests/e2e, including the
`helm test` command, python -m dwell.smoke) and by the images' own checks."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest

from dwell_dev.procs import Child
from dwell_dev.testkit import free_port

from .conftest import CHART, SCENARIOS, Kube, wait_for

RELEASE = "rel"
VALUES = SCENARIOS["minimal"]
SPARK = f"{RELEASE}-dwell-spark"
# What `helm uninstall` leaves on purpose (docs/kubernetes.md): the Spark checkpoints'
# PVC and the Redis password's Secret (helm.sh/resource-policy: keep), and the PVCs of
# the StatefulSets' volumeClaimTemplates, which Kubernetes never deletes with them.
KEPT = {("PersistentVolumeClaim", f"{SPARK}-checkpoints"),
        ("PersistentVolumeClaim", f"data-{RELEASE}-dwell-redis-0"),
        ("PersistentVolumeClaim", f"data-{RELEASE}-dwell-kafka-0"),
        ("Secret", f"{RELEASE}-dwell-redis")}
# Present in every namespace, made by Kubernetes itself.
AMBIENT = {("ServiceAccount", "default"), ("ConfigMap", "kube-root-ca.crt")}
# The token keys the chart makes (auth.generateKeys): they go with the release.
TOKEN_KEYS = f"{RELEASE}-dwell-token-keys"


@dataclass
class Release:
    ns: str
    install_s: float


def make_volumes(kube: Kube, ns: str, count: int) -> list[str]:
    """PersistentVolumes for the release's claims: the tier has no provisioner."""
    names = []
    for i in range(count):
        name = f"{ns}-pv-{i}"
        r = kube.api.post("/api/v1/persistentvolumes", json={
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "50Gi"},
                     "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": f"/tmp/dwell-kube-pv/{name}"}}})
        assert r.status_code == 201, r.text
        names.append(name)
    return names


def pods(kube: Kube, ns: str, selector: str | None = None) -> list[dict[str, Any]]:
    return kube.items(f"/api/v1/namespaces/{ns}/pods", selector)


def ready(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod["status"].get("conditions", []))


@pytest.fixture(scope="module")
def release(kube: Kube) -> Iterator[Release]:
    ns = kube.namespace("release")
    volumes = make_volumes(kube, ns, 3)
    try:
        t0 = time.monotonic()
        kube.helm("install", RELEASE, str(CHART), "-n", ns, *VALUES, "--wait",
                  "--timeout", "5m")
        took = time.monotonic() - t0
        print(f"helm install --wait: {took:.1f}s")
        print(f"kubectl get pods -o wide -n {ns}:\n" + kube.table(f"/api/v1/namespaces/{ns}/pods"))
        yield Release(ns, took)
    finally:
        kube.helm("uninstall", RELEASE, "-n", ns, "--wait", check=False)
        kube.delete_namespace(ns)
        for pv in volumes:
            kube.api.delete(f"/api/v1/persistentvolumes/{pv}")


def test_install_waits_for_every_pod(kube: Kube, release: Release) -> None:
    got = pods(kube, release.ns)
    components = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in got)
    assert components == ["admission", "kafka", "policy", "redis", "spark", "tracker"]
    assert all(ready(p) for p in got)
    assert all(p["spec"]["nodeName"] == "kwok-node-0" for p in got)
    claims = kube.items(f"/api/v1/namespaces/{release.ns}/persistentvolumeclaims")
    assert {c["metadata"]["name"]: c["status"]["phase"] for c in claims} == {
        name: "Bound" for kind, name in KEPT if kind == "PersistentVolumeClaim"}
    status = kube.helm("status", RELEASE, "-n", release.ns, "-o", "json")
    assert json.loads(status.stdout)["info"]["status"] == "deployed"


# ---------------------------------------------------------------- Spark on Kubernetes


def driver_command(kube: Kube, ns: str, driver: dict[str, Any],
                   overrides: dict[str, str], stop: Path) -> list[str]:
    """The installed driver container's spark-submit line, its $(VARS) filled as the
    kubelet would (the master is the tier's API server), `--conf`s in `overrides` replaced
    or added, and tests/kube/spark_app.py as the application (it stops once `stop`
    exists)."""
    dep = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{SPARK}")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    env = {"POD_NAME": driver["metadata"]["name"],
           "DWELL_SPARK_MASTER": f"k8s://{kube.tier.server}"}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in container["args"]]
    assert args[0] == "spark-submit" and args[-1] == "/opt/dwell/spark/launch.py"
    out, i, left = [], 1, dict(overrides)
    while i < len(args) - 1:
        if args[i] == "--conf":
            key = args[i + 1].split("=", 1)[0]
            out += ["--conf", f"{key}={left.pop(key)}" if key in left else args[i + 1]]
            i += 2
        else:
            out.append(args[i])
            i += 1
    for key, value in left.items():
        out += ["--conf", f"{key}={value}"]
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    return [str(spark_submit), *out, str(Path(__file__).parent / "spark_app.py"), str(stop)]


def test_spark_submit_in_client_mode_creates_and_deletes_the_executor_pods(
        kube: Kube, release: Release, tmp_path: Path) -> None:
    """spark-submit as the chart's driver runs it, from this machine's PySpark: Spark asks
    the API server for executor pods made from the chart's template, owned by the driver
    pod, with its volumes and security context, and deletes them when the app stops.
    kwok reports the executors Running but runs nothing, so they never register with the
    driver: the check is on what Spark asked Kubernetes for."""
    ns = release.ns
    driver = pods(kube, ns, "app.kubernetes.io/component=spark,spark-role=driver")[0]
    cm = kube.get(f"/api/v1/namespaces/{ns}/configmaps/{SPARK}-executor")
    template = tmp_path / "executor.yaml"
    template.write_text(cm["data"]["executor.yaml"])
    # The driver's own ServiceAccount token: the chart's Role is what Spark works with.
    r = kube.api.post(f"/api/v1/namespaces/{ns}/serviceaccounts/{SPARK}/token",
                      json={"apiVersion": "authentication.k8s.io/v1",
                            "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    assert r.status_code == 201, r.text
    token = tmp_path / "token"
    token.write_text(r.json()["status"]["token"])
    # spark.authenticate: the pod reads the release's RPC secret from its mounted Secret;
    # this machine's driver reads the same secret from a file of its own.
    secret = kube.get(f"/api/v1/namespaces/{ns}/secrets/{SPARK}-auth")
    rpc_secret = tmp_path / "spark-auth-secret"
    rpc_secret.write_bytes(base64.b64decode(secret["data"]["spark-auth-secret"]))
    overrides = {
        "spark.kubernetes.executor.podTemplateFile": str(template),
        "spark.kubernetes.authenticate.caCertFile": str(kube.tier.ca),
        "spark.kubernetes.authenticate.oauthTokenFile": str(token),
        "spark.authenticate.secret.driver.file": str(rpc_secret),
        # This machine's driver listens on loopback, on free ports (the pod's 0.0.0.0,
        # 7078 and 7079 are the cluster's); executors still get the chart's driver host.
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.port": str(free_port()),
        "spark.driver.blockManager.port": str(free_port()),
        # Executors never register under kwok: do not hold the session 30 s for them.
        "spark.scheduler.minRegisteredResourcesRatio": "0",
    }
    stop = tmp_path / "stop"
    argv = driver_command(kube, ns, driver, overrides, stop)
    log = tmp_path / "spark-submit.log"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("SPARK_HOME", None)
    app = Child.spawn("spark-submit", argv, log, env)
    selector = "spark-role=executor"
    try:
        executors = wait_for(lambda: [p for p in pods(kube, ns, selector) if ready(p)]
                             if app.running() else _fail(log), 180,
                             "Spark's executor pods")
        chart_pod = driver["spec"]
        chart_container = driver["spec"]["containers"][0]
        for pod in executors:
            spec = pod["spec"]
            container = next(c for c in spec["containers"] if c["name"] == "executor")
            shown = {"name": pod["metadata"]["name"],
                     "ownerReferences": pod["metadata"]["ownerReferences"],
                     "labels": pod["metadata"]["labels"],
                     "image": container["image"],
                     "securityContext": spec["securityContext"],
                     "container.securityContext": container["securityContext"],
                     "automountServiceAccountToken": spec.get("automountServiceAccountToken"),
                     "volumes": spec["volumes"], "volumeMounts": container["volumeMounts"],
                     "SPARK_DRIVER_URL": next(e["value"] for e in container["env"]
                                              if e["name"] == "SPARK_DRIVER_URL")}
            print(json.dumps(shown, indent=2))
            assert pod["metadata"]["ownerReferences"] == [{
                "apiVersion": "v1", "kind": "Pod", "name": driver["metadata"]["name"],
                "uid": driver["metadata"]["uid"], "controller": True}]
            labels = pod["metadata"]["labels"]
            assert labels["app.kubernetes.io/component"] == "spark-executor"
            assert labels["app.kubernetes.io/instance"] == RELEASE
            assert labels["app.kubernetes.io/part-of"] == "dwell"
            assert container["image"] == chart_container["image"]
            assert spec["securityContext"] == chart_pod["securityContext"]
            assert container["securityContext"] == chart_container["securityContext"]
            assert spec["automountServiceAccountToken"] is False
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
            # Only the driver writes checkpoints: the queries keep no state on executors.
            assert "checkpoints" not in volumes
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert mounts["tmp"] == "/tmp"
            assert "checkpoints" not in mounts
            assert f"@{SPARK}.{ns}.svc:" in shown["SPARK_DRIVER_URL"]
        assert len(executors) == 1  # spark.executor.instances of the minimal scenario
    finally:
        stop.touch()
        if not app.wait_exit(90):
            app.kill()
    text = log.read_text(errors="replace")
    assert app.returncode == 0, text[-4000:]
    assert "spark_app: stopped" in text
    wait_for(lambda: not pods(kube, ns, selector), 60, "the executor pods to be deleted")


def _fail(log: Path) -> None:
    raise AssertionError("spark-submit exited:\n" + log.read_text(errors="replace")[-4000:])


# ---------------------------------------------------------------- upgrade, test, uninstall


def test_upgrade_rolls_exactly_the_pods_whose_template_changed(
        kube: Kube, release: Release) -> None:
    ns = release.ns
    before = {p["metadata"]["name"]: p for p in pods(kube, ns)}
    gens = {f"{k}/{w['metadata']['name']}": w["metadata"]["generation"]
            for k in ("deployments", "statefulsets")
            for w in kube.items(f"/apis/apps/v1/namespaces/{ns}/{k}")}
    secret = kube.get(f"/api/v1/namespaces/{ns}/secrets/{RELEASE}-dwell-redis")["data"]
    keys = kube.get(f"/api/v1/namespaces/{ns}/secrets/{TOKEN_KEYS}")["data"]
    assert {k: len(base64.b64decode(v)) for k, v in keys.items()} == {
        "secret.key": 32, "kafka-token.key": 32}
    kube.helm("upgrade", RELEASE, str(CHART), "-n", ns, *VALUES,
              "--set", "tracker.config.stats_refresh_s=5", "--wait", "--timeout", "5m")
    tracker = "app.kubernetes.io/component=tracker"
    old_tracker = [n for n, p in before.items()
                   if p["metadata"]["labels"]["app.kubernetes.io/component"] == "tracker"]
    wait_for(lambda: not any(p["metadata"]["name"] in old_tracker
                             for p in pods(kube, ns, tracker)), 60, "the old tracker pod")
    after = {p["metadata"]["name"]: p for p in pods(kube, ns)}
    new_gens = {f"{k}/{w['metadata']['name']}": w["metadata"]["generation"]
                for k in ("deployments", "statefulsets")
                for w in kube.items(f"/apis/apps/v1/namespaces/{ns}/{k}")}
    print("generations before:", gens, "\nafter:", new_gens)
    assert {k: v for k, v in new_gens.items() if v != gens[k]} == {
        f"deployments/{RELEASE}-dwell-tracker": gens[f"deployments/{RELEASE}-dwell-tracker"] + 1}
    rolled = set(before) - set(after)
    assert rolled == set(old_tracker)
    (new_tracker,) = set(after) - set(before)
    old_hash = before[old_tracker[0]]["metadata"]["labels"]["pod-template-hash"]
    assert after[new_tracker]["metadata"]["labels"]["pod-template-hash"] != old_hash
    env = {e["name"]: e.get("value") for e in after[new_tracker]["spec"]["containers"][0]["env"]}
    assert env["DWELL_STATS_REFRESH_S"] == "5"
    for name in set(before) & set(after):
        assert after[name]["metadata"]["uid"] == before[name]["metadata"]["uid"], name
    # The generated Redis password and token keys are the ones the install made.
    assert kube.get(f"/api/v1/namespaces/{ns}/secrets/{RELEASE}-dwell-redis")["data"] == secret
    assert kube.get(f"/api/v1/namespaces/{ns}/secrets/{TOKEN_KEYS}")["data"] == keys
    assert all(ready(p) for p in after.values())


def test_helm_test_runs_the_smoke_hook_to_completion(kube: Kube, release: Release) -> None:
    """kwok completes the hook pod without running it (scripts/kube/stages/): this proves
    the hook's plumbing only; tests/e2e/test_smoke.py runs its command for real."""
    got = kube.helm("test", RELEASE, "-n", release.ns, "--timeout", "3m")
    print(got.stdout)
    assert re.search(rf"TEST SUITE:\s+{RELEASE}-dwell-test", got.stdout)
    assert re.search(r"Phase:\s+Succeeded", got.stdout)
    wait_for(lambda: kube.api.get(f"/api/v1/namespaces/{release.ns}/pods/"
                                  f"{RELEASE}-dwell-test").status_code == 404, 60,
             "the hook pod's deletion (hook-delete-policy: hook-succeeded)")


def test_uninstall_leaves_only_the_documented_claims_and_secret(
        kube: Kube, release: Release) -> None:
    before = kube.namespaced_objects(release.ns) - AMBIENT
    assert KEPT.issubset(before) and before != KEPT
    kube.helm("uninstall", RELEASE, "-n", release.ns, "--wait", "--timeout", "3m")
    left = wait_for(lambda: (lambda got: got if got <= KEPT else None)(
        kube.namespaced_objects(release.ns) - AMBIENT), 90, "the release's objects to go")
    print("left after helm uninstall:", sorted(left))
    assert left == KEPT
    assert kube.helm("list", "-n", release.ns, "-q").stdout.strip() == ""
