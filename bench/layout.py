"""How the code is laid out, at two git revisions side by side: the ten largest modules,
how many times each Kafka header name and the subscription-settings shape are spelled as
string literals in the code (services/, spark/, and native/src/ at revisions that had
the Rust extension), and the number of `sys.path.insert` lines. Reads the revisions
with `git`; needs no server.

    .venv/bin/python bench/layout.py                      # HEAD~ against HEAD
    .venv/bin/python bench/layout.py --before 674203e --after HEAD
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
CODE = ("services", "client/src", "spark", "native/src")
# A quoted header name: "dwell-deliver-at" or 'dwell-deliver-at' (not the process names).
HEADER = re.compile(r"""["'](dwell-(?:deliver-at|tick-time|key|message-id|origin|topic|"""
                    r"""publish-time|producer|sequence-id|redelivery-count|subscription|"""
                    r"""version))["']""")
SYS_PATH = re.compile(r"^\s*sys\.path\.insert\(", re.M)
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
                         if SYS_PATH.search(t)}}


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


if __name__ == "__main__":
    typer.run(main)
