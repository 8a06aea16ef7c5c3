"""The one module that opens Redis connections and loads Lua scripts.

Scripts live as files `<name>-<numKeys>.lua` (BullMQ's layout), possibly including
shared files from `includes/`; `scripts(client, folder)` loads a folder once per client
and calls each script by SHA, reloading it after a Redis restart."""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Sequence
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


# `--- @include "<name>"` on a line of its own stands for the text of
# `includes/<name>.lua` next to the script (BullMQ's includes): Lua shared by scripts is
# written once and each script still runs as one EVALSHA.
_INCLUDE = re.compile(r'^--- @include "([\w-]+)"[ \t]*$', re.M)


def script_source(path: Path) -> str:
    """The text of the Lua script at ``path``, its includes expanded."""
    def include(m: re.Match[str]) -> str:
        return (path.parent / "includes" / f"{m.group(1)}.lua").read_text().rstrip("\n")
    return _INCLUDE.sub(include, path.read_text())


class Scripts:
    """The Lua scripts of one folder, registered on one client (sync or asyncio) with
    redis-py's `register_script`: `scripts.run("claim", keys, args)` returns what the
    script returns (an awaitable on an asyncio client); `client=` sends it on a pipeline
    of that client instead."""

    def __init__(self, client: Any, folder: Path) -> None:
        self.num_keys: dict[str, int] = {}
        self._scripts: dict[str, Any] = {}
        for path in sorted(folder.glob("*.lua")):
            name, _, n = path.stem.rpartition("-")
            self.num_keys[name] = int(n)
            self._scripts[name] = client.register_script(script_source(path))

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any],
            client: Any = None) -> Any:
        if len(keys) != self.num_keys[name]:
            raise ValueError(f"{name}: {len(keys)} keys, the script takes {self.num_keys[name]}")
        return self._scripts[name](keys=keys, args=args, client=client)


# Per client, the folders loaded on it: a script is hashed and registered once per client,
# and the entry goes with the client.
_loaded: weakref.WeakKeyDictionary[Any, dict[Path, Scripts]] = weakref.WeakKeyDictionary()
_loaded_lock = threading.Lock()


def scripts(client: Any, folder: Path) -> Scripts:
    """The scripts of ``folder`` on ``client`` (a sync or asyncio Redis), loaded once."""
    per_client = _loaded.get(client)
    if per_client is None or folder not in per_client:
        with _loaded_lock:
            per_client = _loaded.setdefault(client, {})
            if folder not in per_client:
                per_client[folder] = Scripts(client, folder)
    return per_client[folder]
