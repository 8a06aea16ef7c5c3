"""How the code is laid out, at two git revisions side by side: the ten largest modules,
how many times each Kafka header name and the subscription-settings shape are spelled as
string literals in the code (services/, spark/, and native/src/ at revisions that had
the Rust extension), the number of `sys.path.insert` lines, and the development
tooling's shape: import cycles among its modules (lazy imports too), the places that start
a child process in a session of its own (each one a process supervisor), the helpers
defined more than once, the imports of helpers from a conftest and the `.pth` files the
install writes, and the tests that import a bench's module. Reads the revisions with
`git`; needs no server.

    .venv/bin/python bench/layout.py                      # HEAD~ against HEAD
    .venv/bin/python bench/layout.py --before 674203e --after HEAD
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
SELF = "bench/layout.py"
CODE = ("services", "client/src", "spark", "native/src")
# A quoted header name: "dwell-deliver-at" or 'dwell-deliver-at' (not the process names).
HEADER = re.compile(r"""["'](dwell-(?:deliver-at|tick-time|key|message-id|origin|topic|"""
                    r"""publish-time|producer|sequence-id|redelivery-count|subscription|"""
                    r"""version))["']""")
SYS_PATH = re.compile(r"^\s*sys\.path\.insert\(", re.M)
SESSION = re.compile(r"start_new_session=True")
CONFTEST_IMPORT = re.compile(r"^\s*(?:from conftest import|import conftest\b)", re.M)
PTH = re.compile(r"""\.pth["']""")
HELPERS = ("free_port", "now_ms", "wait_for", "say")
# The subscription settings' field names, quoted.
SETTINGS = re.compile(r"""["'](ackTimeoutMs|ackTimeoutRedeliveryBackoff|"""
                      r"""negativeAckRedeliveryBackoff|maxRedeliverCount)["']""")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def files(rev: str, *where: str) -> dict[str, str]:
    names = git("ls-tree", "-r", "--name-only", rev, "--", *where).split()
    return {n: git("show", f"{rev}:{n}") for n in names
            if n.endswith((".py", ".rs", ".lua")) and "/target/" not in n}


def measure(rev: str) -> dict[str, object]:
    code = files(rev, *CODE)
    everything = {**files(rev, "tests", "bench", "scripts"), **code}
    largest = sorted(((len(t.splitlines()), n) for n, t in code.items() if n.endswith(".py")),
                     reverse=True)[:10]
    headers: dict[str, list[str]] = {}
    shape: dict[str, int] = {}
    for name, text in code.items():
        for m in HEADER.finditer(text):
            headers.setdefault(m[1], []).append(name)
        n = len(SETTINGS.findall(text))
        if n:
            shape[name] = n
    return {"largest": largest, "headers": headers, "shape": shape,
            "sys_path": {n: len(SYS_PATH.findall(t)) for n, t in everything.items()
                         if SYS_PATH.search(t)},
            "tooling": tooling(everything)}


def tooling(everything: dict[str, str]) -> dict[str, object]:
    """The development tooling's shape in ``everything`` (path -> text)."""
    # This file names what it looks for.
    py = {n: t for n, t in everything.items() if n.endswith(".py") and n != SELF}
    # The tooling's importable modules: the dwell_dev package's where there is one (the
    # scripts beside it only run it), else every module of scripts/.
    package = [n for n in py if n.startswith("scripts/dwell_dev/")]
    mods = {Path(n).stem: t for n, t in py.items()
            if (n in package if package else n.startswith("scripts/"))
            and Path(n).stem != "__init__"}
    graph = {m: _tool_imports(t, set(mods)) - {m} for m, t in mods.items()}
    cycles = sorted({" -> ".join(c) for m in graph if (c := _cycle(graph, m))})
    helpers = {h: sorted(n for n, t in py.items() if re.search(rf"^def {h}\(", t, re.M))
               for h in HELPERS}
    benches = {Path(n).stem for n in py if n.startswith("bench/")}
    from_bench = sorted(n for n, t in py.items() if n.startswith("tests/")
                        and _top_level_imports(t) & benches)
    return {"cycles": cycles, "from_bench": from_bench,
            "spawners": sorted(n for n, t in py.items() if SESSION.search(t)),
            "helpers": helpers,
            "conftest_imports": sorted(n for n, t in py.items() if CONFTEST_IMPORT.search(t)),
            "pth": sorted(n for n, t in py.items() if PTH.search(t) and _writes_pth(t))}


