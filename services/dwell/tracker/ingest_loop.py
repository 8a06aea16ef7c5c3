"""The tracker's ingest loop: consumer group `dwell-tracker` on `dwell.delayed` (and
`dwell.delayed.refiled`), two threads deep. It hands each batch to dwell.tracker.ingest's
Ingest, commits offsets only after Redis has the positions, compacts in between, and
checks that Redis still holds what it wrote (rebuilding the index when it does not).

One writer per topic: the record key is the Pulsar topic, so a topic's records sit on
one partition of `dwell.delayed`, owned by one tracker replica at a time. Everything
written is idempotent, so the overlap during a rebalance or a replay after a crash
changes nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Final

import redis as redislib
from pyroaring import BitMap64

from dwell import keys, memory
from dwell.adapters.kafka import BulkProducer, Consumer, KafkaUnavailable, OutRecord
from dwell.core.topics import InvalidTopicName, TopicName
from dwell.index.marks import read_marks, write_marks
from dwell.liveness import Heartbeat
from dwell.tracker.ingest import HEADERS, Decoded, Ingest, decode, last_offsets
from dwell.tracker.metrics import CANCELS_RESTORED, REBUILDS
from dwell.tracker.recovery import committed_lowmarks

# Records read from Kafka per call (see _poll).
POLL_CHUNK: Final = 5000

log = logging.getLogger("dwell.tracker.ingest_loop")

# How long a rebuild's read of dwell.delivered may stop moving on before it gives up and
# retries (a long read goes on while records come).
REBUILD_READ_TIMEOUT_S = 30.0


def restore_cancels(r: redislib.Redis, cancels: list[tuple[str, int, bytes]]) -> None:
    """Put ``cancels`` (read_marks') back among their topics' cancellations; a mark whose
    key is not a topic is skipped (its name would become part of a Redis key)."""
    pipe = r.pipeline(transaction=False)
    n = 0
    for topic, bucket, member in cancels:
        try:
            TopicName.parse(topic)
        except InvalidTopicName:
            continue
        pipe.zadd(keys.topic_index(topic).cancelled, {member: bucket})
        n += 1
        if n % 10_000 == 0:
            pipe.execute()
    pipe.execute()
    if n:
        CANCELS_RESTORED.inc(n)
        log.warning("put back %d cancellations from the cancel marks", n)


class IngestLoop:
    """The consumer loop, two threads deep: the caller's thread polls batch N+1 from Kafka
    while a writer thread indexes batch N in Redis (and compacts in between), through a
    bounded queue. Offsets are committed on the polling thread, in poll order, and only
    for batches whose Redis write has completed."""

    def __init__(self, r: redislib.Redis, bootstrap: str, topic: str, group_id: str, *,
                 source: str | None = None, field_base: int = 0, batch_max: int = 50000,
                 poll_timeout_ms: int = 100,
                 compaction_interval_ms: int = 1000, compaction_max_buckets: int = 2000,
                 compaction_busy_min_delta_bytes: int = 4096, queue_depth: int = 2,
                 redis_check_interval_ms: int = 1000, clock_margin_ms: int = 2000) -> None:
        self.ingest = Ingest(r, source or topic, field_base, clock_margin_ms=clock_margin_ms,
                             record_marks=self._record_marks)
        self._marks: BulkProducer | None = None
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.redis_check_interval = redis_check_interval_ms / 1000
        self._next_check = 0.0
        # index field -> next offset this loop has indexed: what Redis must hold at least
        # (dwell:trk:ingested), or it lost writes.
        self._written_pos: dict[int, int] = {}
        # Partitions assigned to this loop whose index Redis has not been checked against
        # the group's committed offsets yet (a new owner, a restart, a rebalance).
        self._unchecked: set[int] = set()
        self.rebuilding: set[int] = set()
        # Prefetch a few batches, no more: what librdkafka queues is allocated record by
        # record, and a burst's worth of it stays behind in the allocator.
        self.consumer = Consumer(bootstrap, group_id, **{
            "fetch.max.bytes": 64 << 20, "queued.max.messages.kbytes": 32 << 10,
            "queued.min.messages": 2 * batch_max})
        self.consumer.subscribe([topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke)
        self.topic = topic
        self.batch_max = batch_max
        self.poll_timeout = poll_timeout_ms / 1000
        self.compaction_interval = compaction_interval_ms / 1000
        self.compaction_max_buckets = compaction_max_buckets
        self.compaction_busy_min_delta_bytes = compaction_busy_min_delta_bytes
        self.stopping = threading.Event()
        self.running = False
        self.error: str | None = None
        self.indexed = 0
        # perf_counter() of the first non-empty poll (the bench times from there).
        self.first_batch_at: float | None = None
        self._queue: queue.Queue[Decoded] = queue.Queue(maxsize=queue_depth)
        self._closing = threading.Event()
        self._lock = threading.Condition()
        self._queued = 0  # batches handed to the writer
        self._written = 0  # ... of which Redis has every position
        self._done: dict[tuple[str, int], int] = {}  # written, not yet committed
        self._failure: BaseException | None = None
        self._idle = False  # the last poll returned nothing
        # dwell.liveness: the polling thread's rounds, and the writer's.
        self.polling = Heartbeat(f"{topic} ingest")
        self.writing = Heartbeat(f"{topic} ingest writer")
        self.ingest.waiting = self.writing.beat

    # -- polling thread

    def run(self) -> None:
        self.running = True
        writer = threading.Thread(target=self._write_loop, name="tracker-ingest-writer",
                                  daemon=True)
        writer.start()
        try:
            while not self.stopping.is_set():
                self.polling.beat()
                self._check_writer()
                self._commit_written()
                self._check_redis()
                batch = self._poll()
                if self._unchecked and self._check_assigned(batch):
                    continue  # sought back: the batch is read again
                # Compaction between batches only when Kafka has nothing more (or on its
                # interval): while records flow, the writer's time goes to indexing them.
                self._idle = not len(batch)
                if len(batch):
                    if self.first_batch_at is None:
                        self.first_batch_at = time.perf_counter()
                    self._hand_over(batch)
        finally:
            self.polling.beat()
            self._closing.set()
            writer.join()
            self._commit_written()
            self.running = False
            self.consumer.close()
            if self.stopping.is_set():  # a loop ended by an error stays stale
                self.polling.rest()

    def _poll(self) -> Decoded:
        """Up to batch_max records, read POLL_CHUNK at a time and decoded at once: the
        batches queued for the writer hold arrays, and no more than one chunk's records
        are Python objects at a time. The many small objects of a whole batch, freed at
        once, would leave the interpreter's arenas fragmented after a burst. A chunk's
        messages and header lists hold no cycles: the cyclic collector is paused while
        they live (memory.cycles_paused)."""
        with memory.cycles_paused():
            chunks = [decode(self.consumer.poll_columns(
                HEADERS, min(POLL_CHUNK, self.batch_max), self.poll_timeout))]
            read = len(chunks[0])
            while read < self.batch_max and len(chunks[-1]) == POLL_CHUNK:
                # Only what librdkafka already holds: the batch waits for no more.
                chunks.append(decode(self.consumer.poll_columns(
                    HEADERS, min(POLL_CHUNK, self.batch_max - read), 0)))
                read += len(chunks[-1])
            return Decoded.concat(chunks)

    def _check_writer(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _hand_over(self, batch: Decoded) -> None:
        while not self.stopping.is_set():
            try:
                self._queue.put(batch, timeout=self.poll_timeout)
                with self._lock:
                    self._queued += 1
                return
            except queue.Full:
                self.polling.beat()
                self._check_writer()
                self._commit_written()

    def _commit_written(self) -> None:
        with self._lock:
            offsets, self._done = self._done, {}
        if not offsets:
            return
        try:
            # Not waited for: the loop must go on polling whatever the coordinator does.
            self.consumer.commit_in_background(offsets)
        except KafkaUnavailable as exc:
            # Harmless: a later commit covers these offsets, a replay re-adds a set.
            log.warning("offset commit failed: %s", exc)

    # -- losing Redis (dwell.tracker.recovery)

    def _check_redis(self) -> None:
        """On an interval: does Redis still hold every position this loop indexed? Its
        `dwell:trk:ingested` entry gone (FLUSHALL, a restart without data) or lower than
        what was written (lost writes) means no: re-read those partitions."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.redis_check_interval
        try:
            with self._lock:
                # A partition being re-read is not in Redis until its first batch is.
                written = {f: o for f, o in self._written_pos.items()
                           if f not in self.rebuilding}
            if not written:
                return
            fields = list(written)
            have = self.ingest.redis.hmget(keys.INGESTED, [str(f) for f in fields])
        except (redislib.RedisError, OSError, KafkaUnavailable) as exc:
            if self.error != str(exc):
                log.warning("Redis check failed, retrying: %s", exc)
            self.error = str(exc)
            return
        behind = {f: (int(h) if h is not None else None) for f, h in zip(fields, have,
                                                                          strict=True)
                  if h is None or int(h) < written[f]}
        if behind:
            log.warning("Redis lost index writes of %s (index fields %s): rebuilding",
                        self.topic, sorted(behind))
            try:
                self._rebuild(behind, written)
            except (redislib.RedisError, OSError, KafkaUnavailable) as exc:
                # Nothing was sought yet: the loss stays visible and the next check retries.
                self.error = f"rebuild: {exc}"
                log.warning("rebuild of %s failed, retrying: %s", self.topic, exc)

    def _check_assigned(self, batch: Decoded) -> bool:
        """Before indexing newly assigned partitions: does Redis hold what the group
        committed of them? The group commits only after Redis has a batch's positions, so
        an ingested entry missing or below the committed offset means Redis lost them
        (lost while no tracker ran, or while the partitions were with another replica):
        re-read them. Retried until Redis and Kafka answer. True when the consumer was
        sought back to re-read ``batch`` (which is then not to be indexed)."""
        base = self.ingest.field_base
        parts = sorted(self._unchecked)
        while True:
            try:
                done = self.consumer.committed([(self.topic, p) for p in parts])
                have = self.ingest.redis.hmget(keys.INGESTED, [str(p + base) for p in parts])
                break
            except (redislib.RedisError, OSError, KafkaUnavailable) as exc:
                if self.error != str(exc):
                    log.warning("check of the partitions of %s assigned to this tracker "
                                "failed, retrying: %s", self.topic, exc)
                self.error = str(exc)
                if self.stopping.wait(0.5):
                    return True
                self.polling.beat()
        behind: dict[int, int | None] = {}
        written: dict[int, int] = {}
        for p, h in zip(parts, have, strict=True):
            committed = done[(self.topic, p)]
            held = int(h) if h is not None else None
            if committed >= 0 and (held is None or held < committed):
                behind[p + base] = held
                written[p + base] = committed
                continue
            # Go on from what Redis holds; from now on it must hold at least that.
            if held is not None:
                self.ingest.expect[p + base] = held
            if committed >= 0:
                with self._lock:
                    self._written_pos[p + base] = committed
        self._unchecked.difference_update(parts)
        if not behind:
            return False
        log.warning("Redis lacks index writes of %s (index fields %s) that the group "
                    "committed: rebuilding", self.topic, sorted(behind))
        self._unchecked.update(f - base for f in behind)  # until the re-read is set up
        while True:
            try:
                self._rebuild(behind, written)
                break
            except (redislib.RedisError, OSError, KafkaUnavailable) as exc:
                self.error = f"rebuild: {exc}"
                log.warning("rebuild of %s failed, retrying: %s", self.topic, exc)
                if self.stopping.wait(0.5):
                    return True
                self.polling.beat()
        self._unchecked.difference_update(f - base for f in behind)
        # The batch's other partitions are read again from its first record of each.
        first: dict[tuple[str, int], int] = {}
        for part, off in zip(batch.partitions.tolist(), batch.offsets.tolist(), strict=True):
            if part + base not in behind and (self.topic, part) not in first:
                first[(self.topic, part)] = off
        if first:
            self.consumer.seek(first)
        return True

    def _rebuild(self, behind: dict[int, int | None], written: dict[int, int]) -> None:
        """Re-read the partitions of ``behind`` (index field -> what Redis still holds of
        it, None: nothing) from their low watermark, skipping what `dwell.delivered` says
        was delivered, up to what this loop had written (``written``); after that the
        ingest goes on as before. A partition whose low watermark has reached
        ``written`` has nothing to re-read: its ingested entry is only set again."""
        started = time.monotonic()
        with self._lock:  # every batch handed over is in Redis (or the writer failed)
            while self._written < self._queued and self._failure is None:
                self._lock.wait(self.poll_timeout)
                self.polling.beat()
        self._check_writer()
        base = self.ingest.field_base
        lows = committed_lowmarks(self.bootstrap, self.group_id,
                                  [(self.topic, f - base) for f in behind])
        starts: dict[int, int] = {}
        for f, held in behind.items():
            start = lows.get((self.topic, f - base), 0)
            starts[f] = start if held is None else max(start, held)
        # Where the low watermark has reached what the group committed, nothing below it
        # is pending: Redis lost only how far the ingest got, which is set again. Only
        # the others are re-read (and only they need dwell.delivered, read whole).
        reached = {f: start for f, start in starts.items() if start >= written[f]}
        lost = [f for f in behind if f not in reached]
        cancels: list[tuple[str, int, bytes]] = []
        delivered = (read_marks(self.bootstrap, self.ingest.source, lost,
                                timeout_s=REBUILD_READ_TIMEOUT_S, beat=self.polling.beat,
                                cancels=cancels)
                     if lost else {})
        # Before anything is indexed again: a re-filed copy of a cancelled message is at
        # a position no mark names, and the drain passes it over by these.
        restore_cancels(self.ingest.redis, cancels)
        if reached:
            self.ingest.mark_ingested(reached)
        for f in lost:
            self.ingest.begin_rebuild(f, written[f], delivered.get(f, BitMap64()))
            REBUILDS.labels("stale" if behind[f] is not None else "lost").inc()
        self.consumer.seek({(self.topic, f - base): start for f, start in starts.items()})
        with self._lock:
            for f, start in starts.items():
                self._written_pos[f] = start
            self.rebuilding = set(self.ingest.skip_below)
        if reached:
            log.warning("Redis lacks how far the ingest of %s got (index fields %s), with "
                        "nothing pending below the low watermarks: set again, nothing to "
                        "re-read", self.topic, sorted(reached))
        if lost:
            log.warning("Redis lost index writes of %s: re-reading %s from the low "
                        "watermarks (%d delivered positions to skip; set up in %.2fs)",
                        self.topic, ", ".join(f"[{f - base}] {starts[f]}..{written[f]}"
                                              for f in lost),
                        sum(len(delivered.get(f, ())) for f in lost),
                        time.monotonic() - started)

    def _on_assign(self, _consumer: object, partitions: list[Any]) -> None:
        """Rebalance (inside poll): the partitions this loop now owns are checked against
        Redis before their first batch is indexed (`_check_assigned`)."""
        self._unchecked |= {tp.partition for tp in partitions if tp.topic == self.topic}

    def _on_revoke(self, _consumer: object, partitions: list[Any]) -> None:
        """Rebalance (inside poll): finish and commit every batch handed over before the
        partitions go to another replica, so only one process writes a topic at a time;
        forget the fixed-delay state, the next owner of a topic may have moved it on."""
        with self._lock:
            while self._written < self._queued and self._failure is None:
                if self.stopping.is_set():
                    break
                self._lock.wait(self.poll_timeout)
                self.polling.beat()
        self._commit_written()
        self._unchecked -= {tp.partition for tp in partitions if tp.topic == self.topic}
        if self._written == self._queued:
            self.ingest.forget_fixed_state()
            # The next owner writes these partitions' ingested entries from now on.
            self.ingest.expect.clear()
            with self._lock:
                self._written_pos.clear()

    # -- writer thread

    def _write_loop(self) -> None:
        last_compaction = time.monotonic()
        busy = False
        try:
            while True:
                self.writing.beat()
                try:
                    batch: Decoded | None = self._queue.get(timeout=self.poll_timeout)
                except queue.Empty:
                    if self._closing.is_set():
                        self.writing.rest()
                        return
                    batch = None
                if batch is not None and not self._write(batch):
                    self.writing.rest()
                    return
                now = time.monotonic()
                idle = batch is None and self._idle
                if self.ingest.dirty_topics and (
                        idle or now - last_compaction >= self.compaction_interval):
                    # While records flow, only buckets whose deltas grew large: folding a
                    # few entries into a blob costs as much as folding many.
                    self._compact(0 if idle else self.compaction_busy_min_delta_bytes)
                    last_compaction = now
                if batch is not None:
                    busy = True
                elif idle and busy and not self.ingest.dirty_topics:
                    # The stream of batches ended and is folded in: what it took goes back.
                    busy = False
                    memory.release()
        except BaseException as exc:
            self._failure = exc
            with self._lock:
                self._lock.notify_all()
            raise

    def _write(self, batch: Decoded) -> bool:
        """Index one batch, retrying until Redis takes it (the consumer has moved past
        these records: never commit past them, never drop them). False when stopped."""
        while True:
            try:
                n = self.ingest.index_batch(batch)
                self.error = None
                break
            except (redislib.RedisError, OSError, KafkaUnavailable) as exc:
                self.error = str(exc)
                log.warning("the batch's write failed, retrying it: %s", exc)
                if self.stopping.wait(0.5):
                    return False
                self.writing.beat()
        # Redis has the positions: only now may Kafka forget them.
        # A partition's records arrive in offset order: its last one in the batch is the
        # highest (were it not, committing less would only mean a harmless replay).
        last = last_offsets(batch.partitions, batch.offsets)
        with self._lock:
            for part, off in last.items():
                if off + 1 > self._done.get((self.topic, part), -1):
                    self._done[(self.topic, part)] = off + 1
                self._written_pos[part + self.ingest.field_base] = off + 1
            self.rebuilding = set(self.ingest.skip_below)
            self._written += 1
            self.indexed += n
            self._lock.notify_all()
        return True

    def _record_marks(self, marks: list[OutRecord]) -> None:
        """The cancel marks of replacements by schedule key, acknowledged by Kafka
        (KafkaUnavailable otherwise: the batch is written again)."""
        if self._marks is None:
            self._marks = BulkProducer(self.bootstrap, linger_ms=0)
        write_marks(self._marks, marks)

    def _compact(self, min_delta_bytes: int) -> None:
        try:
            self.ingest.compact(self.compaction_max_buckets, min_delta_bytes)
        except (redislib.RedisError, OSError) as exc:
            # Deltas stay until the next round; claims merge them meanwhile.
            self.error = str(exc)
            log.warning("compaction failed, retrying later: %s", exc)
            self.stopping.wait(0.5)

    def stop(self) -> None:
        self.stopping.set()
