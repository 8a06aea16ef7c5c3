"""The tracker's ingest: consumer group `dwell-tracker` on `dwell.delayed`, indexing
each record's position under its topic's bucket, committing offsets only after Redis
has the positions, and folding deltas into Roaring blobs in between.

One writer per topic: the record key is the Pulsar topic, so a topic's records sit on
one partition of `dwell.delayed`, owned by one tracker replica at a time. Everything
written is idempotent, so the overlap during a rebalance or a replay after a crash
changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import redis as redislib
from prometheus_client import Counter, Histogram

from dwell import keys
from dwell.adapters.kafka import Consumer, KafkaUnavailable
from dwell.tracker.index import TopicIndex, append_positions

log = logging.getLogger("dwell.tracker.ingest")

DELIVER_AT: Final = "dwell-deliver-at"
TICK_TIME: Final = "dwell-tick-time"
HEADERS: Final = (DELIVER_AT, TICK_TIME)

# Fixed-delay detection state (PIP-448) kept in the topic's stats HASH.
HIGHEST_FIELD: Final = "highestDeliverAt"
FIXED_FIELD: Final = "fixedDelay"
SEEN_PREFIX: Final = "fdOffset:"  # + partition: last offset the detection has seen

INGESTED = Counter("dwell_tracker_ingested_total", "Positions indexed from dwell.delayed")
INVALID = Counter("dwell_tracker_invalid_records_total",
                  "dwell.delayed records without a usable key, deliver-at or tick-time header")
FLUSH_SECONDS = Histogram("dwell_tracker_flush_seconds", "Redis write of one ingest batch",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
COMPACTED = Counter("dwell_tracker_compacted_buckets_total", "Buckets whose deltas were folded")


@dataclass
class _FixedDelay:
    highest: int | None = None
    fixed: bool = True
    seen: dict[int, int] = field(default_factory=dict)


class Ingest:
    """Batches of records -> Redis. `index_batch` is usable without Kafka (bench, tests)."""

    def __init__(self, r: redislib.Redis) -> None:
        self.redis = r
        self._fixed: dict[str, _FixedDelay] = {}
        self.dirty_topics: set[str] = set()

    def _fixed_state(self, topic: str) -> _FixedDelay:
        st = self._fixed.get(topic)
        if st is None:
            raw = self.redis.hgetall(keys.stats(topic))
            st = _FixedDelay()
            if HIGHEST_FIELD.encode() in raw:
                st.highest = int(raw[HIGHEST_FIELD.encode()])
                st.fixed = raw.get(FIXED_FIELD.encode(), b"1") == b"1"
            for k, v in raw.items():
                if k.startswith(SEEN_PREFIX.encode()):
                    st.seen[int(k[len(SEEN_PREFIX):])] = int(v)
            self._fixed[topic] = st
        return st

    def _detect(self, pipe: object, topic: str, parts: np.ndarray, offs: np.ndarray,
                da: np.ndarray, tick: np.ndarray) -> None:
        """PIP-448: the topic has a fixed delay while every new deliverAt is >= the highest
        seen minus one tick. Records already seen (a replay) are skipped."""
        st = self._fixed_state(topic)
        fresh = np.ones(len(offs), dtype=bool)
        for p, last in st.seen.items():
            fresh &= ~((parts == p) & (offs <= last))
        if not fresh.any():
            return
        da, tick = da[fresh], tick[fresh]
        start = st.highest if st.highest is not None else int(da[0])
        prev = np.maximum.accumulate(np.concatenate(([start], da)))[:-1]
        if st.fixed and bool((da < prev - tick).any()):
            st.fixed = False
        st.highest = max(start, int(da.max()))
        mapping: dict[str, int] = {HIGHEST_FIELD: st.highest, FIXED_FIELD: int(st.fixed)}
        for p in np.unique(parts).tolist():
            last = int(offs[parts == p].max())
            if last > st.seen.get(p, -1):
                st.seen[p] = last
                mapping[f"{SEEN_PREFIX}{p}"] = last
        pipe.hset(keys.stats(topic), mapping=mapping)  # type: ignore[attr-defined]

    def index_batch(self, records: list[tuple[int, int, bytes | None, list[bytes | None]]]) -> int:
        """Index `(partition, offset, key, [deliverAt, tickTime])` records in one pipeline.
        Returns positions indexed; bad records are counted and skipped."""
        by_topic: dict[bytes, list[tuple[int, int, int, int]]] = {}
        bad = 0
        for part, off, key, (da, tick) in records:
            try:
                row = (part, off, int(da), int(tick))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                bad += 1
                continue
            if not key or row[3] < 1:
                bad += 1
                continue
            by_topic.setdefault(key, []).append(row)
        if bad:
            INVALID.inc(bad)
            log.warning("skipped %d dwell.delayed records without key/deliver-at/tick-time", bad)
        if not by_topic:
            return 0
        started = time.perf_counter()
        pipe = self.redis.pipeline(transaction=False)
        n = 0
        for raw_topic, rows in by_topic.items():
            topic = raw_topic.decode()
            arr = np.array(rows, dtype=np.int64)
            append_positions(pipe, topic, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3])
            self._detect(pipe, topic, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3])
            self.dirty_topics.add(topic)
            n += len(rows)
        pipe.execute()
        FLUSH_SECONDS.observe(time.perf_counter() - started)
        INGESTED.inc(n)
        return n

    def compact(self, max_buckets: int) -> int:
        """Fold deltas of the topics this process wrote; returns buckets merged."""
        done = 0
        for topic in list(self.dirty_topics):
            idx = TopicIndex(self.redis, topic)
            merged = idx.compact(max_buckets)
            done += merged
            if not idx.dirty_buckets(1):
                self.dirty_topics.discard(topic)
        COMPACTED.inc(done)
        return done


class IngestLoop:
    """The consumer loop: poll a batch, index it, commit it; compact between batches."""

    def __init__(self, r: redislib.Redis, bootstrap: str, topic: str, group_id: str, *,
                 batch_max: int = 50000, poll_timeout_ms: int = 100,
                 compaction_interval_ms: int = 1000, compaction_max_buckets: int = 2000) -> None:
        self.ingest = Ingest(r)
        self.consumer = Consumer(bootstrap, group_id, [topic],
                                 **{"fetch.max.bytes": 104857600,
                                    "queued.max.messages.kbytes": 262144})
        self.topic = topic
        self.batch_max = batch_max
        self.poll_timeout = poll_timeout_ms / 1000
        self.compaction_interval = compaction_interval_ms / 1000
        self.compaction_max_buckets = compaction_max_buckets
        self.stopping = threading.Event()
        self.running = False
        self.error: str | None = None
        self.indexed = 0

    def step(self) -> int:
        records = self.consumer.poll_headers(HEADERS, self.batch_max, self.poll_timeout)
        if not records:
            return 0
        while True:
            # The consumer has moved past these records: retry them until Redis takes them
            # (never commit past them, never drop them).
            try:
                n = self.ingest.index_batch(records)
                break
            except (redislib.RedisError, OSError) as exc:
                self.error = str(exc)
                log.warning("Redis write failed, retrying the batch: %s", exc)
                if self.stopping.wait(0.5):
                    return 0
        # Redis has the positions: only now may Kafka forget them.
        offsets: dict[tuple[str, int], int] = {}
        for part, off, _, _ in records:
            if off + 1 > offsets.get((self.topic, part), -1):
                offsets[(self.topic, part)] = off + 1
        try:
            self.consumer.commit(offsets)
        except KafkaUnavailable as exc:
            # Harmless: a later commit covers these offsets, a replay re-adds a set.
            log.warning("offset commit failed: %s", exc)
        self.indexed += n
        return len(records)

    def run(self) -> None:
        self.running = True
        last_compaction = time.monotonic()
        try:
            while not self.stopping.is_set():
                try:
                    got = self.step()
                    now = time.monotonic()
                    if self.ingest.dirty_topics and (
                            got == 0 or now - last_compaction >= self.compaction_interval):
                        self.ingest.compact(self.compaction_max_buckets)
                        last_compaction = now
                    self.error = None
                except (redislib.RedisError, OSError) as exc:
                    # Nothing was committed for the failed batch: it is read again.
                    self.error = str(exc)
                    log.warning("ingest error, retrying: %s", exc)
                    time.sleep(0.5)
        finally:
            self.running = False
            self.consumer.close()

    def stop(self) -> None:
        self.stopping.set()
