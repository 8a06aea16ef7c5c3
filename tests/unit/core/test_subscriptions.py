"""Subscription settings validation: Pulsar's builder messages, naming the field."""

from __future__ import annotations

import re

import pytest

from dwell.core.backoff import ExponentialRedeliveryBackoff
from dwell.core.subscriptions import SubscriptionSettings


def validate(body):
    return SubscriptionSettings.from_json(body).to_json()


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
    # Upper bounds: no due time computed from them overflows a signed 64-bit count.
    ({"ackTimeoutMs": 2**63 - 1}, "ackTimeoutMs: Ack timeout should be at most 3153600000000"),
    ({"ackTimeoutRedeliveryBackoff": {"maxDelayMs": 2**62}},
     "ackTimeoutRedeliveryBackoff: maxDelayMs must be at most 3153600000000 (100 years)"),
    ({"negativeAckRedeliveryBackoff": {"multiplier": 1001}},
     "negativeAckRedeliveryBackoff: multiplier must be at most 1000"),
    ({"maxRedeliverCount": 2**31}, f"maxRedeliverCount: must be at most {2**31 - 1}"),
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


def test_json_round_trip_and_the_sdk_shape():
    full = SubscriptionSettings(1000, ExponentialRedeliveryBackoff(100, 1000, 3.0), None, 2)
    assert SubscriptionSettings.from_json(full.to_json()) == full
    assert full.to_json(omit_unset=True) == {
        "ackTimeoutMs": 1000, "maxRedeliverCount": 2,
        "ackTimeoutRedeliveryBackoff": {"minDelayMs": 100, "maxDelayMs": 1000, "multiplier": 3.0}}
    assert SubscriptionSettings().to_json(omit_unset=True) == {"ackTimeoutMs": 0}


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"ack_timeout_ms": 999}, "ackTimeoutMs: Ack timeout should be 0 (off) or at least 1000 ms"),
    ({"max_redeliver_count": 0}, "maxRedeliverCount: MaxRedeliverCount must be > 0."),
])
def test_direct_construction_is_checked_too(kwargs, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        SubscriptionSettings(**kwargs)
