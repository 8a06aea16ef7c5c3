"""docs/architecture.md against the code: it names (in backticks) every Kafka header,
every dwell topic constant, every Redis key constant and every metric the code declares,
so that a name added to the code without its line in the contract fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client.metrics import MetricWrapperBase

from dwell import headers, keys
from dwell.core import topics

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
METRIC_MODULES = ("dwell.admission.metrics", "dwell.policy.metrics", "dwell.tracker.metrics",
                  "dwell_spark.metrics", "dwell.memory")


@pytest.fixture(scope="module")
def named() -> set[str]:
    """Every code span of the doc (the text between a pair of backticks)."""
    return set(re.findall(r"`([^`\n]+)`", DOC.read_text()))


def check_named(wanted: set[str], named: set[str]) -> None:
    absent = sorted(wanted - named)
    assert not absent, f"docs/architecture.md does not name {absent}"


def test_every_header_is_named(named: set[str]) -> None:
    assert headers.ALL
    check_named(set(headers.ALL), named)


def test_every_topic_constant_is_named(named: set[str]) -> None:
    # The module's `Final` constants; `from __future__ import annotations` keeps them as text.
    wanted = {value for name, value in vars(topics).items()
              if "Final" in str(topics.__annotations__.get(name, ""))
              and isinstance(value, str) and value.startswith("dwell.")}
    assert topics.DELAYED in wanted
    check_named(wanted, named)


def test_every_redis_key_constant_is_named(named: set[str]) -> None:
    wanted = {value for name, value in vars(keys).items()
              if not name.startswith("_") and isinstance(value, str)
              and value.startswith("dwell:")}
    assert keys.POLICY_SCOPES in wanted
    check_named(wanted, named)


def declared_metrics(module: ModuleType) -> list[tuple[str, str]]:
    """(name, type) of each metric family the module declares: prometheus_client's metric
    objects, and the instances of the collector classes it defines."""
    out = []
    for obj in vars(module).values():
        own_collector = (type(obj).__module__ == module.__name__
                         and callable(getattr(obj, "collect", None)))
        if isinstance(obj, MetricWrapperBase) or own_collector:
            # describe() where there is one; a collector without it (or with an empty one)
            # names its families when collected.
            families = list(getattr(obj, "describe", list)()) or list(obj.collect())
            out += [(fam.name, fam.type) for fam in families]
    return out


@pytest.mark.parametrize("module_name", METRIC_MODULES)
def test_every_metric_is_named(module_name: str, named: set[str]) -> None:
    declared = declared_metrics(importlib.import_module(module_name))
    assert declared, f"{module_name} declares no metric"
    # A counter `x` is exposed as `x_total`: the doc may name either.
    absent = sorted(name for name, kind in declared
                    if name not in named and not (kind == "counter" and f"{name}_total" in named))
    assert not absent, f"docs/architecture.md does not name {absent}"
