"""Positions in dwell's delay log, (partition, offset) playing Pulsar's (ledgerId, entryId),
and the message ids dwell hands back to producers."""

from __future__ import annotations

from collections.abc import Iterable

# A topic index's fields name partitions of the delay log: below this, of `dwell.delayed`;
# from it on, partition (field - REFILED_FIELD_BASE) of `dwell.delayed.refiled`.
REFILED_FIELD_BASE = 1 << 20


def index_field(partition: int, refiled: bool) -> int:
    """The index field of a partition of `dwell.delayed` (or, ``refiled``, of the re-file log)."""
    if not 0 <= partition < REFILED_FIELD_BASE:
        raise ValueError(f"partition {partition} out of range")
    return partition + REFILED_FIELD_BASE if refiled else partition


def field_partition(field: int) -> tuple[bool, int]:
    """Inverse of :func:`index_field`: (refiled, partition)."""
    return (True, field - REFILED_FIELD_BASE) if field >= REFILED_FIELD_BASE else (False, field)


def format_message_id(kafka_topic: str, partition: int, offset: int) -> str:
    return f"{kafka_topic}:{partition}:{offset}"


# The longest id `format_message_id` makes: a Kafka topic name (249 characters at most),
# a partition (an int32) and an offset (an int64), colon-separated.
MAX_MESSAGE_ID_CHARS = 249 + 1 + 10 + 1 + 19


def parse_message_id(s: str) -> tuple[str, int, int]:
    """Inverse of :func:`format_message_id`; raise ValueError on anything else."""
    parts = s.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"invalid message id {s!r}: expected <topic>:<partition>:<offset>")
    topic, partition, offset = parts
    # int() would also take " 5", "+5" and "5_0", and isdigit() other scripts' digits;
    # ids must round-trip exactly: ASCII digits only.
    if not (partition.isascii() and partition.isdigit() and offset.isascii()
            and offset.isdigit()):
        raise ValueError(
            f"invalid message id {s!r}: partition and offset must be non-negative integers"
        )
    return topic, int(partition), int(offset)


# The answers to a cancel of a pending delayed message (the `result` of its answer), and
# the HTTP status each is given.
CANCELLED = "cancelled"  # 200: it will never be delivered, to any subscription
# 404: no pending message of the topic has this id: it never existed, or it was
# delivered already (then the answer's `delivered` is true)
NOT_FOUND = "not_found"
TOO_LATE = "too_late"  # 409: due, and being delivered
BUSY = "busy"  # 503: the index is not there yet (or re-files its bucket); retry
CANCEL_STATUS = {CANCELLED: 200, NOT_FOUND: 404, TOO_LATE: 409, BUSY: 503}


def coalesce(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted inclusive ``(first, last)`` ranges of consecutive offsets; duplicates count once."""
    ranges: list[tuple[int, int]] = []
    for off in sorted(set(offsets)):
        if ranges and ranges[-1][1] + 1 == off:
            ranges[-1] = (ranges[-1][0], off)
        else:
            ranges.append((off, off))
    return ranges
