"""The retention rule: which settings of a topic dwell relies on could drop pending
messages, and the refusal a process gives when it cannot change them."""

from __future__ import annotations

import pytest

from dwell.adapters.kafka import KEEP_UNTIL_DELIVERED, retention_refusal, retention_risks

KEPT = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


@pytest.mark.parametrize(("config", "risks"), [
    (KEPT, {}),
    (KEPT | {"segment.ms": "5000"}, {}),
    # A stock broker's default: 7 days.
    (KEPT | {"retention.ms": "604800000"}, {"retention.ms": "-1"}),
    (KEPT | {"retention.bytes": "1073741824"}, {"retention.bytes": "-1"}),
    # Compaction keeps one record per Pulsar topic (the key).
    (KEPT | {"cleanup.policy": "compact,delete"}, {"cleanup.policy": "delete"}),
    (KEPT | {"cleanup.policy": "compact"}, {"cleanup.policy": "delete"}),
    # A setting Kafka did not show is not taken as safe.
    ({}, KEEP_UNTIL_DELIVERED),
])
def test_retention_risks(config: dict[str, str], risks: dict[str, str]) -> None:
    assert retention_risks(config) == risks


def test_refusal_names_the_topic_the_setting_and_the_fix() -> None:
    config = KEPT | {"retention.ms": "30000"}
    msg = retention_refusal("dwell.delayed", config, retention_risks(config),
                            "TOPIC_AUTHORIZATION_FAILED")
    assert msg.startswith("topic dwell.delayed has retention.ms=30000, which could drop "
                          "pending messages")
    assert "(TOPIC_AUTHORIZATION_FAILED)" in msg
    assert "set retention.ms=-1 on dwell.delayed" in msg
    assert "ALTER_CONFIGS" in msg
