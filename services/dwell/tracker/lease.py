"""The bookkeeping lease: of the tracker's replicas, the one holding it exports the index
figures, commits the low watermarks and trims below them. Each is the same whichever
replica does it: exported by every replica, each topic's figures would be counted once
per replica by a dashboard's `sum by (topic)`, and every replica would commit the same
marks and read `dwell.delivered` for the same trim. (The others still keep their index
view in step, for the HTTP stats they answer.)

The lease is a key in Redis (keys.TRACKER_LEASE) holding the holder's id, taken when no
replica holds it and extended by its holder every third of its length. A replica counts
itself the holder only until the lease's length after its last extension was sent, so it
stops before Redis lets another take over. When the holder dies (or loses Redis), another
replica takes over within one lease length; meanwhile the figures stay as they were, no
low watermark moves and nothing is trimmed, which delays the trim and nothing else."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

import redis as redislib

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.tracker import LUA_DIR
from dwell.tracker.metrics import BOOKKEEPING

log = logging.getLogger("dwell.tracker.lease")


class Lease:
    """This replica's hold on the lease ``key``, taken or extended by :meth:`renew`."""

    def __init__(self, r: redislib.Redis, lease_ms: int, key: str = keys.TRACKER_LEASE,
                 holder: str | None = None) -> None:
        self.redis = r
        self.key = key
        self.lease_ms = lease_ms
        self.holder = holder or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._scripts = redis_adapter.Scripts(r, LUA_DIR)
        self._until = 0.0  # time.monotonic() until which this replica holds it
        self._stop = threading.Event()

    def held(self) -> bool:
        """Whether this replica holds the lease now."""
        return time.monotonic() < self._until

    def renew(self) -> bool:
        """Take the lease if no replica holds it, or extend it if this one does; whether
        this replica holds it now. A Redis error leaves the hold to run out."""
        was = self.held()
        sent = time.monotonic()
        try:
            got = int(self._scripts.run("lease", [self.key], [self.holder, self.lease_ms]))
        except redislib.RedisError as exc:
            log.warning("bookkeeping lease not renewed: %s", exc)
            return self.held()
        self._until = sent + self.lease_ms / 1000 if got else 0.0
        if got and not was:
            log.info("this tracker does the bookkeeping (lease %s as %s)", self.key,
                     self.holder)
        elif was and not got:
            log.warning("another tracker took the bookkeeping lease %s", self.key)
        return bool(got)

    def run(self) -> None:
        """Renew every third of the lease's length until :meth:`stop`."""
        BOOKKEEPING.set_function(lambda: 1.0 if self.held() else 0.0)
        while True:
            self.renew()
            if self._stop.wait(self.lease_ms / 3000):
                return

    def stop(self) -> None:
        """Stop renewing and give the lease up, so another replica takes over at once."""
        self._stop.set()
        if self.held():
            self._until = 0.0
            try:
                self._scripts.run("lease", [self.key], [self.holder, 0])
            except redislib.RedisError as exc:
                log.warning("bookkeeping lease not given up (it runs out): %s", exc)
