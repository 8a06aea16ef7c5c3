"""A partitioned topic end to end: a delayed message published to `x-partition-1` is held
to x's max delay and drained, once due and not before, to Kafka partition 1 of x's ready
topic (docs/internals.md, "Partitions")."""

from __future__ import annotations

import threading
import time
import uuid

import httpx

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.adapters.kafka.config import METADATA_REFRESH_MS
from dwell.client import Producer
from dwell.core.topics import TopicName

from .conftest import (
    SPARK_MARGIN_MS,
    TICK_MS,
    Dwell,
    consumer,
    make_namespace,
    new_tenant,
    now_ms,
)

PARTITIONS = 3
TOPIC_MAX_MS = 5000


def _ok(r: httpx.Response) -> httpx.Response:
    assert r.status_code < 300, (r.status_code, r.text)
    return r


def test_a_delayed_message_to_a_partition_is_drained_to_it_when_due(e2e: Dwell) -> None:
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


GROWN_TO = 4
PUBLISH_S = 24.0
GROW_AFTER_S = 6.0
DELAY_MS = 2000
# A producer that knew the topic before it grew sees its new partitions at its next
# metadata refresh (dwell.adapters.kafka.config.METADATA_REFRESH_MS), plus this margin.
REFRESH_MARGIN_MS = 5000


def test_partitions_added_under_load_are_written_and_read_with_nothing_lost(
        e2e: Dwell) -> None:
    """`update-partitioned-topic` from 2 to 4 partitions while immediate and delayed
    messages are published to x and an SDK subscription (started at the latest offsets)
    reads them: every message arrives once, none early, and admission (immediate ones),
    the drain (delayed ones) and the consumer all use the new partitions soon after."""
    tenant = new_tenant()
    x = TopicName.parse(f"persistent://{tenant}/ns/x")
    with httpx.Client(base_url=e2e.policy, timeout=10) as policy:
        make_namespace(policy, tenant)
        _ok(policy.put(f"/admin/v2/persistent/{tenant}/ns/x/partitions", json=2))
    c = consumer(e2e, str(x), "grow")  # registered before anything is published
    sent: dict[bytes, int | None] = {}  # payload -> deliverAt (None: immediate)
    written: dict[str, int] = {}  # admission's first write to a new partition, ms after
    got: dict[bytes, list[tuple[int, int]]] = {}  # payload -> [(received at, partition)]
    publishing = threading.Event()
    publishing.set()

    def receive() -> None:
        while publishing.is_set() or len(got) < len(sent):
            m = c.receive(0.5)
            if m is not None:
                got.setdefault(m.value, []).append((now_ms(), m.partition))
                c.acknowledge(m)
            elif not publishing.is_set() and time.monotonic() > give_up:
                return

    give_up = float("inf")
    reader = threading.Thread(target=receive, name="grow-reader")
    reader.start()
    start = now_ms()
    grown_at = 0
    try:
        with Producer(str(x), admission_url=e2e.admission) as p:
            n = 0
            while now_ms() - start < PUBLISH_S * 1000:
                if not grown_at and now_ms() - start >= GROW_AFTER_S * 1000:
                    with httpx.Client(base_url=e2e.policy, timeout=30) as policy:
                        _ok(policy.post(f"/admin/v2/persistent/{tenant}/ns/x/partitions",
                                        json=GROWN_TO))
                    grown_at = now_ms()
                payload = f"m{n}".encode()
                if n % 2:
                    due = sent[payload] = now_ms() + DELAY_MS
                    p.send(payload, deliver_at=due)
                else:
                    sent[payload] = None
                    mid = p.send(payload)
                    if grown_at and "immediate" not in written and \
                            int(mid.rsplit(":", 2)[1]) >= 2:
                        written["immediate"] = now_ms() - grown_at
                n += 1
                time.sleep(0.01)
    finally:
        give_up = time.monotonic() + DELAY_MS / 1000 + SPARK_MARGIN_MS / 1000 + 30
        publishing.clear()
        reader.join()
    while (m := c.receive(2.0)) is not None:  # anything more is a duplicate
        got.setdefault(m.value, []).append((now_ms(), m.partition))
    c.close()
    lost = sorted(set(sent) - set(got))
    duplicates = sum(len(v) - 1 for v in got.values())
    early = [k for k, v in got.items() if (due := sent.get(k)) and v[0][0] < due - TICK_MS]
    delayed_on_new = sorted(sent[k] - grown_at for k, v in got.items()  # type: ignore[operator]
                            if sent.get(k) and v[0][1] >= 2)
    read = min((v[0][0] - grown_at for v in got.values() if v[0][1] >= 2), default=None)
    print(f"partition growth 2 -> {GROWN_TO} under load: sent {len(sent)}, delivered "
          f"{len(got)}, lost {len(lost)}, early {len(early)}, duplicates {duplicates}; "
          f"ms from the growth to admission's first write to a new partition: "
          f"{written.get('immediate')}, to the due time of the first delayed message the "
          f"drain wrote to one: "
          f"{delayed_on_new[0] if delayed_on_new else None}, the first read from one: {read}")
    assert not lost, lost[:10]
    assert not early, early[:10]
    assert duplicates == 0
    bound = METADATA_REFRESH_MS + REFRESH_MARGIN_MS
    assert written.get("immediate") is not None and written["immediate"] <= bound, written
    assert delayed_on_new and delayed_on_new[0] <= DELAY_MS + bound, delayed_on_new[:3]
    assert read is not None and read <= bound, read
