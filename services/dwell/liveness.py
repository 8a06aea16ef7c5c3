"""Liveness: a loop that has not gone round for too long is stuck inside one call, and its
process answers `/healthz` with 503 so that Kubernetes restarts it (a restart rebuilds
what the process holds from Kafka). Every call a loop makes has a deadline of its own
(a Redis socket timeout, a Kafka request timeout), so a loop that retries through an
outage still goes round; only a call that never returns stops its heartbeat.

The first time a heartbeat is found stale, the stack of its thread is logged: where it
waits is what a stuck loop's report needs."""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Iterable

log = logging.getLogger("dwell.liveness")


class Heartbeat:
    """The last time one loop's thread went round. ``beat`` from the loop's thread, at
    the top of each round and inside every wait and retry; ``rest`` when the loop ends
    on purpose."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.at = time.monotonic()
        self.thread_id: int | None = None
        self.resting = False
        self.reported = False

    def beat(self) -> None:
        self.at = time.monotonic()
        self.thread_id = threading.get_ident()
        self.resting = False
        self.reported = False

    def rest(self) -> None:
        self.resting = True

    def age(self) -> float:
        """Seconds since the last beat; 0 while resting."""
        return 0.0 if self.resting else time.monotonic() - self.at


def stalled(beats: Iterable[Heartbeat], max_age_s: float) -> list[str]:
    """What ``beats`` have not been renewed for more than ``max_age_s``, as "<name>:
    <age> s" lines. Each one's stack is logged the first time it is found stale."""
    out = []
    for hb in beats:
        age = hb.age()
        if age <= max_age_s:
            continue
        out.append(f"{hb.name}: no round for {age:.0f} s")
        if not hb.reported:
            hb.reported = True
            frame = sys._current_frames().get(hb.thread_id or -1)
            where = ("".join(traceback.format_stack(frame)) if frame is not None
                     else "  (its thread has ended)\n")
            log.error("%s has not gone round for %.0f s (limit %.0f s); it waits in:\n%s",
                      hb.name, age, max_age_s, where)
    return out