def _writes_pth(text: str) -> bool:
    """Whether a function of ``text`` both names a `.pth` file and writes a file."""
    for fn in ast.walk(ast.parse(text)):
        if isinstance(fn, ast.FunctionDef):
            nodes = list(ast.walk(fn))
            if any(isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and n.value.endswith(".pth") for n in nodes) and any(
                    isinstance(n, ast.Attribute) and n.attr in ("write_text", "write")
                    for n in nodes):
                return True
    return False


def _tool_imports(text: str, mods: set[str]) -> set[str]:
    """The tooling modules ``text`` imports, at its top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[-1] for a in node.names} & mods
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] == "dwell_dev" and len(parts) == 1:
                out |= {a.name for a in node.names} & mods
            elif parts[-1] in mods:
                out.add(parts[-1])
    return out


def _top_level_imports(text: str) -> set[str]:
    """The modules ``text`` imports by a bare top-level name (`import x`, `from x import`)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if "." not in a.name}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and "." not in node.module:
            out.add(node.module)
    return out


def _cycle(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """An import path from ``start`` back to itself, shortest first, if any; named from
    its alphabetically first module so that each cycle is reported once."""
    paths = [[start]]
    while paths:
        path = paths.pop(0)
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == start:
                return path + [start] if start == min(path) else None
            if nxt not in path:
                paths.append(path + [nxt])
    return None


def main(before: str = typer.Option("HEAD~", help="the revision to compare from"),
         after: str = typer.Option("HEAD", help="the revision to compare to")) -> None:
    b, a = measure(before), measure(after)
    out = Console(width=200)
    t = Table(title=f"ten largest modules (lines): {before} | {after}")
    for col in ("before", "lines", "after", "lines"):
        t.add_column(col, justify="right" if col == "lines" else "left")
    for (bn, bm), (an, am) in zip(b["largest"], a["largest"], strict=True):  # type: ignore[call-overload]
        t.add_row(bm, str(bn), am, str(an))
    out.print(t)
    t = Table(title="header names spelled as literals in the code: places (files)")
    for col in ("header", "before", "after"):
        t.add_column(col)
    names = sorted(set(b["headers"]) | set(a["headers"]))  # type: ignore[arg-type]
    for h in names:
        bp, ap = b["headers"].get(h, []), a["headers"].get(h, [])  # type: ignore[attr-defined]
        t.add_row(h, f"{len(bp)} ({len(set(bp))})", f"{len(ap)} ({len(set(ap))})")
    out.print(t)
    t = Table(title="subscription-settings field names spelled as literals: by file")
    for col in ("revision", "files", "literals", "where"):
        t.add_column(col)
    for rev, m in ((before, b), (after, a)):
        shape: dict[str, int] = m["shape"]  # type: ignore[assignment]
        t.add_row(rev, str(len(shape)), str(sum(shape.values())),
                  ", ".join(f"{n} ({c})" for n, c in sorted(shape.items())))
    out.print(t)
    for rev, m in ((before, b), (after, a)):
        lines: dict[str, int] = m["sys_path"]  # type: ignore[assignment]
        tests = sum(n for f, n in lines.items() if f.startswith("tests/"))
        out.print(f"sys.path.insert lines at {rev}: {sum(lines.values())} ({tests} in tests/; "
                  f"{', '.join(sorted(f for f in lines if not f.startswith('tests/')))})")
    t = Table(title="the development tooling")
    for col in ("", before, after):
        t.add_column(col)
    bt: dict[str, Any] = b["tooling"]  # type: ignore[assignment]
    at: dict[str, Any] = a["tooling"]  # type: ignore[assignment]

    def listed(xs: list[str]) -> str:
        return f"{len(xs)}: " + ", ".join(xs) if xs else "0"
    t.add_row("import cycles", listed(bt["cycles"]), listed(at["cycles"]))
    t.add_row("files starting children in sessions of their own", listed(bt["spawners"]),
              listed(at["spawners"]))
    for h in HELPERS:
        t.add_row(f"def {h}", listed(bt["helpers"][h]), listed(at["helpers"][h]))
    t.add_row("files importing from a conftest by name", str(len(bt["conftest_imports"])),
              str(len(at["conftest_imports"])))
    t.add_row("files writing a .pth", listed(bt["pth"]), listed(at["pth"]))
    t.add_row("tests importing a bench module", listed(bt["from_bench"]),
              listed(at["from_bench"]))
    out.print(t)


if __name__ == "__main__":
    typer.run(main)
