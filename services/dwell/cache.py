"""Small in-process memos with a bound, for values derived from keys that come from
outside (topic names, subscriptions): without a bound they could grow without end.

`BoundedCache` is the publish path's memo (a hit is a plain dict `get`); `ExpiringCache`
holds values read from Redis for a while (Spark's Python workers: registered subscription
settings, namespace grants)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
HK = TypeVar("HK", bound=Hashable)


class BoundedCache(dict[K, V], Generic[K, V]):
    """A dict of values derived from their keys, which forgets them all when a new key
    comes while it holds more than `limit`; being a dict, a hit costs a plain `get`."""

    def __init__(self, limit: int = 100_000) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> V:
        """Remember `value` for `key` (a miss) and return it."""
        if len(self) > self.limit:
            self.clear()
        self[key] = value
        return value


class ExpiringCache(Generic[HK, V]):
    """`get(key, ttl_ms, load)`: the value `load()` gave for `key` less than `ttl_ms` ago,
    else a fresh `load()`. Bounded as BoundedCache. Safe to share between threads (two
    misses of one key may both load)."""

    def __init__(self, limit: int = 100_000) -> None:
        self._values: BoundedCache[HK, tuple[float, V]] = BoundedCache(limit)
        self._lock = threading.Lock()

    def get(self, key: HK, ttl_ms: int, load: Callable[[], V]) -> V:
        now = time.monotonic()
        hit = self._values.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = load()
        with self._lock:
            self._values.put(key, (now + ttl_ms / 1000, value))
        return value
