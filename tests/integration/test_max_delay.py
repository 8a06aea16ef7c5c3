"""The broker-wide delay limit (DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS) on real services:
a message whose delay lies beyond it is rejected with Pulsar's result, over HTTP and over
`dwell.publish` (its result on `dwell.publish.results`), and nothing of it is written;
a policy whose max or fixed delay lies beyond it is a 400 naming the limit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.admit import DELAY_LIMIT_MS
from dwell.core.policy import MAX_LONG
from dwell_dev.testkit import make_namespace, ok

pytestmark = pytest.mark.integration

NOT_ALLOWED = ("org.apache.pulsar.broker.service.BrokerServiceException$NotAllowedException: "
               "Exceeds max allowed delivery delay of {} milliseconds")
LOWERED_MS = 60_000


def publish(admission: httpx.Client, topic: str, *messages: dict[str, Any]) -> list[Any]:
    rest = topic.split("://")[1]
    r = ok(admission.post(f"/topics/persistent/{rest}",
                          json={"producerName": "p", "messages": list(messages)}))
    return r.json()["messagePublishResults"]  # type: ignore[no-any-return]


def wait_known(admission: httpx.Client, topic: str) -> None:
    """Until admission has the namespace (read your writes waits 2 s at most per call)."""
    deadline = time.monotonic() + 30
    while True:
        rest = topic.split("://")[1]
        r = admission.post(f"/topics/persistent/{rest}", json={"messages": [{"payload": "p"}]})
        if r.status_code == 200:
            return
        assert time.monotonic() < deadline, (r.status_code, r.text)
        time.sleep(0.2)


def rejected(limit: int) -> dict[str, Any]:
    return {"messageId": "-1", "errorCode": 2, "schemaVersion": 0,
            "errorMsg": NOT_ALLOWED.format(limit)}


@pytest.fixture(scope="module")
def lowered(services: Any) -> Iterator[httpx.Client]:
    """An admission replica with the limit lowered to a minute; its ingress is off so that
    the `dwell.publish` records of the other test reach the replica at the default."""
    svc = services.start("admission", {"DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS": str(LOWERED_MS),
                                       "DWELL_INGRESS_ENABLED": "false"})
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        yield c
    svc.stop()


def test_a_delay_beyond_the_limit_is_rejected_over_http(policy: httpx.Client,
                                                        admission: httpx.Client,
                                                        lowered: httpx.Client,
                                                        unique: str) -> None:
    make_namespace(policy, unique)
    topic = f"persistent://{unique}/ns/far"
    wait_known(admission, topic)
    t = int(time.time() * 1000)
    results = publish(admission, topic,
                      {"payload": "beyond", "deliverAfterMs": DELAY_LIMIT_MS + 1},
                      {"payload": "at", "deliverAfterMs": DELAY_LIMIT_MS},
                      {"payload": "long", "deliverAt": MAX_LONG},
                      {"payload": "both", "deliverAt": MAX_LONG, "deliverAfterMs": MAX_LONG},
                      {"payload": "after", "deliverAfterMs": MAX_LONG})
    assert results[0] == rejected(DELAY_LIMIT_MS)
    assert results[1]["errorCode"] == 0 and results[1]["delayed"] is True
    assert results[1]["deliverAt"] >= t + DELAY_LIMIT_MS
    assert results[1]["messageId"].startswith(names.DELAYED + ":")
    assert results[2:] == [rejected(DELAY_LIMIT_MS)] * 3

    wait_known(lowered, topic)
    results = publish(lowered, topic, {"payload": "a", "deliverAfterMs": LOWERED_MS + 1},
                      {"payload": "b", "deliverAfterMs": LOWERED_MS},
                      {"payload": "c", "deliverAt": t + 3_600_000})
    assert results[0] == rejected(LOWERED_MS) == results[2]
    assert results[1]["errorCode"] == 0 and results[1]["delayed"] is True


def test_a_delay_beyond_the_limit_is_rejected_on_dwell_publish(policy: httpx.Client,
                                                               admission: httpx.Client,
                                                               kafka_bootstrap: str,
                                                               unique: str) -> None:
    make_namespace(policy, unique)
    topic = f"persistent://{unique}/ns/far"
    wait_known(admission, topic)
    producer = f"prod-{unique}"
    results_ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    delayed_ends = kafka.end_offsets(kafka_bootstrap, names.DELAYED)
    p = kafka.Producer(kafka_bootstrap)
    p.send(names.PUBLISH, orjson.dumps({
        "topic": topic, "producerName": producer,
        "messages": [{"payload": "beyond", "deliverAfterMs": DELAY_LIMIT_MS + 1,
                      "sequenceId": 1},
                     {"payload": "long", "deliverAt": MAX_LONG, "sequenceId": 2},
                     {"payload": "at", "deliverAfterMs": DELAY_LIMIT_MS, "sequenceId": 3}]}),
        topic).result(15)
    p.close()

    got: list[dict[str, Any]] = []
    c = kafka.Consumer(kafka_bootstrap, f"test-{unique}")
    c.assign([(names.PUBLISH_RESULTS, part, off) for part, off in results_ends.items()])
    deadline = time.monotonic() + 60
    while len(got) < 3 and time.monotonic() < deadline:
        got += [orjson.loads(r.value) for r in c.poll(500, 0.5) if r.key == producer.encode()]
    c.close()
    assert len(got) == 3, got
    by_seq = {m["sequenceId"]: m for m in got}
    for seq in (1, 2):
        assert {k: by_seq[seq][k] for k in ("messageId", "errorCode", "errorMsg")} == {
            "messageId": "-1", "errorCode": 2, "errorMsg": NOT_ALLOWED.format(DELAY_LIMIT_MS)}
    assert by_seq[3]["errorCode"] == 0 and by_seq[3]["messageId"].startswith(names.DELAYED)

    # Only the message at the limit reached the delay log.
    c = kafka.Consumer(kafka_bootstrap, f"test-{unique}-d")
    c.assign([(names.DELAYED, part, off) for part, off in delayed_ends.items()])
    mine: list[bytes] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        mine += [r.value for r in c.poll(500, 0.5) if r.key == topic.encode()]
    c.close()
    assert mine == [b"at"]


def test_a_fixed_delay_beyond_the_limit_is_a_400_naming_it(policy: httpx.Client,
                                                           unique: str) -> None:
    field = "fixedDeliveryDelayInMillis"
    make_namespace(policy, unique)
    reason = (f"{field}: {DELAY_LIMIT_MS + 1} is more than the longest delay dwell accepts, "
              f"{DELAY_LIMIT_MS} ms (DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS)")
    ns_path = f"/admin/v2/namespaces/{unique}/ns/delayedDelivery"
    r = policy.post(ns_path, json={"active": True, field: DELAY_LIMIT_MS + 1})
    assert (r.status_code, r.json()["reason"]) == (400, reason)
    assert policy.get(ns_path).json() is None

    ok(policy.put(f"/admin/v2/persistent/{unique}/ns/x"))
    topic_path = f"/admin/v2/persistent/{unique}/ns/x/delayedDelivery"
    r = policy.post(topic_path, json={field: DELAY_LIMIT_MS + 1})
    assert (r.status_code, r.json()["reason"]) == (400, reason)

    r = policy.put(f"/admin/v2/namespaces/{unique}/other",
                   json={"delayed_delivery_policies": {field: DELAY_LIMIT_MS + 1}})
    assert (r.status_code, r.json()["reason"]) == (400, "delayed_delivery_policies." + reason)
    assert policy.get(f"/admin/v2/namespaces/{unique}").json() == [f"{unique}/ns"]

    ok(policy.post(ns_path, json={field: DELAY_LIMIT_MS}))
    ok(policy.post(topic_path, json={field: DELAY_LIMIT_MS}))
    # A max past the limit is stored as Pulsar stores it: the limit caps each message.
    ok(policy.post(ns_path, json={"maxDeliveryDelayInMillis": MAX_LONG}))
    assert policy.get(ns_path).json()["maxDeliveryDelayInMillis"] == MAX_LONG


def delay_log_bytes(data_dir: Path) -> int:
    """Bytes `dwell.delayed` takes in Kafka's log dir: its segments' records (`.log`) and
    the blocks their indexes use (Kafka preallocates those sparse)."""
    total = 0
    for part in data_dir.glob(f"{names.DELAYED}-*"):
        for f in part.iterdir():
            st = f.stat()
            total += st.st_size if f.suffix == ".log" else st.st_blocks * 512
    return total


def test_disk_per_pending_message(policy: httpx.Client, admission: httpx.Client,
                                  stack: Any, unique: str) -> None:
    """Bytes on Kafka's disk per pending message: 100,000 messages with delays up to 30
    days published over HTTP (100-byte payloads, a key, a property, as the benches
    send), the delay log's partition directories measured before and after (pytest -s
    prints the figure)."""
    make_namespace(policy, unique)
    topic = f"persistent://{unique}/ns/disk"
    wait_known(admission, topic)
    data_dir = stack.data_dir("kafka")
    n, batch, day = 100_000, 1000, 86_400_000
    before = delay_log_bytes(data_dir)
    for s in range(0, n, batch):
        results = publish(admission, topic, *[
            {"payload": "x" * 100, "key": f"k{i}", "properties": {"app": "bench"},
             "deliverAfterMs": 60_000 + (i * 7919) % (30 * day)}
            for i in range(s, s + batch)])
        assert all(r["delayed"] for r in results)
    # Kafka appends to its segment files as it acknowledges; the sizes are final.
    grown = delay_log_bytes(data_dir) - before
    per_message = grown / n
    print(f"\ndwell.delayed grew {grown:,} B for {n:,} pending messages (100-byte payload): "
          f"{per_message:.1f} B on disk per pending message")
    assert 100 < per_message < 2000
