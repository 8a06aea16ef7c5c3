"""The retention of what dwell relies on (real Kafka, real tracker): the delay logs and
`dwell.delivered` keep their records until dwell removes them, on topics dwell creates
and on topics an operator made with a retention of their own."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from confluent_kafka.admin import ConfigResource

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell.tracker.service import keep_logs
from dwell.tracker.settings import TrackerSettings

pytestmark = pytest.mark.integration


def _config(bootstrap: str, topic: str) -> dict[str, str]:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    client = kafka.admin(bootstrap)  # held until the answer comes
    entries = client.describe_configs([res])[res].result(15)
    return {k: e.value for k, e in entries.items()}


def _config_when(bootstrap: str, topic: str, ok: Callable[[dict[str, str]], bool],
                 timeout: float = 15.0) -> dict[str, str]:
    """The topic's config once ``ok`` holds of it (or the last one read): a broker answers
    DescribeConfigs from its metadata image, which applies a change a moment after the
    controller accepted it."""
    deadline = time.monotonic() + timeout
    while not ok(config := _config(bootstrap, topic)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return config


def _kept(config: dict[str, str]) -> bool:
    return all(config[k] == v for k, v in kafka.KEEP_UNTIL_DELIVERED.items())


def test_an_operators_short_retention_is_reset(kafka_bootstrap: str, unique: str) -> None:
    topic = f"dwell.delayed.{unique}"
    kafka.ensure_topic(kafka_bootstrap, topic, 4, config={
        "retention.ms": "30000", "segment.ms": "5000"})
    assert _config_when(kafka_bootstrap, topic,
                        lambda c: c["retention.ms"] == "30000")["retention.ms"] == "30000"
    assert kafka.ensure_retention(kafka_bootstrap, topic) == {"retention.ms": "-1"}
    config = _config_when(kafka_bootstrap, topic, _kept)
    assert _kept(config), config
    assert config["segment.ms"] == "5000"  # what does not drop records is left alone
    assert kafka.ensure_retention(kafka_bootstrap, topic) == {}


def test_the_tracker_resets_the_retention_of_its_logs(services, stack, unique: str) -> None:  # type: ignore[no-untyped-def]
    delayed, refiled = f"dwell.delayed.{unique}", f"dwell.delayed.{unique}.refiled"
    for t in (delayed, refiled):
        kafka.ensure_topic(stack.kafka_bootstrap, t, 4, config={
            "retention.ms": "30000", "cleanup.policy": "compact,delete"})
    svc = services.start("tracker", env={
        "DWELL_DELAYED_TOPIC": delayed, "DWELL_TRACKER_GROUP_ID": f"dwell-trk-{unique}",
        "DWELL_RESTAGE_ENABLED": "false"})
    try:
        for t in (delayed, refiled, "dwell.delivered"):
            config = _config_when(stack.kafka_bootstrap, t, _kept)
            assert _kept(config), (t, config)
    finally:
        svc.stop()


def test_dwells_own_topics_are_created_kept(kafka_bootstrap: str) -> None:
    kafka.ensure_dwell_topics(kafka_bootstrap)
    for t in kafka.KEPT_TOPICS:
        assert _kept(_config_when(kafka_bootstrap, t, _kept)), t
        assert kafka.DWELL_TOPIC_DEFAULTS[t][1] == kafka.KEPT_TOPIC_CONFIG


def test_an_existing_dwell_topic_keeps_its_partition_count(
        kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    """DWELL_ACKS_TOPIC_PARTITIONS (and DWELL_DELAYED_TOPIC_PARTITIONS) apply when dwell
    creates the topic; a start that sets another count for an existing one says so and
    leaves it: more partitions would move a subscription's events to another one."""
    has = kafka.partition_count(kafka_bootstrap, names.ACKS)
    with caplog.at_level(logging.WARNING, logger="dwell.adapters.kafka"):
        kafka.ensure_dwell_topics(kafka_bootstrap, partitions={names.ACKS: has + 2})
    assert kafka.partition_count(kafka_bootstrap, names.ACKS) == has
    assert (f"dwell.acks has {has} partitions, not the {has + 2} set: an existing topic "
            "keeps its count") in caplog.text


def test_the_tracker_makes_its_logs_with_hourly_segments(kafka_bootstrap: str,
                                                         unique: str) -> None:
    """Hourly segments, so that the trim's DeleteRecords gives disk back within the hour.
    The session's own dwell.delayed may carry a test's shorter segment.ms: fresh logs."""
    settings = TrackerSettings(kafka_bootstrap=kafka_bootstrap,  # type: ignore[call-arg]
                               delayed_topic=f"dwell.delayed.{unique}")
    keep_logs(settings)
    for t in (settings.delayed_topic, settings.refile_log):
        config = _config_when(kafka_bootstrap, t, lambda c: c["segment.ms"] == "3600000")
        assert _kept(config) and config["segment.ms"] == "3600000", (t, config)
