"""The index's Lua scripts as the loader sends them: includes expanded, and each
header's KEYS matching the key count in the file name."""

from __future__ import annotations

import re

import pytest

from dwell.adapters.redis import script_source
from dwell.index.bucket_index import LUA_DIR

SCRIPTS = sorted(LUA_DIR.glob("*.lua"))


def test_due_hint_is_shared() -> None:
    for name in ("claim-6.lua", "complete-7.lua"):
        text = script_source(LUA_DIR / name)
        assert "@include" not in text
        assert text.count("local function updateDueHint(") == 1
        assert "updateDueHint(KEYS[" in text


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_header_lists_the_keys_the_name_says(path) -> None:
    n = int(path.stem.rpartition("-")[2])
    listed = {int(k) for k in re.findall(r"^\s*KEYS\[(\d+)\]", path.read_text(), re.M)}
    assert listed == set(range(1, n + 1))
