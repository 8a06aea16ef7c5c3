"""Delivered marks (`dwell.delivered`): before the drain completes a claimed bucket, and
before the restage completes the originals it re-filed, it writes the bucket's positions
there; a rebuild of the index from the delay logs (dwell.tracker.recovery) skips every
position a mark names, so what was delivered is not delivered again. Written by the
tracker and the Spark app alike, hence here in the index layer both use.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable, Mapping

import orjson
from prometheus_client import Counter
from pyroaring import BitMap64

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.index.roaring import decode, encode

log = logging.getLogger("dwell.index.marks")

# Counted in the process-wide registry; the tracker serves it, the Spark app registers it
# in its own.
MARKS_WRITTEN = Counter("dwell_delivered_marks_total",
                        "Completed buckets whose positions went to dwell.delivered")


def mark_record(log_topic: str, topic: str, bucket_start: int,
                positions: Mapping[int, BitMap64]) -> kafka.OutRecord:
    """The `dwell.delivered` record of one completed bucket: key = the Pulsar topic,
    value = `{"log", "bucket", "fields": {index field: base64 of the portable Roaring64}}`
    where `log` is the delay log the fields count from (dwell.core.positions)."""
    value = orjson.dumps({"log": log_topic, "bucket": bucket_start, "fields": {
        str(f): base64.b64encode(encode(BitMap64(bm))).decode()
        for f, bm in positions.items() if len(bm)}})
    return (names.DELIVERED, value, topic.encode(), None, None)


def cancel_mark_record(log_topic: str, topic: str, bucket_start: int, partition: int,
                       offset: int) -> kafka.OutRecord:
    """The `dwell.delivered` record of a cancelled message: a mark of its position (a
    rebuild does not index it again) with `"cancelled": true`, so that a rebuild also puts
    it back among the topic's cancellations before it indexes anything (a re-filed copy
    of it is at another position, and passed over by its origin)."""
    value = orjson.dumps({"log": log_topic, "bucket": bucket_start, "cancelled": True,
                          "fields": {str(partition): base64.b64encode(
                              encode(BitMap64([offset]))).decode()}})
    return (names.DELIVERED, value, topic.encode(), None, None)


def write_marks(producer: kafka.BulkProducer, marks: list[kafka.OutRecord],
                timeout_s: float = 30.0) -> None:
    """Write marks and wait for Kafka's acks (acks=all); KafkaUnavailable otherwise, and
    then the caller must not complete its claims."""
    if not marks:
        return
    producer.send_unreported(marks)
    producer.flush(timeout_s)
    MARKS_WRITTEN.inc(len(marks))


def read_marks(bootstrap: str, log_topic: str, fields: Iterable[int] | None = None,
               timeout_s: float = 120.0, beat: Callable[[], None] | None = None,
               cancels: list[tuple[str, int, bytes]] | None = None) -> dict[int, BitMap64]:
    """Every delivered position of delay log ``log_topic`` that `dwell.delivered` holds,
    per index field (only ``fields`` when given). The topic is read as it comes, folded
    into one bitmap per field; ``timeout_s`` bounds a read that stops moving on, not a
    long one (the topic keeps the delay logs' retention). ``beat`` is called as records
    come (the caller's dwell.liveness heartbeat: a long read is not a stuck loop).
    ``cancels``, when given, gets every cancelled message's (topic, bucketStart,
    ``b"<partition>:<offset>"``) (cancel_mark_record), whatever ``fields`` says."""
    wanted = None if fields is None else set(fields)
    out: dict[int, BitMap64] = {}
    for i, r in enumerate(kafka.iter_from(bootstrap, names.DELIVERED, {}, timeout_s)):
        if beat is not None and i % 1000 == 0:
            beat()
        try:
            body = orjson.loads(r.value or b"")
            if body["log"] != log_topic:
                continue
            cancel = cancels is not None and body.get("cancelled") is True
            # The bitmaps used are decoded before any is: a record with one that is not a
            # bitmap (pyroaring raises IndexError or ValueError) is skipped whole.
            items = [(int(f), decode(base64.b64decode(blob)))
                     for f, blob in body["fields"].items()
                     if cancel or wanted is None or int(f) in wanted]
            if cancel and cancels is not None:
                topic, bucket = (r.key or b"").decode(), int(body["bucket"])
                for f, offsets in items:
                    cancels += [(topic, bucket, b"%d:%d" % (f, o)) for o in offsets]
        except (orjson.JSONDecodeError, KeyError, AttributeError, TypeError, ValueError,
                IndexError):
            log.warning("skipped a malformed %s record at %d:%d", names.DELIVERED,
                        r.partition, r.offset)
            continue
        for field, bm in items:
            if wanted is not None and field not in wanted:
                continue
            if field in out:
                out[field] |= bm
            else:
                out[field] = bm
    return out
