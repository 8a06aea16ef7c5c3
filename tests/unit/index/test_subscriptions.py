"""Subscription settings validation: Pulsar's builder messages, naming the field."""

from __future__ import annotations

import pytest

from dwell.index.subscriptions import validate


@pytest.mark.parametrize(("body", "reason"), [
    ([], "body: must be a JSON object"),
    ({"ackTimeoutMs": 999}, "ackTimeoutMs: Ack timeout should be 0 (off) or at least 1000 ms"),
    ({"ackTimeoutMs": True}, "ackTimeoutMs: must be a non-negative integer"),
    ({"ackTimeoutRedeliveryBackoff": {"minDelayMs": -5}},
     "ackTimeoutRedeliveryBackoff: min delay time must be >= 0"),
    ({"ackTimeoutRedeliveryBackoff": {"minDelayMs": 10, "maxDelayMs": 5}},
     "ackTimeoutRedeliveryBackoff: maxDelayMs must be >= minDelayMs"),
    ({"negativeAckRedeliveryBackoff": {"multiplier": 0.5}},
     "negativeAckRedeliveryBackoff: multiplier must be > 1"),
    ({"negativeAckRedeliveryBackoff": {"minDelay": 5}},
     "negativeAckRedeliveryBackoff: unknown field 'minDelay'"),
    ({"maxRedeliverCount": -1}, "maxRedeliverCount: MaxRedeliverCount must be > 0."),
    ({"maxRedeliverCount": 1.5}, "maxRedeliverCount: must be an integer"),
    ({"ackTimeout": 1}, "ackTimeout: unknown field"),
])
def test_rejections_name_the_field(body, reason):
    with pytest.raises(ValueError) as exc:
        validate(body)
    assert str(exc.value).startswith(reason)


def test_defaults_and_normalization():
    assert validate({}) == {"ackTimeoutMs": 0, "ackTimeoutRedeliveryBackoff": None,
                            "negativeAckRedeliveryBackoff": None, "maxRedeliverCount": None}
    got = validate({"ackTimeoutMs": 1000, "ackTimeoutRedeliveryBackoff": {"minDelayMs": 1000},
                    "maxRedeliverCount": 5})
    assert got["ackTimeoutRedeliveryBackoff"] == {"minDelayMs": 1000, "maxDelayMs": 600000,
                                                  "multiplier": 2.0}
    assert got["maxRedeliverCount"] == 5
