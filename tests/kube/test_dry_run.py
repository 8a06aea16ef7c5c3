"""Every chart scenario (defaults and charts/dwell/{ci,examples}/*-values.yaml) through the real API
server's admission and schema checks, without persisting anything: each rendered object
POSTed with dryRun=All and fieldValidation=Strict, which is what `kubectl apply
--dry-run=server --validate=strict` asks of the server for a new object."""

from __future__ import annotations

import copy

import pytest

from .conftest import SCENARIOS, Kube

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
        refused, accepted = [], []
        for doc in docs:
            what = f"{doc['kind']}/{doc['metadata']['name']}"
            if doc["kind"] in NO_CRD_HERE:
                continue
            r = kube.create(doc, ns, dry_run=True)
            if r.status_code == 201:
                accepted.append(f"{what} created (server dry run)")
            else:
                refused.append(f"{what}: {r.status_code} {r.json().get('message')}")
        left_out = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs
                          if d["kind"] in NO_CRD_HERE)
        print(f"{scenario}:", *accepted, sep="\n  ")
        if left_out:
            print(f"  left out (no CRD here): {left_out}")
        assert not refused
        assert len(accepted) >= 15
        # Nothing was stored.
        assert kube.items(f"/apis/apps/v1/namespaces/{ns}/deployments") == []
        assert kube.items(f"/api/v1/namespaces/{ns}/services") == []
    finally:
        kube.delete_namespace(ns)


def test_strict_validation_refuses_an_unknown_field(kube: Kube) -> None:
    """The check above can fail: a field the Pod spec lacks is refused, naming it."""
    ns = kube.namespace("dry-bad")
    try:
        docs = kube.render("rel", ns, *SCENARIOS["defaults"])
        policy = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"
                                    and d["metadata"]["name"] == "rel-dwell-policy"))
        policy["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
        r = kube.create(policy, ns, dry_run=True)
        assert r.status_code == 400, r.text
        message = r.json()["message"]
        assert 'unknown field "spec.template.spec.containers[0].readinessProbes"' in message
    finally:
        kube.delete_namespace(ns)
