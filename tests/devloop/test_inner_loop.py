"""The inner loop's skaffold.yaml and Tiltfile, checked with the real skaffold and tilt
(built by `make dev-tools` into .dwell/cache/dev-tools, or here when missing; tilt needs
cgo, so a C compiler): skaffold's effective configuration (`skaffold diagnose
--yaml-only`) and the chart as `skaffold dev` would apply it (`skaffold render`), and the
Tiltfile as `tilt up` loads it (`tilt alpha tiltfile-result`). helm comes from `make
chart-tools`. No cluster and no Docker are needed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dwell_dev import devinstall, devtools

ROOT = Path(__file__).resolve().parents[2]
SITE = "/opt/venv/lib/python3.11/site-packages/dwell"
PORTS = {"dwell-policy": 8081, "dwell-admission": 8082, "dwell-tracker": 8083,
         "dwell-spark": 8084}
SERVICES = ("policy", "admission", "tracker")


@pytest.fixture(scope="module")
def tool_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PATH with helm first (skaffold renders the chart with it), a HOME of its own
    (skaffold writes its config there) and no kube context."""
    helm = devinstall.helm_bin()
    home = tmp_path_factory.mktemp("home")
    return {"PATH": f"{helm.parent}:{os.environ['PATH']}", "HOME": str(home),
            "KUBECONFIG": str(home / "kubeconfig"),
            "SKAFFOLD_UPDATE_CHECK": "false", "SKAFFOLD_COLLECT_METRICS": "false"}


def run(argv: list[str], env: dict[str, str], timeout: float = 300) -> str:
    got = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert got.returncode == 0, f"{argv[:3]} exited {got.returncode}:\n{got.stdout}\n{got.stderr}"
    return got.stdout


@pytest.fixture(scope="module")
def skaffold() -> str:
    return str(devtools.build(devtools.SKAFFOLD))


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs
            if d and d.get("kind") in ("Deployment", "StatefulSet")}


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    return out


# --- skaffold ---------------------------------------------------------------------------

def test_skaffold_diagnose(skaffold: str, tool_env: dict[str, str]) -> None:
    """skaffold's effective configuration (`diagnose --yaml-only`; the full diagnose also
    reads the base image's config from a registry or a Docker daemon, for ONBUILD)."""
    config = yaml.safe_load(run([skaffold, "diagnose", "--yaml-only", "--filename",
                                 "skaffold.yaml"], tool_env))
    assert config["apiVersion"] == "skaffold/v4beta13"
    arts = {a["image"]: a for a in config["build"]["artifacts"]}
    assert set(arts) == {"localhost/dwell", "localhost/dwell-spark"}
    assert arts["localhost/dwell"]["docker"]["dockerfile"] == "docker/dwell.Dockerfile"
    assert arts["localhost/dwell-spark"]["docker"]["dockerfile"] == "docker/spark.Dockerfile"
    for art in arts.values():
        assert art["docker"]["buildArgs"]["BASE_IMAGE"]
    rules = [(r["src"], r["dest"], r["strip"]) for r in arts["localhost/dwell"]["sync"]["manual"]]
    assert rules == [(f"{tree}/**/*.py", SITE, f"{tree}/")
                     for tree in ("services/dwell", "client/src/dwell")]
    forwards = {f["resourceName"]: (f["port"], f["localPort"]) for f in config["portForward"]}
    assert forwards == {name: (port, port) for name, port in PORTS.items()}


def test_skaffold_render(skaffold: str, tool_env: dict[str, str]) -> None:
    """The chart as `skaffold dev` would apply it, images set to skaffold's tags."""
    out = run([skaffold, "render", "--offline=true", "--digest-source=tag",
               "--update-check=false"], tool_env)
    docs = [d for d in yaml.safe_load_all(out) if d]
    print("\n".join(out.splitlines()[:40]))
    loads = workloads(docs)
    for svc in SERVICES:
        [c] = containers(loads[f"dwell-{svc}"])
        assert c["image"].startswith("localhost/dwell:"), c["image"]
        # devReload: watchfiles restarts the service when a synced source changes.
        assert c["command"][0] == "watchfiles" and c["command"][-1] == SITE, c["command"]
        assert f"python -m dwell.{svc}" in c["command"]
    [driver] = containers(loads["dwell-spark"])
    assert driver["image"].startswith("localhost/dwell-spark:"), driver["image"]
    assert f"spark.kubernetes.container.image={driver['image']}" in driver["args"]
    assert all(d["metadata"].get("namespace") in (None, "dwell") for d in docs)


