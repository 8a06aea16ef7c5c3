"""The backoff job's per-batch check of dwell.acks records (the pandas UDF's body): good
events get no kind, each bad one its kind and reason, the header check included."""

from __future__ import annotations

import json

import pandas as pd

from dwell.core import invalid
from dwell_spark.invalid import check_events

GOOD = json.dumps({"event": "ack", "topic": "persistent://t/ns/x", "subscription": "s",
                   "messageId": "t.ns.x:0:5", "ts": 1}).encode()


def test_each_record_gets_its_kind_or_none() -> None:
    values = pd.Series([GOOD, b"nope", GOOD, GOOD, b"x" * 2000, None])
    auths = pd.Series([None, None, [b"Bearer t"], [b"\xff"], None, None])
    got = check_events(values, auths, 1024, frozenset())
    assert list(got["kind"]) == [None, invalid.NOT_JSON, None, invalid.HEADER,
                                 invalid.OVERSIZED, invalid.NOT_JSON]
    assert got["reason"][0] is None and "not UTF-8" in got["reason"][3]
