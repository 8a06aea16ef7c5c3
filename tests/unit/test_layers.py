"""The layers hold: dwell.core imports no I/O, and no service imports another, nor the
Spark app a service (what two of them share lives outside them: dwell.policy_view,
dwell.index, dwell.adapters, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# `dwell` is one namespace package made of two distributions' trees: dwell-client's
# (client/src) and the services' (services/).
CLIENT = REPO / "client" / "src" / "dwell"
ROOTS = (REPO / "services" / "dwell", CLIENT)
SERVICES = ("admission", "policy", "tracker")
# What each package may not import: the other services; the SDK no service or tool
# either, and the CLI (dwell-admin) talks to services over HTTP only.
FORBIDDEN = {
    **{s: {o for o in SERVICES if o != s} | {"client", "cli"} for s in SERVICES},
    "client": {*SERVICES, "cli"},
    "cli": set(SERVICES),
}


def imported(package: str) -> dict[str, set[str]]:
    """Module file -> the dwell modules it imports."""
    out: dict[str, set[str]] = {}
    for root in ROOTS:
        out.update(_imported(root, package))
    return out


def _imported(root: Path, package: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        (_, names), = _imported_file(path).items()
        out[str(path.relative_to(REPO))] = names
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_service_imports_no_other_service(package: str) -> None:
    found = {f: sorted(n for n in names if n.split(".")[1] in FORBIDDEN[package])
             for f, names in imported(package).items()}
    assert {f: n for f, n in found.items() if n} == {}


def test_the_spark_app_imports_no_service() -> None:
    """The Spark app (spark/dwell_spark) shares the index layer with the tracker; it
    imports no module of a service (the delivered marks are dwell.index.marks)."""
    found = {}
    for path in sorted((REPO / "spark" / "dwell_spark").rglob("*.py")):
        (_, names), = _imported_file(path).items()
        bad = sorted(n for n in names if n.split(".")[1] in SERVICES)
        if bad:
            found[str(path.relative_to(REPO))] = bad
    assert found == {}


def _imported_file(path: Path) -> dict[str, set[str]]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {str(path): {n for n in names if n.startswith("dwell.")}}


def test_core_imports_nothing_outside_core() -> None:
    found = {f: sorted(n for n in names if not n.startswith("dwell.core"))
             for f, names in imported("core").items()}
    assert {f: n for f, n in found.items() if n} == {}


def _in_client(module: str) -> bool:
    """Whether dwell-client's tree holds ``module`` (a module, a package, or a name
    imported from a module it holds)."""
    parts = module.split(".")[1:]
    for n in (len(parts), len(parts) - 1):
        base = CLIENT.joinpath(*parts[:n])
        if n and (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            return True
    return False


def test_the_client_distribution_imports_nothing_of_the_services() -> None:
    """dwell-client installs alone: nothing under client/src imports a module that only
    the services' distribution has."""
    found = {}
    for path in sorted(CLIENT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                     else [])
            missing = [n for n in names if n.startswith("dwell.") and not _in_client(n)]
            if missing:
                found[str(path.relative_to(REPO))] = missing
    assert len(list(CLIENT.rglob("*.py"))) > 20
    assert found == {}


def test_a_services_module_is_not_in_the_client() -> None:
    assert _in_client("dwell.core.topics.TopicName")
    assert _in_client("dwell.adapters.kafka")
    assert not _in_client("dwell.core.buckets")
    assert not _in_client("dwell.tracker.app")
