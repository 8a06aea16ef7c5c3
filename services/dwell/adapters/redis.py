"""The one module that opens Redis connections and loads Lua scripts.

Scripts live as files `<name>-<numKeys>.lua` (BullMQ's layout), possibly including
shared files from `includes/`; `Scripts(client, folder)` runs them on a client."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from dwell.security import redis_options

# After a Redis restart every pooled connection is dead, and the first command on each
# fails with "Connection closed by server": try once more on a fresh connection (and
# twice more after that, within a second) before the error reaches a caller. Timeouts
# are not retried: socket_timeout already bounds them.
_RETRY = {"retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
          "retry_on_error": [redis.ConnectionError]}


def connect(url: str) -> redis.Redis:
    """A client of `url` with the ACL user and TLS settings of dwell.security."""
    return redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10,
                                health_check_interval=15, **_RETRY, **redis_options(url))


@functools.cache
def shared(url: str) -> redis.Redis:
    """One client of `url` for the whole process, made on first use: for code that runs
    in processes it does not own (Spark's Python workers, reused across batches). A
    redis-py client is safe to share between threads."""
    return connect(url)


def connect_async(url: str) -> aredis.Redis:
    return aredis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10,
                                 health_check_interval=15, retry=AsyncRetry(
                                     ExponentialBackoff(cap=0.5, base=0.05), 3),
                                 retry_on_error=[redis.ConnectionError],
                                 **redis_options(url))


# `--- @include "<name>"` on a line of its own stands for the text of
# `includes/<name>.lua` next to the script (BullMQ's includes): Lua shared by scripts is
# written once and each script still runs as one EVALSHA.
_INCLUDE = re.compile(r'^--- @include "([\w-]+)"[ \t]*$', re.M)


def script_source(path: Path) -> str:
    """The text of the Lua script at ``path``, its includes expanded."""
    def include(m: re.Match[str]) -> str:
        return (path.parent / "includes" / f"{m.group(1)}.lua").read_text().rstrip("\n")
    return _INCLUDE.sub(include, path.read_text())


@functools.cache
def _folder(folder: Path) -> dict[str, tuple[int, str]]:
    """name -> (number of keys, source with includes expanded) of a folder's scripts, read
    once per process."""
    out: dict[str, tuple[int, str]] = {}
    for path in sorted(folder.glob("*.lua")):
        name, _, n = path.stem.rpartition("-")
        out[name] = (int(n), script_source(path))
    return out


class Scripts:
    """The Lua scripts of one folder on one client (sync or asyncio):
    `scripts.run("claim", keys, args)` returns what the script returns (an awaitable on
    an asyncio client); `client=` sends it on a pipeline of that client instead. Each
    script is registered with redis-py's `register_script` the first time it runs, and
    redis-py calls it by SHA, loading it again after a Redis restart."""

    def __init__(self, client: Any, folder: Path) -> None:
        self._client = client
        self._folder = _folder(folder)
        self._scripts: dict[str, Any] = {}

    @property
    def num_keys(self) -> dict[str, int]:
        return {name: n for name, (n, _) in self._folder.items()}

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any],
            client: Any = None) -> Any:
        n, source = self._folder[name]
        if len(keys) != n:
            raise ValueError(f"{name}: {len(keys)} keys, the script takes {n}")
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self._client.register_script(source)
        return script(keys=keys, args=args, client=client)
