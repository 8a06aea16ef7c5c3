"""Losing Redis under the backoff: the subscriptions' redelivery indexes (`dwell:sub:…`)
are rebuilt by replaying dwell.acks, which Kafka keeps (docs/internals.md, "Losing
Redis").

Redis's marker `dwell:backoff:applied` holds, per partition of dwell.acks, the offset below
which the indexes hold every event's decisions. Only a rebuild creates it (the backoff's
writes move it only while it exists), so after a FLUSHALL or a restart without data it is
gone even if a batch wrote in between; a marker below what this process saw written means
Redis rolled back (a restart that lost its last second, a replica that missed writes).
Each micro-batch checks it before its partitions are written, and a partition's batch that
finds it gone writes nothing and says so. A rebuild then reads dwell.acks from the replay
window's start (below) up to its current end, runs every event through the same
checks and decisions as the backoff (dwell_spark.backoff.Pass), in memory, and puts what
is still pending back into the indexes at its own due time; the marker becomes that end,
so the backoff takes up from there and skips what the replay covered. An idle app runs no
micro-batch, so a thread checks the marker on an interval and, when Redis is behind, sends
the warm-up event to `dwell.acks` to make the query run one.

The replay goes back as far as any registered subscription can put off a redelivery
(its ack timeout plus backoff, or its negative-ack backoff; read from the compacted
`dwell.subscriptions`) plus backoff_state_grace_ms, and never further than
backoff_replay_window_ms.

An entry whose bucket the drain could already have claimed may have been redelivered
before the loss. It is put back only if its subscription's retry (or dead-letter) topic has
no copy of it with its count, read from the time its bucket started: so a redelivery is
repeated only if its copy was being written while the rebuild looked (a claim in flight).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis as redislib

from dwell import headers, keys
from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.backoff import DEFAULT_NACK_DELAY_MS
from dwell.core.buckets import bucket_due_cutoff
from dwell.core.positions import parse_message_id
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName, dlq_topic, retry_topic
from dwell.index.redelivery import PendingEntry, SubscriptionIndex

from . import metrics
from .settings import SparkSettings

if TYPE_CHECKING:
    from .backoff import Pass

log = logging.getLogger("dwell.spark.recovery")
# How often the nudge that makes an idle query run a micro-batch is sent again while Redis
# stays behind.
NUDGE_EVERY_S = 5.0
# How often the lag check reads dwell.acks's partitions again (they can be added).
PARTITIONS_EVERY_S = 60.0
# HSET of stored counts, this many messages at a time.
COUNTS_CHUNK = 10_000
# dwell.acks records decided at a time by a rebuild.
REPLAY_CHUNK = 10_000


@dataclass(frozen=True, slots=True)
class Pending:
    """One message's pending redelivery; ``stored`` is the count as the index stores it
    (-(count + 1): a dead letter)."""

    topic: str
    subscription: str
    message_id: str
    due_at: int
    bucket: int
    stored: int

    def copy_id(self) -> tuple[str, str, int]:
        """(target topic, messageId, redelivery count) of the copy the drain writes for it."""
        t = TopicName.parse(self.topic)
        if self.stored < 0:
            return dlq_topic(t, self.subscription), self.message_id, -self.stored - 1
        return retry_topic(t, self.subscription), self.message_id, max(1, self.stored)


def columns(messages: Sequence[Any]) -> dict[str, list[Any]]:
    """dwell.acks messages (confluent-kafka's) as the backoff pass's SOURCE_COLUMNS."""
    cols: dict[str, list[Any]] = {k: [] for k in
                                  ("partition", "offset", "ts", "tsType", "key", "value",
                                   "auths")}
    for m in messages:
        ts_type, ts = m.timestamp()
        cols["partition"].append(m.partition())
        cols["offset"].append(m.offset())
        cols["ts"].append(ts)
        # The Kafka source's timestampType: 1 is LogAppendTime.
        cols["tsType"].append(1 if ts_type == kafka.TIMESTAMP_LOG_APPEND_TIME else 0)
        cols["key"].append(m.key())
        cols["value"].append(m.value())
        cols["auths"].append([v for k, v in (m.headers() or []) if k == headers.AUTHORIZATION])
    return cols


def replay(bootstrap: str, work: Pass, since_ms: int, ends: Mapping[int, int],
           now_ms: int) -> list[Pending]:
    """Every redelivery still pending after the dwell.acks events from ``since_ms`` up to
    ``ends`` (offset per partition), decided as the backoff decides them."""
    state: dict[tuple[str, str], dict[str, PendingEntry]] = defaultdict(dict)

    def read(topic: str, sub: str, mids: list[str]) -> dict[str, PendingEntry]:
        have = state[(topic, sub)]
        return {m: have[m] for m in mids if m in have}

    def fold(chunk: list[Any]) -> None:
        decided = work.decide(columns(chunk), read, now_ms)
        for key, touched in decided.pending.items():
            have = state[key]
            for mid, entry in touched.items():
                if entry is None:
                    have.pop(mid, None)
                else:
                    have[mid] = entry

    starts = kafka.offsets_at(bootstrap, names.ACKS, since_ms)
    chunk: list[Any] = []
    for msg in kafka.iter_messages_from(bootstrap, names.ACKS, starts):
        if msg.offset() >= ends.get(msg.partition(), 0):
            continue
        chunk.append(msg)
        if len(chunk) >= REPLAY_CHUNK:
            fold(chunk)
            chunk = []
    if chunk:
        fold(chunk)
    return [Pending(topic, sub, mid, *entry)
            for (topic, sub), entries in state.items() for mid, entry in entries.items()]


def redelivery_horizon_ms(s: SubscriptionSettings) -> int:
    """The longest a subscription's event can put off its redelivery: its ack timeout plus
    the ack-timeout backoff's longest delay, or the negative-ack backoff's longest delay
    (Pulsar's 1 min without one)."""
    ack = 0
    if s.ack_timeout_ms > 0:
        extra = s.ack_timeout_redelivery_backoff
        ack = s.ack_timeout_ms + (extra.max_delay_ms if extra is not None else 0)
    nack = s.negative_ack_redelivery_backoff
    return max(ack, nack.max_delay_ms if nack is not None else DEFAULT_NACK_DELAY_MS)


def replay_window_ms(bootstrap: str, settings: SparkSettings) -> int:
    """How far back a rebuild replays dwell.acks: the longest redelivery horizon of any
    subscription registered on `dwell.subscriptions` (compacted: one record each), plus
    backoff_state_grace_ms, at most backoff_replay_window_ms."""
    latest: dict[bytes, bytes | None] = {}
    for rec in kafka.read_all(bootstrap, names.SUBSCRIPTIONS):
        if rec.key is not None:
            latest[rec.key] = rec.value
    longest = 0
    for value in latest.values():
        if value is None:
            continue
        try:
            found = SubscriptionSettings.from_json(json.loads(value))
        except ValueError:
            continue  # the tracker skips it too
        longest = max(longest, redelivery_horizon_ms(found))
    wanted = longest + settings.backoff_state_grace_ms
    if wanted > settings.backoff_replay_window_ms:
        log.warning("a subscription can put off its redeliveries by %d s, longer than "
                    "DWELL_BACKOFF_REPLAY_WINDOW_MS (%d s): a rebuild replays only that "
                    "much of dwell.acks", wanted // 1000,
                    settings.backoff_replay_window_ms // 1000)
    return min(wanted, settings.backoff_replay_window_ms)


def delivered_copies(bootstrap: str, due: list[Pending]) -> set[tuple[str, str, int]]:
    """(target, messageId, count) of the copies on the retry and DLQ topics of ``due``'s
    subscriptions, read from the earliest bucket start among them: the drain never writes
    a copy before its bucket starts."""
    since: dict[str, int] = {}
    for p in due:
        target = p.copy_id()[0]
        since[target] = min(since.get(target, p.bucket), p.bucket)
    existing = kafka.topic_names(bootstrap)
    out: set[tuple[str, str, int]] = set()
    for target, ts in since.items():
        if target not in existing:
            continue
        starts = kafka.offsets_at(bootstrap, target, ts)
        for rec in kafka.iter_from(bootstrap, target, starts):
            mid, count = rec.header(headers.MESSAGE_ID), rec.header(headers.REDELIVERY_COUNT)
            if mid is not None and count is not None and count.isdigit():
                out.add((target, mid, int(count)))
    return out


def restore(r: redislib.Redis, bootstrap: str, entries: list[Pending], tick_ms: int,
            now_ms: int) -> tuple[int, int, int]:
    """Put ``entries`` back into their subscriptions' redelivery indexes and pending
    hashes, except those already due whose copy is on their retry or DLQ topic; (put back
    pending, put back already due, skipped)."""
    # Up to the strict cutoff a drainer may have claimed the bucket before the loss.
    cutoff = bucket_due_cutoff(now_ms, tick_ms, strict=True)
    due = [p for p in entries if p.bucket <= cutoff]
    copies = delivered_copies(bootstrap, due) if due else set()
    by_sub: dict[tuple[str, str], list[Pending]] = defaultdict(list)
    skipped = 0
    for p in entries:
        if p.bucket <= cutoff and p.copy_id() in copies:
            skipped += 1
        else:
            by_sub[(p.topic, p.subscription)].append(p)
    for (topic, sub), ps in by_sub.items():
        idx = SubscriptionIndex(r, topic, sub)
        # Counts first: the drain reads an entry's count when it emits it.
        for i in range(0, len(ps), COUNTS_CHUNK):
            part = ps[i:i + COUNTS_CHUNK]
            idx.store_counts({p.message_id: p.stored for p in part})
            idx.write_pending({p.message_id: (p.due_at, p.bucket, p.stored) for p in part})
        idx.add([(*parse_message_id(p.message_id), p.due_at) for p in ps], tick_ms)
    return len(entries) - len(due), len(due) - skipped, skipped


class IndexKeeper:
    """Keeps the redelivery indexes in Redis level with dwell.acks: ``before`` and ``saw``
    wrap each micro-batch, ``run`` watches an idle app."""

    def __init__(self, settings: SparkSettings, redis: redislib.Redis, work: Pass,
                 nudge: Callable[[], None]) -> None:
        self.settings = settings
        self.redis = redis
        self.work = work
        # Per partition, the offset this process saw written: a marker below it is a
        # rollback.
        self.applied: dict[int, int] = {}
        # Per partition, the broker timestamp of the last event a micro-batch applied.
        self.applied_ts: dict[int, int] = {}
        # Makes the backoff query run a micro-batch (it sends the warm-up event).
        self._nudge = nudge
        self.error: str | None = None
        self._lock = threading.Lock()
        # What measure_lag reads end offsets with, kept open: a client per check would
        # connect to the brokers every second.
        self._reader: kafka.Consumer | None = None
        self._reader_lock = threading.Lock()
        self._partitions: list[int] = []
        self._partitions_at = 0.0

    def marker(self) -> dict[int, int] | None:
        raw = self.redis.hgetall(keys.BACKOFF_APPLIED)
        return {int(p): int(o) for p, o in raw.items()} if raw else None

    def behind(self) -> str | None:
        """Why Redis does not hold the decisions this process wrote, or None."""
        found = self.marker()
        if found is None:
            return "lost"
        if any(found.get(p, 0) < o for p, o in self.applied.items()):
            return "stale"
        return None

    def start(self, replay: bool) -> dict[int, int]:
        """Before the query starts: the offsets a new checkpoint starts reading at (every
        partition of dwell.acks). Without a marker Redis holds no decisions: rebuilt from
        the replay window when ``replay``, else taken up from the end of dwell.acks."""
        if self.marker() is None:
            if replay:
                self.rebuild("lost")
            else:
                self._set_marker(kafka.end_offsets(self.settings.kafka_bootstrap, names.ACKS))
        found = self.marker() or {}
        # A partition without a marker (added later) is read from its start.
        return {p: found.get(p, -2)
                for p in kafka.partitions(self.settings.kafka_bootstrap, names.ACKS)}

    def before(self) -> None:
        """Before a micro-batch's writes: rebuild if Redis lost those of the batches before
        it."""
        reason = self.behind()
        if reason is not None:
            self.rebuild(reason)

    def saw(self, rows: Sequence[Any]) -> None:
        """A micro-batch's summaries (dwell_spark.backoff.SUMMARY_SCHEMA)."""
        for r in rows:
            if not r.lost:
                self.applied[r.partition] = max(self.applied.get(r.partition, 0), r.next)
                self.applied_ts[r.partition] = max(self.applied_ts.get(r.partition, 0),
                                                   r.last_ts)

    def _set_marker(self, offsets: Mapping[int, int]) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.BACKOFF_APPLIED)
        # An empty dwell.acks still gets a marker: its partitions at 0.
        pipe.hset(keys.BACKOFF_APPLIED, mapping={str(p): o for p, o in offsets.items()}
                  or {"0": 0})
        pipe.execute()
        self.applied = dict(offsets)

    def rebuild(self, reason: str) -> None:
        """Replay dwell.acks over the replay window and put what is pending back."""
        with self._lock:
            started = time.monotonic()
            s = self.settings
            now = int(time.time() * 1000)
            ends = kafka.end_offsets(s.kafka_bootstrap, names.ACKS)
            window = replay_window_ms(s.kafka_bootstrap, s)
            entries = replay(s.kafka_bootstrap, self.work, now - window, ends, now)
            read = time.monotonic()
            pending, due, skipped = restore(self.redis, s.kafka_bootstrap, entries,
                                            s.redelivery_tick_ms, int(time.time() * 1000))
            self._set_marker(ends)
            metrics.BACKOFF_REBUILDS.labels(reason).inc()
            metrics.BACKOFF_REBUILT.labels("pending").inc(pending)
            metrics.BACKOFF_REBUILT.labels("due").inc(due)
            metrics.BACKOFF_REBUILT.labels("skipped_delivered").inc(skipped)
            log.warning("redelivery indexes %s: rebuilt from dwell.acks (the last %d s, up to "
                        "offsets %s) in %.2fs (replay %.2fs): %d pending put back, %d already "
                        "due put back, %d skipped (on the retry or dead-letter topic)",
                        reason, window // 1000, ends,
                        time.monotonic() - started, read - started, pending, due, skipped)

    def measure_lag(self) -> int | None:
        """The events of dwell.acks the backoff has not applied yet (None while Redis has
        no marker); also the dwell_backoff_lag_events gauge."""
        found = self.marker()
        if found is None:
            return None
        ends = self._ends()
        lag = sum(max(0, end - found.get(p, 0)) for p, end in ends.items())
        metrics.BACKOFF_LAG.set(lag)
        return lag

    def read_to(self) -> int:
        """The time (ms, broker time) before which every event of dwell.acks is applied in
        Redis: now for a partition the marker has reached the end of, else the timestamp
        of the last event applied there (0 before any). A redelivery due later than this
        may still have an ack not read yet, so the drain leaves it (Drainer's
        ``acks_read_to``): a backoff behind by more than an ack timeout would otherwise
        redeliver messages acknowledged in time."""
        now = int(time.time() * 1000)  # before the ends: all written before it is in them
        ends = self._ends()
        found = self.marker() or {}
        behind = [self.applied_ts.get(p, 0) for p, end in ends.items()
                  if found.get(p, 0) < end]
        return min([now, *behind])

    def _ends(self) -> dict[int, int]:
        """The end offsets of dwell.acks, with the client kept open (the lag check and the
        drain's read_to ask every round)."""
        with self._reader_lock:
            bootstrap = self.settings.kafka_bootstrap
            if time.monotonic() - self._partitions_at > PARTITIONS_EVERY_S:
                self._partitions = kafka.partitions(bootstrap, names.ACKS)
                self._partitions_at = time.monotonic()
            if self._reader is None:
                self._reader = kafka.Consumer(bootstrap, "dwell-backoff-lag")
            try:
                return self._reader.end_offsets(names.ACKS, self._partitions)
            except kafka.KafkaUnavailable:
                reader, self._reader = self._reader, None  # a new client next time
                reader.close()
                raise

    def run(self, stop: threading.Event) -> None:
        """While no micro-batch runs, check the marker on an interval; when Redis is behind,
        make the query run one (which rebuilds before anything else)."""
        nudged = 0.0
        while not stop.wait(self.settings.redis_check_interval_ms / 1000):
            try:
                self.measure_lag()
                if self.behind() is None:
                    nudged = 0.0
                elif time.monotonic() - nudged >= NUDGE_EVERY_S:
                    self._nudge()
                    nudged = time.monotonic()
                self.error = None
            except Exception as exc:  # Redis or Kafka down: the next round tries again
                self.error = str(exc)
                log.warning("redelivery index check failed: %s", exc)
