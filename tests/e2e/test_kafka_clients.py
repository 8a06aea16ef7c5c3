"""The drained copies of delayed messages (written by the Spark app, not admission) are
readable by a bare kafka-python consumer with its default settings, next to the
immediate ones (tests/integration/test_kafka_clients.py reads those and the publish
results with each client)."""

from __future__ import annotations

import time

import httpx
import kafka as kafka_python

from dwell.core.topics import TopicName

from .conftest import Dwell, make_topic, new_tenant

COUNT = 5


def test_drained_messages_read_with_kafka_python_defaults(e2e: Dwell) -> None:
    topic = make_topic(e2e, new_tenant())
    _, rest = topic.split("://")
    messages = ([{"payload": f"now {i}", "key": f"now-{i}"} for i in range(COUNT)]
                + [{"payload": f"later {i}", "key": f"later-{i}", "deliverAfterMs": 1000}
                   for i in range(COUNT)])
    r = httpx.post(f"{e2e.admission}/topics/persistent/{rest}",
                   json={"producerName": "kp", "messages": messages}, timeout=30)
    assert r.status_code == 200, r.text
    assert [m["errorCode"] for m in r.json()["messagePublishResults"]] == [0] * (2 * COUNT)
    ready = TopicName.parse(topic).kafka_topic
    c = kafka_python.KafkaConsumer(bootstrap_servers=e2e.bootstrap)
    try:
        parts = [kafka_python.TopicPartition(ready, p)
                 for p in sorted(c.partitions_for_topic(ready) or ())]
        c.assign(parts)
        c.seek_to_beginning(*parts)
        got: dict[str, bytes] = {}
        deadline = time.monotonic() + 30
        while len(got) < 2 * COUNT and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                got |= {r.key.decode(): r.value for r in records if r.key}
    finally:
        c.close()
    assert got == {m["key"]: m["payload"].encode() for m in messages}
