"""Poison records on dwell.publish, against real Kafka, Redis and the real policy and
admission services: malformed requests of every kind, among good ones, go to
dwell.invalid as sent (with their source position, kind and reason), their producers get
a refusal on dwell.publish.results, every good request is published, and the ingress
keeps running. (dwell.acks' poison records: tests/e2e/test_invalid_acks.py; the token
on the Kafka path: test_ingress_auth.py.)"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.core import invalid
from dwell.core import topics as names
from dwell_dev.testkit import read_until

pytestmark = pytest.mark.integration

MAX_REQUEST_BYTES = 4096


@pytest.fixture(scope="module")
def admission(services: Any) -> Iterator[httpx.Client]:
    """An admission whose ingress has a group of its own starting at the end of
    dwell.publish, and a small request limit."""
    svc = services.start("admission", env={
        "DWELL_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
        "DWELL_INGRESS_GROUP": f"dwell-admission-poison-{uuid.uuid4().hex[:8]}",
        "DWELL_INGRESS_OFFSET_RESET": "latest"})
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        yield c
    svc.stop()


def test_poison_requests_go_to_dwell_invalid_and_the_ingress_goes_on(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str,
        unique: str) -> None:
    assert policy.put(f"/admin/v2/tenants/{unique}", json={}).status_code < 300
    assert policy.put(f"/admin/v2/namespaces/{unique}/ns").status_code < 300
    topic = f"persistent://{unique}/ns/poison"
    deadline = time.monotonic() + 30
    while not admission.get("/readyz").json().get("ingressAssigned"):
        assert time.monotonic() < deadline, "ingress consumer never got partitions"
        time.sleep(0.1)
    # The namespace is known to admission before the Kafka requests come.
    while admission.post(f"/topics/persistent/{unique}/ns/poison",
                         json={"messages": [{"payload": "probe"}]}).status_code != 200:
        assert time.monotonic() < deadline, "namespace never known to admission"
        time.sleep(0.1)

    producer_name = f"prod-{unique}"

    def body(seq: int, **extra: Any) -> bytes:
        return orjson.dumps({"topic": topic, "producerName": producer_name,
                             "messages": [{"payload": f"m{seq}", "sequenceId": seq}]} | extra)

    bad: list[tuple[bytes, dict[str, bytes] | None, str, str]] = [
        (b"{not json", None, invalid.NOT_JSON, "not JSON"),
        (b"\xff\xfe\x00", None, invalid.NOT_JSON, "not JSON"),
        (b"", None, invalid.NOT_JSON, "not JSON"),
        (b"[1, 2, 3]", None, invalid.WRONG_TYPE, "not an array"),
        (b'"a string"', None, invalid.WRONG_TYPE, "not a string"),
        (orjson.dumps({"topic": topic, "producerName": producer_name}), None,
         invalid.FIELD, "messages"),
        (orjson.dumps({"topic": topic, "messages": [{"payload": 5}]}), None,
         invalid.FIELD, "messages[0].payload"),
        (orjson.dumps({"topic": topic, "messages": "all of them"}), None,
         invalid.FIELD, "messages"),
        (body(90, topic="persistent://only-two/parts"), None, invalid.FIELD, "topic: "),
        (body(91), {hdr.AUTHORIZATION: b"\xff\xfe"}, invalid.HEADER, "not UTF-8"),
        (body(92), {hdr.AUTHORIZATION: b"token-without-scheme"}, invalid.HEADER,
         "Bearer <token>"),
        # Refused for its header before it is parsed; its refusal then reads what it
        # can of a value that is not UTF-8 (this stopped the ingress for good).
        (body(94).replace(producer_name.encode(), b"p\xff"),
         {hdr.AUTHORIZATION: b"token-without-scheme"}, invalid.HEADER, "Bearer <token>"),
        (body(93, pad="x" * MAX_REQUEST_BYTES), None, invalid.OVERSIZED,
         f"the limit is {MAX_REQUEST_BYTES} bytes"),
    ]
    invalid_ends = kafka.end_offsets(kafka_bootstrap, names.INVALID)
    result_ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    p = kafka.Producer(kafka_bootstrap, linger_ms=0)
    good: dict[str, int] = {}  # requestId -> sequenceId
    sent_bad: dict[tuple[int, int], tuple[bytes, str, str]] = {}
    seq = 0
    for value, headers, kind, words in [*bad, *bad]:  # each kind twice, goods between
        seq += 1
        part, off = p.send(names.PUBLISH, body(seq), topic).result(15)
        good[f"{names.PUBLISH}:{part}:{off}"] = seq
        part, off = p.send(names.PUBLISH, value, topic, headers).result(15)
        sent_bad[(part, off)] = (value, kind, words)
    seq += 1
    part, off = p.send(names.PUBLISH, body(seq), topic).result(15)
    good[f"{names.PUBLISH}:{part}:{off}"] = seq
    p.close()

    def set_aside(recs: list[kafka.Record]) -> dict[tuple[int, int], kafka.Record]:
        return {(int(r.header(hdr.SOURCE_PARTITION) or -1),
                 int(r.header(hdr.SOURCE_OFFSET) or -1)): r
                for r in recs if r.header(hdr.SOURCE_TOPIC) == names.PUBLISH}

    recs = read_until(kafka_bootstrap, names.INVALID, invalid_ends,
                      lambda got: sent_bad.keys() <= set_aside(got).keys())
    found = set_aside(recs)
    assert sent_bad.keys() <= found.keys(), sorted(sent_bad.keys() - found.keys())
    for pos, (value, kind, words) in sent_bad.items():
        rec = found[pos]
        assert rec.value == (value or None) or rec.value == value, pos
        assert rec.key == topic.encode()
        assert rec.header(hdr.INVALID_KIND) == kind, (pos, rec.header(hdr.INVALID_REASON))
        assert words in (rec.header(hdr.INVALID_REASON) or ""), rec.header(hdr.INVALID_REASON)
    # No good request was set aside.
    assert not {(p_, o) for p_, o in found} & {
        (int(rid.split(":")[1]), int(rid.split(":")[2])) for rid in good}

    def results(recs: list[kafka.Record]) -> dict[str, dict[str, Any]]:
        out = {}
        for r in recs:
            if r.key == producer_name.encode():
                res = orjson.loads(r.value)
                out[res["requestId"]] = res
        return out

    got = results(read_until(kafka_bootstrap, names.PUBLISH_RESULTS, result_ends,
                             lambda recs: good.keys() <= results(recs).keys()))
    for rid, s in good.items():
        assert got[rid]["errorCode"] == 0 and got[rid]["sequenceId"] == s, got[rid]
    # A refused request that named its producer hears why.
    refused = [res for rid, res in got.items() if rid not in good]
    assert refused and all(res["errorCode"] == 2 and res["messageId"] == "-1"
                           for res in refused)

    counts = {s.labels["kind"]: s.value
              for f in text_string_to_metric_families(admission.get("/metrics").text)
              for s in f.samples
              if s.name == "dwell_invalid_records_total"
              and s.labels["source"] == names.PUBLISH}
    for kind in {k for _, _, k, _ in bad}:
        assert counts.get(kind, 0) >= 2 * sum(1 for b in bad if b[2] == kind), counts
    ready = admission.get("/readyz").json()
    assert ready["ingressAssigned"] and ready["ready"], ready

