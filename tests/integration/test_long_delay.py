"""The issue's experiment, for real (Redis, Kafka, the tracker process, the drain on Spark
local): `dwell.delayed` set by an operator to a retention far below the messages' delay,
with segments rolling under a trickle of short delays. dwell resets the retention when
the tracker starts, every long-delayed message is delivered when due and none before,
and once they are delivered the log's start offsets move up (the trim gives the space
back). The delay outlasts the retention plus the broker's retention check (every 10 s on
the local stack): without the reset, the broker would delete the messages before they
are due."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell.tracker import recovery
from dwell_dev import devstack
from dwell_dev.testkit import configure_topic, local_spark, topic_config, wait_for
from dwell_spark.drain import Drainer

pytestmark = pytest.mark.integration

DB = 15
RETENTION_MS = 30_000
SEGMENT_MS = 5_000
# Past the retention, a segment roll and the broker's retention check interval.
LONG_DELAY_MS = 90_000
LONG = 50


@pytest.fixture()
def drainer(stack: devstack.Stack, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Drainer, str]]:
    with local_spark(stack, DB, tmp_path_factory.mktemp("ck")) as (spark, settings, r):
        yield Drainer(spark, settings, r), settings.redis_url


def _ready_count(bootstrap: str, ready: str, prefix: bytes) -> int:
    return sum(1 for rec in kafka.read_all(bootstrap, ready) if rec.value.startswith(prefix))


def test_messages_due_after_the_retention_are_all_delivered(services, stack, drainer,
                                                            unique: str) -> None:
    drain, redis_url = drainer
    bootstrap = stack.kafka_bootstrap
    kafka.ensure_topic(bootstrap, names.DELAYED, 4)
    configure_topic(bootstrap, names.DELAYED, {"retention.ms": str(RETENTION_MS),
                                               "segment.ms": str(SEGMENT_MS)})
    group = f"dwell-trk-{unique}"
    recovery.start_group_at_end(bootstrap, group, [names.DELAYED, names.REFILED])
    tracker = services.start("tracker", env={
        "DWELL_REDIS_URL": redis_url, "DWELL_TRACKER_GROUP_ID": group,
        "DWELL_RESTAGE_ENABLED": "false", "DWELL_LOWMARK_INTERVAL_MS": "500",
        "DWELL_TRIM_INTERVAL_MS": "1000", "DWELL_TRIM_KEEP_DELIVERED_MS": "0"})
    try:
        config = topic_config(bootstrap, names.DELAYED)
        assert (config["retention.ms"], config["retention.bytes"]) == ("-1", "-1")
        assert config["segment.ms"] == str(SEGMENT_MS)

        topic = f"persistent://{unique}/ns/long"
        ready = TopicName.parse(topic).kafka_topic
        kafka.ensure_topic(bootstrap, ready, 1)
        p = kafka.Producer(bootstrap)

        def send(payload: bytes, at: int) -> tuple[int, int]:
            # One key, one partition: the trickle rolls the long messages' segments.
            return p.send(names.DELAYED, payload, key=topic, headers={
                "dwell-topic": topic, "dwell-publish-time": str(int(time.time() * 1000)),
                "dwell-deliver-at": str(at), "dwell-tick-time": "1000"}).result(15)

        due = int(time.time() * 1000) + LONG_DELAY_MS
        long_positions = [send(f"long-{i}".encode(), due) for i in range(LONG)]
        (part,) = {pt for pt, _ in long_positions}
        starts_before = kafka.offsets_at(bootstrap, names.DELAYED, 0)
        print(f"\n{names.DELAYED} start offsets at publish: {starts_before}")
        shorts = 0
        while time.time() * 1000 < due - 5000:
            send(f"short-{shorts}".encode(), int(time.time() * 1000) + 1000)
            shorts += 1
            drain.run_once()
            time.sleep(1.0)
        # None early: 5 s before they are due, not one long message is out.
        assert _ready_count(bootstrap, ready, b"long-") == 0
        deadline = due + 60_000
        while time.time() * 1000 < deadline and _ready_count(bootstrap, ready, b"long-") < LONG:
            drain.run_once()
            time.sleep(0.5)
        got = sorted(rec.value for rec in kafka.read_all(bootstrap, ready)
                     if rec.value.startswith(b"long-"))
        # Every one delivered. The ready topic is at least once (a round that fails after
        # its copy is claimed again; the SDK drops what it has seen): copies are counted.
        assert sorted(set(got)) == sorted(f"long-{i}".encode() for i in range(LONG))
        print(f"{LONG} long messages delivered, {len(got) - LONG} copies more on the ready "
              "topic")
        assert _ready_count(bootstrap, ready, b"short-") >= shorts - 2
        p.close()

        last_long = max(off for _, off in long_positions)
        wait_for(lambda: kafka.offsets_at(bootstrap, names.DELAYED, 0)[part] > last_long, 60,
                 "the delay log's start past the delivered messages")
        starts_after = kafka.offsets_at(bootstrap, names.DELAYED, 0)
        print(f"{names.DELAYED} start offsets after the drain: {starts_after} "
              f"(end offsets {kafka.end_offsets(bootstrap, names.DELAYED)})")
    finally:
        tracker.stop()
