"""The policy store's Lua scripts as the loader sends them: each header's KEYS matching
the key count in the file name, and the store-behind check pasted into every script that
takes a version."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dwell.adapters.redis import script_source
from dwell.policy.store import LUA, STORE_BEHIND

SCRIPTS = sorted(LUA.glob("*.lua"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_header_lists_the_keys_the_name_says(path: Path) -> None:
    n = int(path.stem.rpartition("-")[2])
    listed = {int(k) for k in re.findall(r"^--\s*KEYS\[(\d+)\]", path.read_text(), re.M)}
    assert listed == set(range(1, n + 1))


@pytest.mark.parametrize("name", ["put-6.lua", "remove-7.lua", "namespace_delete-7.lua"])
def test_every_write_checks_the_store_before_its_version(name: str) -> None:
    text = script_source(LUA / name)
    assert "@include" not in text
    assert text.count("local function storeBehind(") == 1
    # The check comes before the script takes a version, so a refusal takes none.
    check = text.index("if storeBehind(KEYS[1], KEYS[")
    assert check < text.index('redis.call("INCR"')
    assert re.match(r"if storeBehind\(.*\) then\s+return \{?" + str(STORE_BEHIND) + r"\b",
                    text[check:])
