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


def test_with_authentication_on_an_event_needs_a_valid_token() -> None:
    import base64
    import time

    from dwell.auth.tokens import create_secret_key, create_token
    from dwell_spark.invalid import AckAuth

    secret = create_secret_key()
    auth = AckAuth("data:;base64," + base64.b64encode(secret).decode(), "", False,
                   frozenset(), "redis://127.0.0.1:1/0", 1000)
    good = f"Bearer {create_token(secret, 'HS256', 'app')}".encode()
    expired = f"Bearer {create_token(secret, 'HS256', 'app', time.time() - 5)}".encode()
    forged = f"Bearer {create_token(create_secret_key(), 'HS256', 'app')}".encode()
    own = json.dumps({"event": "ack", "topic": "persistent://dwell/system/w",
                      "subscription": "w", "messageId": "dwell.delayed:0:0", "ts": 1}).encode()
    got = check_events(pd.Series([GOOD, GOOD, GOOD, GOOD, own]),
                       pd.Series([[good], None, [expired], [forged], None]), 1024,
                       frozenset({"persistent://dwell/system/w"}), auth)
    assert list(got["kind"]) == [None, invalid.UNAUTHENTICATED, invalid.UNAUTHENTICATED,
                                 invalid.UNAUTHENTICATED, None]
    assert "expired" in got["reason"][2]
