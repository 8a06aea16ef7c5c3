"""dwell.cache: the bound of BoundedCache; ExpiringCache's expiry and bound."""

from __future__ import annotations

import time

from dwell.cache import BoundedCache, ExpiringCache


def test_a_bounded_cache_forgets_everything_when_a_new_key_comes_past_its_limit() -> None:
    c: BoundedCache[int, str] = BoundedCache(limit=3)
    for k in range(4):
        assert c.put(k, str(k)) == str(k)
    assert c == {0: "0", 1: "1", 2: "2", 3: "3"}  # past the limit only once a key comes
    assert c.get(3) == "3"
    c.put(4, "4")
    assert c == {4: "4"}


def test_an_expiring_cache_loads_again_once_its_value_is_older_than_the_ttl() -> None:
    loads: list[str] = []

    def load(value: str):
        def f() -> str:
            loads.append(value)
            return value
        return f

    c: ExpiringCache[str, str] = ExpiringCache()
    assert c.get("k", 50, load("a")) == "a"
    assert c.get("k", 50, load("b")) == "a"  # fresh: no load
    time.sleep(0.08)
    assert c.get("k", 50, load("c")) == "c"
    assert loads == ["a", "c"]


def test_an_expiring_cache_is_bounded() -> None:
    c: ExpiringCache[int, int] = ExpiringCache(limit=2)
    for k in range(10):
        c.get(k, 60_000, lambda k=k: k)
    assert len(c._values) <= 3
    assert c.get(9, 60_000, lambda: -1) == 9
