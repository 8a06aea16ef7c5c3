"""A truncated delay log (real Redis, Kafka and Spark local): when the records of pending
positions are really gone (an operator's DeleteRecords), the drain reports them once as
lost (a counter per topic and a log line with the topic and count), takes them out, and
delivers the others, instead of retrying the topic for ever."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell.index.topic import TopicIndex
from dwell_dev import devstack
from dwell_dev.testkit import local_spark
from dwell_spark import metrics
from dwell_spark.drain import Drainer
from dwell_spark.settings import SparkSettings

pytestmark = pytest.mark.integration

DB = 4


@pytest.fixture(scope="module")
def spark_env(stack: devstack.Stack, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[object, SparkSettings, object]]:
    with local_spark(stack, DB, tmp_path_factory.mktemp("ck")) as env:
        yield env


def _lost(topic: str) -> float:
    return metrics.REGISTRY.get_sample_value("dwell_messages_lost_total",
                                            {"topic": topic}) or 0.0


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_records_deleted_under_pending_positions_are_reported_lost_once(
        spark_env, unique: str, path: str, caplog: pytest.LogCaptureFixture) -> None:
    spark, settings, r = spark_env
    topic = f"persistent://{unique}/ns/x"
    ready = TopicName.parse(topic).kafka_topic
    kafka.ensure_topic(settings.kafka_bootstrap, ready, 1)
    p = kafka.Producer(settings.kafka_bootstrap)
    now = int(time.time() * 1000)
    positions = [p.send(names.DELAYED, f"m{i}".encode(), key=topic, headers={
        "dwell-topic": topic, "dwell-deliver-at": str(now - 10),
        "dwell-tick-time": "1000"}).result(10) for i in range(10)]
    p.close()
    (part,) = {pt for pt, _ in positions}
    TopicIndex(r, topic).add([(pt, off, now - 10, 1000) for pt, off in positions])
    # An operator deletes the first six records under the pending positions.
    cut = positions[6][1]
    assert kafka.delete_below(settings.kafka_bootstrap, {(names.DELAYED, part): cut})
    drainer = Drainer(spark, settings, r)
    with caplog.at_level(logging.ERROR, logger="dwell.spark.drain"):
        assert drainer.run_once(now, path=path) == 4
    assert _lost(topic) == 6
    assert f"topic {topic}: 6 pending messages lost" in caplog.text
    got = sorted(rec.value for rec in kafka.read_all(settings.kafka_bootstrap, ready))
    assert got == [b"m6", b"m7", b"m8", b"m9"]
    # Reported once: the positions are out of the index, nothing is retried.
    assert TopicIndex(r, topic).buckets() == []
    assert drainer.run_once(now + 5000, path=path) == 0
    assert _lost(topic) == 6 and drainer.failing == {}
