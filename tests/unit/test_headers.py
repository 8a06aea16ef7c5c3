"""Header names are spelled once, in dwell.headers: no other module of the code (the
services, the Spark job) spells one as a string literal."""

from __future__ import annotations

import re
from pathlib import Path

from dwell import headers

ROOT = Path(__file__).resolve().parents[2]
LITERAL = re.compile(r"""["'](dwell-[a-z-]+)["']""")
# dwell-* strings that are not header names: process, group, thread and query names.
NOT_HEADERS = re.compile(r"dwell-(admin|admission|tracker|reader|drain|backoff|redis|sdk|"
                         r"metrics|restage|spark-runtime|memory-releaser)$")


def literals(path: Path) -> set[str]:
    return {m[1] for m in LITERAL.finditer(path.read_text()) if not NOT_HEADERS.match(m[1])}


def test_names_are_distinct_and_dwell_prefixed() -> None:
    assert len(set(headers.ALL)) == len(headers.ALL)
    assert all(h.startswith("dwell-") for h in headers.ALL)


def test_no_module_but_headers_spells_a_header_name() -> None:
    spelled = {}
    for path in [*ROOT.joinpath("services", "dwell").rglob("*.py"),
                 *ROOT.joinpath("client", "src", "dwell").rglob("*.py"),
                 *ROOT.joinpath("spark", "dwell_spark").rglob("*.py")]:
        if path.name == "headers.py":
            continue
        names = literals(path) & set(headers.ALL)
        if names:
            spelled[str(path.relative_to(ROOT))] = sorted(names)
    assert not spelled, f"use dwell.headers instead: {spelled}"

