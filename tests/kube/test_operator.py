"""spark.mode operator: the SparkApplication the chart renders is accepted and stored by
the API server once the Kubeflow Spark Operator's CRDs (from its published Go module, see
dwell_dev.kubestack) are installed. No operator controller runs here, so nothing acts on
it: this proves the object is what the operator's schema wants."""

from __future__ import annotations

import copy
import json

from .conftest import SCENARIOS, Kube

GROUP = "/apis/sparkoperator.k8s.io/v1beta2"


def test_the_chart_spark_application_is_stored_as_rendered(
        kube: Kube, spark_operator_crds: list[str]) -> None:
    assert "sparkapplications.sparkoperator.k8s.io" in spark_operator_crds
    ns = kube.namespace("operator")
    try:
        docs = kube.render("rel", ns, *SCENARIOS["operator"])
        kinds = {d["kind"] for d in docs}
        assert "SparkApplication" in kinds
        assert not any(d["kind"] == "Deployment" and d["metadata"]["name"] == "rel-dwell-spark"
                       for d in docs)
        (app,) = [d for d in docs if d["kind"] == "SparkApplication"]
        r = kube.create(app, ns)
        assert r.status_code == 201, r.text
        stored = kube.get(f"{GROUP}/namespaces/{ns}/sparkapplications/rel-dwell-spark")
        print(json.dumps({k: stored["spec"][k] for k in
                          ("type", "mode", "image", "mainApplicationFile", "sparkVersion")}))
        # Nothing was pruned: the stored spec is the rendered one.
        assert stored["spec"] == app["spec"]
        assert stored["spec"]["driver"]["serviceAccount"] == "rel-dwell-spark"
        assert stored["spec"]["executor"]["securityContext"] == app["spec"]["executor"][
            "securityContext"]
    finally:
        kube.delete_namespace(ns)


def test_the_operator_schema_refuses_a_misspelt_field(
        kube: Kube, spark_operator_crds: list[str]) -> None:
    ns = kube.namespace("operator-bad")
    try:
        docs = kube.render("rel", ns, *SCENARIOS["operator"])
        app = copy.deepcopy(next(d for d in docs if d["kind"] == "SparkApplication"))
        app["spec"]["executor"]["instance"] = 2
        r = kube.create(app, ns, dry_run=True)
        assert r.status_code == 400, r.text
        assert 'unknown field "spec.executor.instance"' in r.json()["message"]
    finally:
        kube.delete_namespace(ns)