# --- tilt -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiltfile(tool_env: dict[str, str]) -> dict[str, Any]:
    """The Tiltfile as `tilt up` loads it (`tilt alpha tiltfile-result`: the Tiltfile run,
    the chart rendered with helm, no cluster and no Docker), manifests by name."""
    tilt = str(devtools.build(devtools.TILT))
    result = json.loads(run([tilt, "alpha", "tiltfile-result", "-f", "Tiltfile"], tool_env))
    assert result["Error"] is None
    return {m["Name"]: m for m in result["Manifests"]}


def test_tiltfile_builds_both_images_and_live_updates_the_services(
        tiltfile: dict[str, Any]) -> None:
    assert set(tiltfile) == {"dwell-policy", "dwell-admission", "dwell-tracker", "dwell-spark",
                             "dwell-redis", "dwell-kafka", "dwell-test", "uncategorized"}
    for svc in SERVICES:
        [image] = tiltfile[f"dwell-{svc}"]["ImageTargets"]
        assert image["selector"] == "localhost/dwell"
        assert image["BuildDetails"]["context"] == str(ROOT)
        spec = image["LiveUpdateSpec"]
        # A changed source is synced into the image's venv (the pod restarts the service
        # under watchfiles); a dependency change rebuilds the image instead.
        assert spec["syncs"] == [{"localPath": tree, "containerPath": SITE}
                                 for tree in ("services/dwell", "client/src/dwell")]
        assert set(spec["stopPaths"]) == {"pyproject.toml", "client/pyproject.toml",
                                          "constraints.txt"}
        assert "watchfiles" in tiltfile[f"dwell-{svc}"]["DeployTarget"]["yaml"]
    [spark] = tiltfile["dwell-spark"]["ImageTargets"]
    assert spark["selector"] == "localhost/dwell-spark"
    # The executors' image is a spark-submit argument: the build is tagged with it too.
    assert spark["BuildDetails"]["extraTags"] == ["localhost/dwell-spark:dev"]
    assert "spark.kubernetes.container.image=localhost/dwell-spark:dev" in tiltfile[
        "dwell-spark"]["DeployTarget"]["yaml"]
    assert tiltfile["dwell-redis"]["ImageTargets"] in (None, [])
    # The in-chart Kafka's image is Apache Kafka's; its `acls` container (the locked
    # Kafka's users and ACLs) runs dwell's image, which Tilt builds for it.
    assert [t["selector"] for t in tiltfile["dwell-kafka"]["ImageTargets"]] == [
        "localhost/dwell"]


def test_tiltfile_forwards_the_ports_on_loopback_and_runs_the_smoke_test_on_demand(
        tiltfile: dict[str, Any]) -> None:
    for name, port in PORTS.items():
        forwards = tiltfile[name]["DeployTarget"]["portForwardTemplateSpec"]["forwards"]
        assert forwards == [{"localPort": port, "containerPort": port, "host": "127.0.0.1"}]
    assert tiltfile["dwell-admission"]["ResourceDependencies"] == ["dwell-policy"]
    assert tiltfile["dwell-spark"]["ResourceDependencies"] == ["dwell-tracker"]
    # The chart's helm-test pod: manual (Tilt's TriggerModeManual, 2), after the services.
    test = tiltfile["dwell-test"]
    assert "helm.sh/hook: test" in test["DeployTarget"]["yaml"]
    assert test["TriggerMode"] == 2
    assert set(test["ResourceDependencies"]) == {"dwell-policy", "dwell-admission",
                                                 "dwell-tracker", "dwell-spark"}
