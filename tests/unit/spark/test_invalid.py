"""The backoff pass's check of dwell.acks records: good events get no kind and come back
parsed, each bad one its kind and reason, the header check included."""

from __future__ import annotations

import json

from dwell.core import invalid
from dwell_spark.invalid import check_records

GOOD = json.dumps({"event": "ack", "topic": "persistent://t/ns/x", "subscription": "s",
                   "messageId": "t.ns.x:0:5", "ts": 1}).encode()


def test_each_record_gets_its_kind_or_none() -> None:
    values = [GOOD, b"nope", GOOD, GOOD, b"x" * 2000, None]
    auths = [None, None, [b"Bearer t"], [b"\xff"], None, None]
    got = check_records(values, auths, 1024, frozenset())
    assert [kind for kind, _, _ in got] == [None, invalid.NOT_JSON, None, invalid.HEADER,
                                            invalid.OVERSIZED, invalid.NOT_JSON]
    assert got[0] == (None, None, json.loads(GOOD)) and got[2] == got[0]
    assert "not UTF-8" in (got[3][1] or "")
    assert all(reason and doc is None for kind, reason, doc in got if kind)


def test_with_authentication_on_an_event_needs_a_kafka_token_valid_when_written() -> None:
    import base64
    import time

    from dwell.auth.tokens import create_kafka_token, create_secret_key, create_token
    from dwell_spark.invalid import LOG_APPEND_TIME, AckAuth

    secret = create_secret_key()
    auth = AckAuth("", "data:;base64," + base64.b64encode(secret).decode(), "", False,
                   frozenset(), "redis://127.0.0.1:1/0", 1000)
    now = time.time()
    kafka_token, expires_ms = create_kafka_token(secret, "app", 2000, now=now - 60)
    good = f"Bearer {kafka_token}".encode()
    long_lived = f"Bearer {create_token(secret, 'HS256', 'app')}".encode()
    forged = f"Bearer {create_kafka_token(create_secret_key(), 'app', 60_000)[0]}".encode()
    own = json.dumps({"event": "ack", "topic": "persistent://dwell/system/w",
                      "subscription": "w", "messageId": "dwell.delayed:0:0", "ts": 1}).encode()
    written = expires_ms - 1000  # while the token was valid; read a minute later
    cases = [  # (header, record timestamp, timestamp type, kind)
        ([good], written, LOG_APPEND_TIME, None),
        (None, written, LOG_APPEND_TIME, invalid.UNAUTHENTICATED),
        ([good], expires_ms + 1, LOG_APPEND_TIME, invalid.UNAUTHENTICATED),  # replayed
        ([good], written, 0, invalid.UNAUTHENTICATED),  # the producer chose the time
        ([long_lived], written, LOG_APPEND_TIME, invalid.UNAUTHENTICATED),
        ([forged], written, LOG_APPEND_TIME, invalid.UNAUTHENTICATED),
    ]
    got = check_records([GOOD] * len(cases) + [own], [c[0] for c in cases] + [None], 1024,
                        frozenset({"persistent://dwell/system/w"}), auth,
                        [c[1] for c in cases] + [0], [c[2] for c in cases] + [0])
    assert [kind for kind, _, _ in got] == [c[3] for c in cases] + [None]
    reasons = [reason or "" for _, reason, _ in got]
    assert "expired before the record was written" in reasons[2]
    assert "LogAppendTime" in reasons[3]
    assert "POST /admin/v2/kafka-tokens" in reasons[4]
    assert got[-1][2] == json.loads(own)  # the app's own event needs no token
