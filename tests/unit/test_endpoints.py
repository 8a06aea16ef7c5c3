"""dwell.endpoints is the one place that spells dwell's ports and local addresses: a
second spelling in the code under services/ or spark/ (a docstring may quote them) fails
here; and a client finds each address as the module says."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dwell import endpoints
from dwell_dev import devstack

ROOT = Path(__file__).resolve().parents[2]
PORTS = {endpoints.POLICY_PORT, endpoints.ADMISSION_PORT, endpoints.TRACKER_PORT,
         endpoints.SPARK_METRICS_PORT, endpoints.KAFKA_PORT, endpoints.KAFKA_CONTROLLER_PORT,
         endpoints.REDIS_PORT}
_ANY_PORT = "|".join(map(str, sorted(PORTS)))
ADDRESS = re.compile(rf"(127\.0\.0\.1|localhost):({_ANY_PORT})\b")


def second_spellings(source: str) -> list[str]:
    """Constants of ``source``, docstrings aside, that spell one of the ports as a number
    or a local address with one."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in docstrings:
            continue
        v = node.value
        if (isinstance(v, int) and not isinstance(v, bool) and v in PORTS) or (
                isinstance(v, str) and ADDRESS.search(v)):
            found.append(f"line {node.lineno}: {v!r}")
    return found


def test_no_second_spelling_of_a_port_or_local_address() -> None:
    own = ROOT / "client" / "src" / "dwell" / "endpoints.py"
    files = [p for d in ("services/dwell", "client/src/dwell", "spark/dwell_spark")
             for p in sorted((ROOT / d).rglob("*.py")) if p != own]
    assert len(files) > 50
    found = {str(p.relative_to(ROOT)): hits for p in files
             if (hits := second_spellings(p.read_text()))}
    assert found == {}


def test_a_second_spelling_is_found() -> None:
    assert second_spellings('"""Port 8081."""\nURL = "http://127.0.0.1:8083"\nP = 8082\n') == [
        "line 2: 'http://127.0.0.1:8083'", "line 3: 8082"]


@pytest.mark.parametrize(("find", "env", "default"), [
    (endpoints.policy_url, "DWELL_POLICY_URL", "http://127.0.0.1:8081"),
    (endpoints.admission_url, "DWELL_ADMISSION_URL", "http://127.0.0.1:8082"),
    (endpoints.tracker_url, "DWELL_TRACKER_URL", "http://127.0.0.1:8083"),
    (endpoints.kafka_bootstrap, "DWELL_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
])
def test_an_address_given_wins_then_the_environment_then_the_default(
        monkeypatch: pytest.MonkeyPatch, find, env: str, default: str) -> None:
    monkeypatch.delenv(env, raising=False)
    assert find() == default
    monkeypatch.setenv(env, "")
    assert find() == default
    monkeypatch.setenv(env, "http://elsewhere:1")
    assert find() == "http://elsewhere:1"
    assert find("http://given:2") == "http://given:2"


def test_the_local_stack_listens_where_the_code_looks() -> None:
    """scripts/devstack.py starts the dev profile's servers before the project's venv
    exists, so it spells the ports itself; they must be these."""
    ports = dict(devstack.PROFILES["dev"])
    # Kafka's listener for the kube tier's pods (`up --for-pods`): only the chart's values
    # name it, no code looks for it.
    pods = ports.pop("kafka_pods")
    assert ports == {
        "redis": endpoints.REDIS_PORT, "kafka": endpoints.KAFKA_PORT,
        "kafka_controller": endpoints.KAFKA_CONTROLLER_PORT,
        "policy": endpoints.POLICY_PORT, "admission": endpoints.ADMISSION_PORT,
        "tracker": endpoints.TRACKER_PORT, "spark": endpoints.SPARK_METRICS_PORT}
    assert pods not in ports.values()
