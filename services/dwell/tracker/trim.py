"""Disk given back as messages are delivered (docs/internals.md, "Retention and trim"):
the records of the delay logs below their committed low watermarks, and the records of
`dwell.delivered` that name only positions below them, are deleted (Kafka's
DeleteRecords). Nothing a pending message or a rebuild needs is below those marks. A
delivered message may still be redelivered (a nack, an ack timeout), from its record: the
delay logs are cut only below the marks as they were ``keep_delivered_s`` ago."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import orjson
import redis as redislib

from dwell import keys
from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.positions import field_partition
from dwell.index.roaring import decode
from dwell.index.topic import CANCEL_KEEP_MS
from dwell.tracker.metrics import TRIM_ROUNDS, TRIMMED
from dwell.tracker.recovery import committed_lowmarks

log = logging.getLogger("dwell.tracker.trim")

# dwell.delivered records one round reads per partition at most: the round stops there
# and the next one goes on, so a long backlog of marks costs bounded work per round.
MAX_MARKS_READ = 100_000
_SKIP = 1 << 62  # a start past any end: iter_from leaves that partition out


class Trimmer:
    """Every ``interval_s``, deletes what is below the committed low watermarks of
    ``delayed_topic`` and ``refiled_topic`` as they were ``keep_delivered_s`` ago, and the
    marks of `dwell.delivered` no rebuild can need any more."""

    def __init__(self, bootstrap: str, tracker_group: str, *, delayed_topic: str,
                 refiled_topic: str, interval_s: float, keep_delivered_s: float = 0.0,
                 redis: redislib.Redis | None = None,
                 leading: Callable[[], bool] = lambda: True) -> None:
        self.bootstrap = bootstrap
        self.tracker_group = tracker_group
        self.delayed_topic = delayed_topic
        self.refiled_topic = refiled_topic
        self.interval_s = interval_s
        self.keep_delivered_s = keep_delivered_s
        # Whether this replica holds the bookkeeping lease (dwell.tracker.lease).
        self.leading = leading
        self.error: str | None = None
        self._stop = threading.Event()
        # The committed low watermarks each round read, (time.time(), lows), oldest first:
        # the newest one at least keep_delivered_s old, and every one after it. Kept in
        # Redis too (keys.trim_rounds) when given one, and read back by the first round.
        self._seen: deque[tuple[float, dict[tuple[str, int], int]]] = deque()
        self._redis = redis
        self._loaded = redis is None

    def log_of(self, field: int) -> tuple[str, int]:
        refiled, partition = field_partition(field)
        return (self.refiled_topic if refiled else self.delayed_topic), partition

    def run_once(self) -> dict[tuple[str, int], int]:
        """One round; the records deleted per (topic, partition)."""
        logs = [(t, p) for t in (self.delayed_topic, self.refiled_topic)
                for p in kafka.partitions(self.bootstrap, t)]
        lows = committed_lowmarks(self.bootstrap, self.tracker_group, logs)
        deleted = kafka.delete_below(self.bootstrap, self.kept_lows(lows, time.time()))
        # A mark names positions for a rebuild of the topic indexes, which reads from the
        # current low watermarks: marks below them are not needed, however recent.
        deleted |= kafka.delete_below(self.bootstrap, self.unneeded_marks(lows))
        for (topic, _), n in deleted.items():
            TRIMMED.labels(topic).inc(n)
        return deleted

    def kept_lows(self, lows: dict[tuple[str, int], int],
                  now: float) -> dict[tuple[str, int], int]:
        """What the delay logs may be cut below, given the ``lows`` read at ``now``
        (seconds): the lows read at least ``keep_delivered_s`` before (each no higher than
        now's), or nothing while no round is that old (the first keep_delivered_s after
        the rounds were first kept, or lost with Redis)."""
        if self.keep_delivered_s <= 0:
            return lows
        if not self._loaded:
            self._seen.extend(sorted(self._stored(now), key=lambda r: r[0]))
            self._loaded = True
        self._seen.append((now, lows))
        while len(self._seen) > 1 and now - self._seen[1][0] >= self.keep_delivered_s:
            self._seen.popleft()
        if self._redis is not None:
            key = keys.trim_rounds(self.tracker_group)
            pipe = self._redis.pipeline(transaction=False)
            # "at" keeps each round's member apart from an earlier round with the same lows.
            pipe.zadd(key, {orjson.dumps({"at": int(now * 1000), "lows": {
                f"{t}:{p}": o for (t, p), o in lows.items()}}): int(now * 1000)})
            pipe.zremrangebyscore(key, "-inf", f"({int(self._seen[0][0] * 1000)}")
            pipe.execute()
        at, old = self._seen[0]
        if now - at < self.keep_delivered_s:
            return {}
        return {tp: min(o, lows[tp]) for tp, o in old.items() if tp in lows}

    def _stored(self, now: float) -> list[tuple[float, dict[tuple[str, int], int]]]:
        """The rounds kept in Redis before ``now`` (an earlier process's, another
        replica's); one it cannot read is left out."""
        assert self._redis is not None
        out = []
        for raw, score in self._redis.zrangebyscore(keys.trim_rounds(self.tracker_group),
                                                    "-inf", int(now * 1000),
                                                    withscores=True):
            try:
                lows = {(t, int(p)): int(o) for tp, o in orjson.loads(raw)["lows"].items()
                        for t, _, p in [tp.rpartition(":")]}
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            out.append((score / 1000, lows))
        return out

    def unneeded_marks(self, lows: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Per partition of `dwell.delivered`, the offset of its first record a rebuild may
        still need (one that names a position at or above its low watermark, or of another
        delay log, whose marks are not this tracker's to judge)."""
        cut: dict[tuple[str, int], int] = {}
        parts = kafka.partitions(self.bootstrap, names.DELIVERED)
        for p in parts:
            others = {q: _SKIP for q in parts if q != p}
            for i, r in enumerate(kafka.iter_from(self.bootstrap, names.DELIVERED, others)):
                if i >= MAX_MARKS_READ or self.needed(r.value, lows):
                    cut[(names.DELIVERED, p)] = r.offset
                    break
                cut[(names.DELIVERED, p)] = r.offset + 1
        return cut

    def needed(self, value: bytes | None, lows: dict[tuple[str, int], int]) -> bool:
        try:
            body = orjson.loads(value or b"")
            if body["log"] != self.delayed_topic:
                return True
            fields = [(int(f), blob) for f, blob in body["fields"].items()]
            # A cancel mark: its message may be pending as a re-filed copy, which no low
            # watermark of this log holds; needed while the sweep would keep it.
            if body.get("cancelled") is True and \
                    int(body["bucket"]) >= time.time() * 1000 - CANCEL_KEEP_MS:
                return True
        except (orjson.JSONDecodeError, KeyError, AttributeError, TypeError, ValueError):
            return False  # a rebuild skips it too
        for field, blob in fields:
            low = lows.get(self.log_of(field))
            if low is None:
                return True
            try:
                bm = decode(base64.b64decode(blob))
            except (ValueError, TypeError):
                continue  # the rebuild cannot use it either
            if len(bm) and bm.max() >= low:
                return True
        return False

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.leading():
                # Another replica trims meanwhile, and keeps its rounds in Redis: read them
                # again when this one leads again.
                self._seen.clear()
                self._loaded = self._redis is None
                self.error = None
                continue
            try:
                deleted = self.run_once()
                self.error = None
                TRIM_ROUNDS.labels("ok").inc()
                if deleted:
                    log.info("trimmed %d records below what is pending (%s)",
                             sum(deleted.values()),
                             ", ".join(f"{t}[{p}]" for t, p in sorted(deleted)[:4])
                             + (f" and {len(deleted) - 4} more" if len(deleted) > 4 else ""))
            except (OSError, kafka.KafkaUnavailable) as exc:
                self.error = str(exc)
                TRIM_ROUNDS.labels("failed").inc()
                log.warning("trim failed, retried in %.0f s: %s", self.interval_s, exc)
            except Exception as exc:
                # Nothing a round meets may end the trim for good: the next round starts
                # over from the committed low watermarks.
                self.error = f"{type(exc).__name__}: {exc}"
                TRIM_ROUNDS.labels("failed").inc()
                log.exception("trim failed, retried in %.0f s", self.interval_s)

    def stop(self) -> None:
        self._stop.set()
