"""The one module that opens Redis connections and loads Lua scripts.

Scripts live as files `<name>-<numKeys>.lua` (BullMQ's layout); `Scripts` loads
each once per client and calls it by SHA, reloading after a Redis restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10,
                                health_check_interval=15)


def connect_async(url: str) -> aredis.Redis:
    return aredis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10,
                                 health_check_interval=15)


class Scripts:
    """Lua scripts of one folder, registered on a (sync) client: `scripts.claim(keys, args)`."""

    def __init__(self, client: redis.Redis, folder: Path) -> None:
        self._client = client
        self.num_keys: dict[str, int] = {}
        for path in sorted(folder.glob("*.lua")):
            name, _, n = path.stem.rpartition("-")
            self.num_keys[name] = int(n)
            setattr(self, name, client.register_script(path.read_text()))

    def __getattr__(self, name: str) -> Any:  # for type checkers: scripts are dynamic
        raise AttributeError(f"no Lua script named {name!r}")
