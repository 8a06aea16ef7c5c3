"""Every chart scenario (defaults and charts/dwell/ci/*-values.yaml) through the real API
server's admission and schema checks, without persisting anything:
`kubectl apply --dry-run=server --validate=strict` with the kubectl the kube tier builds."""

from __future__ import annotations

import copy

import pytest

from .conftest import SCENARIOS, Kube, as_json

# The Prometheus Operator's kinds: its CRDs ship only in its root module, which the Go
# module proxy does not serve here, so the API server cannot know them. tests/chart checks
# those two objects (promtool on the rules, the selector against the Services).
NO_CRD_HERE = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_scenario_passes_a_strict_server_side_dry_run(
        kube: Kube, spark_operator_crds: list[str], scenario: str) -> None:
    ns = kube.namespace(f"dry-{scenario}")
    try:
        docs = kube.render("rel", ns, *SCENARIOS[scenario])
        checked = [d for d in docs if d["kind"] not in NO_CRD_HERE]
        left_out = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs
                          if d["kind"] in NO_CRD_HERE)
        got = kube.kubectl("apply", "--dry-run=server", "--validate=strict", "-n", ns,
                           "-f", "-", stdin=as_json(checked), check=False)
        print(f"{scenario}: {len(checked)} objects\n{got.stdout}"
              + (f"left out (no CRD here): {left_out}" if left_out else ""))
        assert got.returncode == 0, got.stderr
        lines = [line for line in got.stdout.splitlines() if line.strip()]
        assert len(lines) == len(checked)
        assert all(line.endswith("(server dry run)") for line in lines), got.stdout
        # Nothing was stored.
        assert kube.items(f"/apis/apps/v1/namespaces/{ns}/deployments") == []
    finally:
        kube.delete_namespace(ns)


def test_strict_validation_refuses_an_unknown_field(kube: Kube) -> None:
    """The check above can fail: a field the Pod spec lacks is refused, naming it."""
    ns = kube.namespace("dry-bad")
    try:
        docs = kube.render("rel", ns)
        policy = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"
                                    and d["metadata"]["name"] == "rel-dwell-policy"))
        policy["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
        got = kube.kubectl("apply", "--dry-run=server", "--validate=strict", "-n", ns,
                           "-f", "-", stdin=as_json([policy]), check=False)
        assert got.returncode != 0
        assert 'unknown field "spec.template.spec.containers[0].readinessProbes"' in got.stderr
    finally:
        kube.delete_namespace(ns)
