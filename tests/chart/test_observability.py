"""The chart's dashboard and alert rules (charts/dwell/files/) against the code: every
metric they query is one a dwell process exports, the rules pass `promtool check rules`
and their unit test (`promtool test rules`)."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from dwell_dev import devinstall

ROOT = Path(__file__).resolve().parent.parent.parent
FILES = ROOT / "charts" / "dwell" / "files"
RULES = FILES / "rules" / "dwell.rules.yaml"
DASHBOARD = FILES / "dashboards" / "dwell.json"

# Each service declares its metrics in one module; dwell.memory's allocator collector is
# registered by every process.
METRIC_MODULES = ["dwell.admission.metrics", "dwell.policy.metrics", "dwell.tracker.metrics",
                  "dwell_spark.metrics", "dwell.memory"]
PROMQL_WORDS = {"sum", "max", "min", "avg", "count", "by", "without", "rate", "increase",
                "histogram_quantile", "le", "on", "ignoring", "group_left", "group_right",
                "and", "or", "unless", "bool", "offset", "label_values", "topk", "bottomk"}


def declared(module: ModuleType) -> list[Any]:
    """The module's metrics: prometheus_client's metric objects, and the instances of the
    custom collectors it defines."""
    return [obj for obj in vars(module).values()
            if isinstance(obj, MetricWrapperBase)
            or (type(obj).__module__ == module.__name__ and callable(getattr(obj, "collect", 0)))]


def exported() -> set[str]:
    """Exposition names of every metric the metric modules declare: a counter `x` is
    `x_total`, a histogram `h` is `h_bucket` etc."""
    names: set[str] = {"up"}
    for module in map(importlib.import_module, METRIC_MODULES):
        for obj in declared(module):
            for fam in getattr(obj, "describe", obj.collect)():
                base = fam.name.removesuffix("_total")
                names |= {fam.name, base, base + "_total", base + "_bucket", base + "_sum",
                          base + "_count"}
    return names


def test_every_metric_module_declares_metrics() -> None:
    for name in METRIC_MODULES:
        assert declared(importlib.import_module(name)), f"{name} declares no metric"


def metric_names(expr: str) -> set[str]:
    """Identifiers of a PromQL expression that name series: not inside {...} matchers,
    [..] ranges, quoted strings or by/without lists, not functions or keywords."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    # Grafana's label_values(metric, label): the second argument is a label.
    expr = re.sub(r"(label_values\([^,()]*),\s*\w+\s*\)", r"\1)", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = m[0]
        after = expr[m.end():].lstrip()
        if word in PROMQL_WORDS or after.startswith("(") or expr[m.start() - 1:m.start()] == "$":
            continue
        names.add(word)
    return names


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    out = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    out += [v["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return out


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


@pytest.mark.parametrize("where", ["dashboard", "rules"])
def test_every_queried_metric_is_exported(where: str) -> None:
    exprs = dashboard_exprs() if where == "dashboard" else rule_exprs()
    assert exprs
    known = exported()
    unknown = {n for e in exprs for n in metric_names(e)} - known
    assert not unknown, f"{where} queries metrics no dwell process exports: {sorted(unknown)}"


def test_an_unknown_metric_is_reported() -> None:
    names = metric_names('sum by (topic) (rate(dwell_no_such_total{topic=~"$topic"}[5m]))')
    assert names == {"dwell_no_such_total"}
    assert names - exported() == {"dwell_no_such_total"}


def test_dashboard_is_grafana_json() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "dwell-overview"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]


@pytest.mark.parametrize("args", [["check", "rules", str(RULES)],
                                  ["test", "rules", str(RULES.with_suffix(".test.yaml"))]])
def test_promtool(args: list[str]) -> None:
    got = subprocess.run([str(devinstall.promtool_bin()), *args], capture_output=True,
                         text=True, cwd=RULES.parent)
    assert got.returncode == 0, got.stdout + got.stderr
