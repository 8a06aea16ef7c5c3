"""docs/pulsar-compatibility.md against the compat scenario: every pulsar-admin command and
endpoint the scenario runs has its row in the admin table, and the counts the doc quotes
are the scenario's."""

from __future__ import annotations

import re
from pathlib import Path

from compat.test_pulsar_admin import coverage, scenario

DOC = Path(__file__).resolve().parents[2] / "docs" / "pulsar-compatibility.md"


def _admin_section() -> str:
    text = DOC.read_text()
    start = text.index("## Admin API and pulsar-admin")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_every_command_and_endpoint_has_its_row() -> None:
    section = _admin_section()
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    _, commands, endpoints = coverage(scenario("t"))
    missing = [c for c in sorted(commands) if not any(f"`{c}" in row for row in rows)]
    missing += [e for e in sorted(endpoints)
                if not any(e.split(" ", 1)[1] in row for row in rows)]
    assert not missing, f"docs/pulsar-compatibility.md has no row for {missing}"


def test_the_quoted_counts_are_the_scenarios() -> None:
    lines, commands, endpoints = coverage(scenario("t"))
    quoted = re.search(r"(\d+) command lines, (\d+) commands, (\d+) endpoints",
                       _admin_section())
    assert quoted is not None
    assert tuple(map(int, quoted.groups())) == (lines, len(commands), len(endpoints))
