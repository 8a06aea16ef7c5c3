"""Bounded work for every input, against real Kafka, Redis and the real policy and
admission services: a small record or body that names many bad items costs admission
memory and answers bounded by its bytes, not by the square of its item count (issue 28,
finding 2)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.core import topics as names
from dwell_dev.testkit import Service, read_until, wait_for

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
# How much admission's resident memory may grow while it refuses one poison record: the
# record is ~30 KB, so anything near this is work that grows with its item count.
RSS_GROWTH_BOUND = 64 * MIB
POISON_ITEMS = 10_000


def rss(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (VmRSS) or its peak (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


class RssWatch:
    """Samples a service's RSS every 20 ms and kills it once it grows past the bound, so
    that a run against a service that does not bound its work fails instead of taking
    the machine's memory."""

    def __init__(self, svc: Service, bound: int) -> None:
        assert svc.child is not None
        self.svc = svc
        self.pid = svc.child.pid
        self.before = rss(self.pid)
        self.peak = self.before
        self.killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bound,), daemon=True)

    def _run(self, bound: int) -> None:
        while not self._stop.wait(0.02):
            try:
                now = rss(self.pid)
            except (OSError, AssertionError):
                return
            self.peak = max(self.peak, now)
            if now - self.before > bound:
                self.killed = True
                self.svc.kill()
                return

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def admission_svc(services: Any, kafka_bootstrap: str) -> Iterator[Service]:
    """An admission whose ingress has a group of its own starting at the end of
    dwell.publish."""
    svc = services.start("admission", env={
        "DWELL_INGRESS_GROUP": f"dwell-admission-bounds-{uuid.uuid4().hex[:8]}",
        "DWELL_INGRESS_OFFSET_RESET": "latest"})
    wait_for(lambda: httpx.get(f"{svc.url}/readyz").json().get("ingressAssigned"), 30,
             "the ingress to get partitions")
    # Assigned is not yet positioned: a group starting at `latest` takes the end it finds
    # at its first fetch, which may come after a record the test writes. A probe's
    # result shows the ingress reads.
    bootstrap = kafka_bootstrap
    p = kafka.Producer(bootstrap, linger_ms=0)
    try:
        def probe_answered() -> bool:
            results_from = kafka.end_offsets(bootstrap, names.PUBLISH_RESULTS)
            partition, offset = p.send(names.PUBLISH, orjson.dumps({
                "topic": "persistent://hostile/ns/probe",
                "messages": [{"payload": "p"}]})).result(15)
            probe = f"{names.PUBLISH}:{partition}:{offset}"
            return any(orjson.loads(r.value).get("requestId") == probe for r in read_until(
                bootstrap, names.PUBLISH_RESULTS, results_from,
                lambda rs: any(orjson.loads(r.value).get("requestId") == probe for r in rs),
                timeout=10))
        wait_for(probe_answered, 60, "the ingress to answer a probe")
    finally:
        p.close()
    yield svc
    svc.stop()


def poison(items: int) -> bytes:
    return orjson.dumps({"topic": "persistent://hostile/ns/x", "messages": [1] * items})


