"""The shapes records take on their way in and out of Kafka: `Record` for what is read,
`OutRecord` for batches handed to a producer, `Headers` for what callers pass."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Union

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

Headers = Mapping[str, Union[bytes, str]]
# (topic, value, key, encoded headers, timestamp ms) for Producer.send_many
OutRecord = tuple[str, Optional[bytes], Optional[bytes], Optional[list[tuple[str, bytes]]],
                  Optional[int]]


# `@dataclass(**DATACLASS_SLOTS)`: slotted where Python can (3.10+), so that each instance
# is one object for the garbage collector instead of two. Records read come by the
# hundred at a time.
DATACLASS_SLOTS: dict[str, bool] = {"slots": True} if sys.version_info >= (3, 10) else {}


@dataclass(frozen=True, **DATACLASS_SLOTS)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int
    # True when the broker set timestamp_ms (message.timestamp.type=LogAppendTime): only
    # then does it say when the record was written, whatever its producer claimed.
    log_append_time: bool = False

    def header(self, name: str) -> str | None:
        raw = self.headers.get(name)
        return raw.decode() if raw is not None else None


def record_of(msg: Message) -> Record:
    hdrs = msg.headers() or []
    ts_type, ts = msg.timestamp()
    return Record(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                  {k: (v if v is not None else b"") for k, v in hdrs}, ts,
                  ts_type == TIMESTAMP_LOG_APPEND_TIME)


def encode_headers(headers: Headers | None) -> list[tuple[str, bytes]] | None:
    if not headers:
        return None
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in headers.items()]
