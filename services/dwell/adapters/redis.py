"""The one module that opens Redis connections and loads Lua scripts.

Scripts live as files `<name>-<numKeys>.lua` (BullMQ's layout); `Scripts` loads
each once per client and calls it by SHA, reloading after a Redis restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

# After a Redis restart every pooled connection is dead, and the first command on each
# fails with "Connection closed by server": try once more on a fresh connection (and
# twice more after that, within a second) before the error reaches a caller. Timeouts
# are not retried: socket_timeout already bounds them.
_RETRY = {"retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
          "retry_on_error": [redis.ConnectionError]}


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10,
                                health_check_interval=15, **_RETRY)


def connect_async(url: str) -> aredis.Redis:
    return aredis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10,
                                 health_check_interval=15, retry=AsyncRetry(
                                     ExponentialBackoff(cap=0.5, base=0.05), 3),
                                 retry_on_error=[redis.ConnectionError])


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
