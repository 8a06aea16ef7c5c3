"""The layers hold: dwell.core imports no I/O, and no service imports another (what two
services share lives outside them: dwell.policy_feed, dwell.index, dwell.adapters, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "services" / "dwell"
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
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = {n for n in names if n.startswith("dwell.")}
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_service_imports_no_other_service(package: str) -> None:
    found = {f: sorted(n for n in names if n.split(".")[1] in FORBIDDEN[package])
             for f, names in imported(package).items()}
    assert {f: n for f, n in found.items() if n} == {}


def test_core_imports_nothing_outside_core() -> None:
    found = {f: sorted(n for n in names if not n.startswith("dwell.core"))
             for f, names in imported("core").items()}
    assert {f: n for f, n in found.items() if n} == {}
