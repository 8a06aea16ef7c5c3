"""The topics users read, read by the clients users have, with their default settings:
a bare `pip install kafka-python` (no lz4, snappy or zstd libraries: the dev extra pins
it without extras) and confluent-kafka. Messages published over HTTP land on the ready
topic; requests a kafka-python producer sends to `dwell.publish` get their results on
`dwell.publish.results`. Both are read with each client's defaults, and with
read_committed (which dwell's readers use: the Kafka ingress writes in transactions).
The drained copies of delayed messages are read the same way in
tests/e2e/test_kafka_clients.py."""

from __future__ import annotations

import time
import uuid
from typing import Any

import confluent_kafka
import httpx
import kafka as kafka_python
import orjson
import pytest

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell_dev.testkit import make_namespace, ok

pytestmark = pytest.mark.integration

COUNT = 20


Read = list[tuple[bytes | None, bytes]]


def read_kafka_python(bootstrap: str, topic: str, want: int, key: bytes | None,
                      starts: dict[int, int], **conf: Any) -> Read:
    """(key, value) of `want` records of `topic` (those keyed `key` when it is given),
    read by a kafka-python consumer with its defaults (plus `conf`) from `starts` (the
    beginning of partitions it does not name); fewer after 30 s."""
    c = kafka_python.KafkaConsumer(bootstrap_servers=bootstrap, **conf)
    try:
        parts = [kafka_python.TopicPartition(topic, p)
                 for p in sorted(c.partitions_for_topic(topic) or ())]
        assert parts, f"kafka-python sees no partitions of {topic}"
        c.assign(parts)
        c.seek_to_beginning(*parts)
        for tp in parts:
            if tp.partition in starts:
                c.seek(tp, starts[tp.partition])
        got: Read = []
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                got += [(r.key, r.value) for r in records if key in (None, r.key)]
        return got
    finally:
        c.close()


def read_confluent(bootstrap: str, topic: str, want: int, key: bytes | None,
                   starts: dict[int, int], **conf: Any) -> Read:
    """The same with confluent-kafka's defaults (a group id is required; nothing is
    committed under it)."""
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": f"test-{uuid.uuid4().hex}", **conf})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        c.assign([confluent_kafka.TopicPartition(
            topic, p, starts.get(p, confluent_kafka.OFFSET_BEGINNING)) for p in md.partitions])
        got: Read = []
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(100, 0.5):
                assert m.error() is None, m.error()
                if key in (None, m.key()):
                    got.append((m.key(), m.value()))
        return got
    finally:
        c.close()


READERS = {
    "kafka-python": lambda *a: read_kafka_python(*a),
    "kafka-python read_committed":
        lambda *a: read_kafka_python(*a, isolation_level="read_committed"),
    "confluent-kafka": lambda *a: read_confluent(*a),
    "confluent-kafka read_committed":
        lambda *a: read_confluent(*a, **{"isolation.level": "read_committed"}),
}


@pytest.mark.parametrize("reader", READERS)
def test_the_ready_topic_reads_with_default_settings(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str, unique: str,
        reader: str) -> None:
    make_namespace(policy, unique)
    topic = TopicName.parse(f"persistent://{unique}/ns/orders")
    sent = [(f"k{i}".encode(), f"payload {i} ".encode() * 20) for i in range(COUNT)]
    ok(admission.post(f"/topics/persistent/{unique}/ns/orders", json={"messages": [
        {"payload": v.decode(), "key": k.decode()} for k, v in sent]}))
    got = READERS[reader](kafka_bootstrap, topic.kafka_topic, COUNT, None, {})
    assert sorted(got) == sorted(sent)


@pytest.mark.parametrize("reader", READERS)
def test_publish_results_read_with_default_settings(
        policy: httpx.Client, admission: httpx.Client, kafka_bootstrap: str, unique: str,
        reader: str) -> None:
    make_namespace(policy, unique)
    topic = f"persistent://{unique}/ns/orders"
    name = f"kp-{uuid.uuid4().hex[:8]}"
    # The results topic is shared: read from where it ends now.
    ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    # The producer side of a Kafka-integrated user: kafka-python, defaults too.
    p = kafka_python.KafkaProducer(bootstrap_servers=kafka_bootstrap)
    try:
        p.send(names.PUBLISH, key=topic.encode(), value=orjson.dumps({
            "producerName": name, "topic": topic,
            "messages": [{"payload": f"m{i}", "sequenceId": i} for i in range(COUNT)]}))
        p.flush(30)
    finally:
        p.close()
    got = READERS[reader](kafka_bootstrap, names.PUBLISH_RESULTS, COUNT, name.encode(), ends)
    mine = [orjson.loads(v) for _, v in got]
    assert sorted(r["sequenceId"] for r in mine) == list(range(COUNT))
    assert all(r["errorCode"] == 0 for r in mine), mine[:2]
