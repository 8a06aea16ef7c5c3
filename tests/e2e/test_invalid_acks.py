"""Poison records on dwell.acks, read by the real Spark app (local[2]) on real Kafka and
Redis: malformed events of every kind, among good ones, go to dwell.invalid as sent with
their source position, kind and reason; every good event still reaches the redelivery
index; and the backoff query keeps running (events after the bad ones are applied, the
app's process is alive, the counter counts them)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from dwell import headers as hdr
from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.core import invalid
from dwell.core import topics as names
from dwell_dev.testkit import read_until

from .conftest import Dwell, new_tenant, now_ms

ACK_TIMEOUT_MS = 60000  # far beyond the test: no redelivery comes due while it runs


def test_poison_ack_events_go_to_dwell_invalid_and_the_backoff_goes_on(e2e: Dwell) -> None:
    tenant = new_tenant()
    topic, sub = f"persistent://{tenant}/ns/acks", "s"
    ready = f"{tenant}.ns.acks"
    r = redis_adapter.connect(e2e.redis_url)
    counts_key = keys.sub_counts(topic, sub)
    # Registered, as the SDK does: events of unknown subscriptions are set aside.
    reg = httpx.put(f"{e2e.tracker}/v1/topics/persistent/{tenant}/ns/acks/subscriptions/{sub}",
                    json={}, timeout=10)
    assert reg.status_code < 300, reg.text

    def event(kind: str, offset: int, **extra: Any) -> dict[str, Any]:
        return {"event": kind, "topic": topic, "subscription": sub,
                "messageId": f"{ready}:0:{offset}", "ts": now_ms(),
                "ackTimeoutMs": ACK_TIMEOUT_MS} | extra

    def enc(doc: Any) -> bytes:
        return json.dumps(doc).encode()

    good_event = event("delivered", 0)
    bad: list[tuple[bytes, dict[str, bytes] | None, str, str]] = [
        (b"{not json", None, invalid.NOT_JSON, "not JSON"),
        (b"\xff\xfe", None, invalid.NOT_JSON, "not JSON"),
        (b"[1]", None, invalid.WRONG_TYPE, "not an array"),
        (b"17", None, invalid.WRONG_TYPE, "not a number"),
        (enc({k: v for k, v in good_event.items() if k != "messageId"}), None,
         invalid.FIELD, "messageId: missing"),
        # Each of these failed the backoff query's micro-batch before they were checked.
        (enc(good_event | {"messageId": "no-partition-or-offset"}), None, invalid.FIELD,
         "messageId: "),
        (enc(good_event | {"ackTimeoutRedeliveryBackoff": "fast"}), None, invalid.FIELD,
         "ackTimeoutRedeliveryBackoff: "),
        (enc(good_event | {"topic": "persistent://no/parts"}), None, invalid.FIELD, "topic: "),
        (enc(good_event | {"ts": "yesterday"}), None, invalid.FIELD, "ts: "),
        (enc(good_event | {"event": "settled"}), None, invalid.EVENT_KIND,
         "'settled' is not one of"),
        (enc(good_event), {hdr.AUTHORIZATION: b"\xff"}, invalid.HEADER, "not UTF-8"),
        (enc(good_event), {hdr.AUTHORIZATION: b"Basic x"}, invalid.HEADER, "Bearer <token>"),
        (enc(good_event | {"pad": "x" * 70_000}), None, invalid.OVERSIZED,
         "acks_max_event_bytes"),
    ]
    invalid_ends = kafka.end_offsets(e2e.bootstrap, names.INVALID)
    p = kafka.Producer(e2e.bootstrap, linger_ms=0)
    key = f"{topic}/{sub}".encode()
    good: list[str] = []
    sent_bad: dict[tuple[int, int], tuple[bytes, str, str]] = {}
    offset = 0
    for value, headers, kind, words in [*bad, *bad]:  # each kind twice, goods between
        offset += 1
        ev = event("delivered", offset)
        p.send(names.ACKS, enc(ev), key).result(15)
        good.append(ev["messageId"])
        part, off = p.send(names.ACKS, value, key, headers).result(15)
        sent_bad[(part, off)] = (value, kind, words)
    offset += 1
    last = event("delivered", offset)
    p.send(names.ACKS, enc(last), key).result(15)
    good.append(last["messageId"])

    # Every good event reached the subscription's redelivery index.
    deadline = time.monotonic() + 60
    while set(good) - {m.decode() for m in r.hkeys(counts_key)}:
        assert time.monotonic() < deadline, sorted(
            set(good) - {m.decode() for m in r.hkeys(counts_key)})
        assert e2e.spark.running(), "app died"
        time.sleep(0.2)
    assert all(v == b"1" for v in r.hvals(counts_key))

    def set_aside(recs: list[kafka.Record]) -> dict[tuple[int, int], kafka.Record]:
        return {(int(x.header(hdr.SOURCE_PARTITION) or -1),
                 int(x.header(hdr.SOURCE_OFFSET) or -1)): x
                for x in recs if x.header(hdr.SOURCE_TOPIC) == names.ACKS}

    found = set_aside(read_until(e2e.bootstrap, names.INVALID, invalid_ends,
                                 lambda got: sent_bad.keys() <= set_aside(got).keys(), 60))
    assert sent_bad.keys() <= found.keys(), sorted(sent_bad.keys() - found.keys())
    for pos, (value, kind, words) in sent_bad.items():
        rec = found[pos]
        assert rec.value == value and rec.key == key, pos
        reason = rec.header(hdr.INVALID_REASON) or ""
        assert rec.header(hdr.INVALID_KIND) == kind and words in reason, (pos, kind, reason)

    # Still running: acks sent after the poison cancel every pending redelivery.
    for mid in good:
        p.send(names.ACKS, enc(event("ack", int(mid.rsplit(":", 1)[1]))), key).result(15)
    p.close()
    deadline = time.monotonic() + 60
    while r.hlen(counts_key):
        assert time.monotonic() < deadline, f"{r.hlen(counts_key)} acks not applied"
        time.sleep(0.2)
    assert e2e.spark.running()

    url = f"http://127.0.0.1:{e2e.spark.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    counts = {s.labels["kind"]: s.value for f in text_string_to_metric_families(text)
              for s in f.samples
              if s.name == "dwell_invalid_records_total" and s.labels["source"] == names.ACKS}
    for kind in {k for _, _, k, _ in bad}:
        assert counts.get(kind, 0) >= 2 * sum(1 for b in bad if b[2] == kind), counts