def test_a_poison_record_on_dwell_publish_costs_admission_little_memory(
        admission_svc: Service, kafka_bootstrap: str) -> None:
    value = poison(POISON_ITEMS)
    results_from = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    invalid_from = kafka.end_offsets(kafka_bootstrap, names.INVALID)
    p = kafka.Producer(kafka_bootstrap, linger_ms=0)
    with RssWatch(admission_svc, RSS_GROWTH_BOUND) as watch:
        try:
            partition, offset = p.send(names.PUBLISH, value).result(15)
        finally:
            p.close()
        request_id = f"{names.PUBLISH}:{partition}:{offset}"
        results = read_until(
            kafka_bootstrap, names.PUBLISH_RESULTS, results_from,
            lambda rs: any(orjson.loads(r.value).get("requestId") == request_id for r in rs)
            or watch.killed, timeout=60)
        # Every result of the request is written in one transaction with the first.
        results = kafka.read_from(kafka_bootstrap, names.PUBLISH_RESULTS, results_from)
    print(f"\npoison record: {POISON_ITEMS} items, {len(value)} bytes, at {request_id}")
    hwm = "n/a" if watch.killed else f"{rss(watch.pid, 'VmHWM') / MIB:.0f} MiB"
    print(f"admission RSS before {watch.before / MIB:.0f} MiB, peak {watch.peak / MIB:.0f} MiB"
          f" (sampled every 20 ms; VmHWM over its life {hwm})")
    assert not watch.killed, (f"admission's RSS grew past {RSS_GROWTH_BOUND // MIB} MiB "
                              f"(from {watch.before / MIB:.0f} MiB); killed")
    mine = [orjson.loads(r.value) for r in results
            if orjson.loads(r.value).get("requestId") == request_id]
    print(f"dwell.publish.results: {len(mine)} result(s): {mine[0] if mine else None}")
    assert len(mine) == 1, f"{len(mine)} results for one request refused as a whole"
    res = mine[0]
    assert res["errorCode"] == 2 and res["messageId"] == "-1" and res["index"] is None
    assert res["errorMsg"] == "messages: 10000 messages; the limit per request is 1000"

    invalids = read_until(
        kafka_bootstrap, names.INVALID, invalid_from,
        lambda rs: any(r.header(hdr.SOURCE_OFFSET) == str(offset)
                       and r.header(hdr.SOURCE_PARTITION) == str(partition) for r in rs),
        timeout=30)
    set_aside = [r for r in invalids if r.header(hdr.SOURCE_TOPIC) == names.PUBLISH
                 and r.header(hdr.SOURCE_PARTITION) == str(partition)
                 and r.header(hdr.SOURCE_OFFSET) == str(offset)]
    assert len(set_aside) == 1, set_aside
    print(f"dwell.invalid: kind {set_aside[0].header(hdr.INVALID_KIND)}, reason "
          f"{set_aside[0].header(hdr.INVALID_REASON)!r}, value {len(set_aside[0].value or b'')}"
          " bytes as sent")
    assert set_aside[0].value == value
    assert httpx.get(f"{admission_svc.url}/healthz").status_code == 200


def test_a_poison_body_over_http_gets_a_short_reason(admission_svc: Service,
                                                     policy: httpx.Client,
                                                     unique: str) -> None:
    assert policy.put(f"/admin/v2/tenants/{unique}", json={}).status_code < 300
    assert policy.put(f"/admin/v2/namespaces/{unique}/ns").status_code < 300
    url = f"{admission_svc.url}/topics/persistent/{unique}/ns/x"
    wait_for(lambda: httpx.post(url, json={"messages": []}).status_code == 200, 30,
             "admission to know the namespace")
    with RssWatch(admission_svc, RSS_GROWTH_BOUND) as watch:
        answer = httpx.post(url, content=poison(POISON_ITEMS),
                            headers={"content-type": "application/json"}, timeout=60)
        # Within the count limit, every item bad: the reason names a few and the count.
        bad = httpx.post(url, content=poison(1000), timeout=60,
                         headers={"content-type": "application/json"})
    assert not watch.killed
    assert answer.status_code == 400, answer.text
    assert answer.json()["reason"] == "messages: 10000 messages; the limit per request is 1000"
    assert bad.status_code == 400, bad.text
    reason = bad.json()["reason"]
    assert reason.endswith("; and 995 more bad fields") and len(reason) < 400, reason
    print(f"\nHTTP: 10,000 items: 400 {answer.json()['reason']!r}; 1,000 bad items: 400 "
          f"{reason!r}; admission RSS before {watch.before / MIB:.0f} MiB, peak "
          f"{watch.peak / MIB:.0f} MiB")
