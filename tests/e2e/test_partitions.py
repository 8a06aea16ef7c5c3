"""A partitioned topic end to end: a delayed message published to `x-partition-1` is held
to x's max delay and drained, once due and not before, to Kafka partition 1 of x's ready
topic (docs/internals.md, "Partitions")."""

from __future__ import annotations

import time
import uuid

import httpx

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.core.topics import TopicName

from .conftest import SPARK_MARGIN_MS, TICK_MS, Stack, make_namespace, new_tenant, now_ms

PARTITIONS = 3
TOPIC_MAX_MS = 5000


def _ok(r: httpx.Response) -> httpx.Response:
    assert r.status_code < 300, (r.status_code, r.text)
    return r


def test_a_delayed_message_to_a_partition_is_drained_to_it_when_due(e2e: Stack) -> None:
    tenant = new_tenant()
    x = TopicName.parse(f"persistent://{tenant}/ns/x")
    with httpx.Client(base_url=e2e.policy, timeout=10) as policy:
        make_namespace(policy, tenant)
        _ok(policy.put(f"/admin/v2/persistent/{tenant}/ns/x/partitions", json=PARTITIONS))
        _ok(policy.post(f"/admin/v2/persistent/{tenant}/ns/x/delayedDelivery",
                        json={"active": True, "tickTime": TICK_MS,
                              "maxDeliveryDelayInMillis": TOPIC_MAX_MS}))
    url = f"{e2e.admission}/topics/persistent/{tenant}/ns/{x.partition(1).local}"
    with httpx.Client(timeout=30) as admission:
        # x's max delay reaches admission through the policy feed: poll until a delay
        # over it is refused on the partition (a refused probe is never stored).
        deadline = time.monotonic() + 15
        while True:
            r = _ok(admission.post(url, json={"messages": [
                {"payload": "probe", "deliverAfterMs": TOPIC_MAX_MS + 1}]}))
            if r.json()["messagePublishResults"][0]["errorCode"] == 2:
                break
            assert time.monotonic() < deadline, f"x's policy never reached admission: {r.text}"
            time.sleep(0.1)
        # On a tick boundary, so that its bucket starts at deliverAt: any copy written
        # before deliverAt is early.
        deliver_at = (now_ms() + 3000) // TICK_MS * TICK_MS + TICK_MS
        # Its key hashes to partition 0 of 3 (librdkafka's crc32), 2 (Java's murmur2):
        # only its partition can put the copy in partition 1.
        r = _ok(admission.post(url, json={"producerName": "parts", "messages": [
            {"payload": "later", "key": "k0", "deliverAt": deliver_at}]}))
    result = r.json()["messagePublishResults"][0]
    assert (result["errorCode"], result["delayed"], result["deliverAt"]) == (0, True,
                                                                             deliver_at)

    reader = kafka.Consumer(e2e.bootstrap, f"test-{uuid.uuid4().hex}")
    try:
        reader.assign([(x.kafka_topic, p, 0) for p in range(PARTITIONS)])
        got: list[kafka.Record] = []
        deadline = time.monotonic() + 30
        while not got:
            assert time.monotonic() < deadline, "the delayed message was never drained"
            got = [rec for rec in reader.poll(10, 0.2) if rec.value == b"later"]
    finally:
        reader.close()
    rec = got[0]
    assert rec.partition == 1
    assert rec.key == b"k0"
    assert rec.headers[hdr.TOPIC] == str(x).encode()
    assert hdr.PARTITION not in rec.headers
    assert rec.headers[hdr.MESSAGE_ID] == result["messageId"].encode()
    # The copy's timestamp is when the drain wrote it: not early, and at most tickTime
    # + 1 s late (Pulsar's bound) plus the drain's trigger and round.
    assert rec.timestamp_ms >= deliver_at, rec.timestamp_ms - deliver_at
    assert rec.timestamp_ms <= deliver_at + TICK_MS + 1000 + SPARK_MARGIN_MS, \
        rec.timestamp_ms - deliver_at
    print(f"partition copy lateness ms: {rec.timestamp_ms - deliver_at}")
