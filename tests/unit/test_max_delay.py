"""The broker-wide delay limit (DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS): the publish rule
at and one past it, at the int64 limits, under a policy's own max and fixed delay; the
setting's bounds; and the policy check that refuses a max or fixed delay past it."""

from __future__ import annotations

import pydantic
import pytest

from dwell.core.admit import DELAY_LIMIT_MS, Accept, Override, Reject, admit, over_delay_limit
from dwell.core.backoff import MAX_DELAY_MS
from dwell.core.invalid import MAX_TS_MS
from dwell.core.policy import MAX_LONG, DelayedDeliveryPolicies, EffectivePolicy
from dwell.settings import CommonSettings

T0 = 1_700_000_000_000
ON = EffectivePolicy(active=True, tick_time_ms=1000, max_delay_ms=0, fixed_delay_ms=0)
YEAR_MS = 365 * 86_400_000


def run(deliver_at: int | None = None, deliver_after_ms: int | None = None,
        policy: EffectivePolicy = ON, limit: int = DELAY_LIMIT_MS) -> Accept | Override | Reject:
    return admit(deliver_at=deliver_at, deliver_after_ms=deliver_after_ms, policy=policy,
                 persistent=True, publish_time=T0, now=T0, delay_limit_ms=limit)


def test_the_limit_is_a_century_and_keeps_due_times_inside_what_the_index_holds() -> None:
    assert DELAY_LIMIT_MS == 100 * YEAR_MS == MAX_DELAY_MS
    # Even from the last day dwell's ack path accepts, a due time at the limit stays
    # below the end of year 9999 plus a century, and far below 2**53 (ZSET scores).
    assert MAX_TS_MS + DELAY_LIMIT_MS < 2**53


@pytest.mark.parametrize("field", ["deliver_at", "deliver_after_ms"])
def test_a_delay_at_the_limit_is_accepted_and_one_past_it_rejected(field: str) -> None:
    at = {"deliver_at": T0 + DELAY_LIMIT_MS, "deliver_after_ms": DELAY_LIMIT_MS}[field]
    assert run(**{field: at}) == Accept(T0 + DELAY_LIMIT_MS, True)
    got = run(**{field: at + 1})
    assert got == Reject.exceeding(DELAY_LIMIT_MS)
    assert got.full_error == (
        "org.apache.pulsar.broker.service.BrokerServiceException$NotAllowedException: "
        f"Exceeds max allowed delivery delay of {DELAY_LIMIT_MS} milliseconds")


@pytest.mark.parametrize(("deliver_at", "deliver_after_ms"), [
    (MAX_LONG, None), (None, MAX_LONG), (MAX_LONG, MAX_LONG), (MAX_LONG - 1, None),
    (2**53, None), (MAX_TS_MS, None), (None, MAX_LONG - T0 + 1)])
def test_delays_at_the_int64_limits_are_rejected(deliver_at: int | None,
                                                  deliver_after_ms: int | None) -> None:
    assert run(deliver_at, deliver_after_ms) == Reject.exceeding(DELAY_LIMIT_MS)


def test_a_lower_limit_is_applied_exactly() -> None:
    assert run(deliver_after_ms=60_000, limit=60_000) == Accept(T0 + 60_000, True)
    assert run(deliver_after_ms=60_001, limit=60_000) == Reject.exceeding(60_000)
    # A time in the past is no delay at all.
    assert run(deliver_at=0, limit=1) == Accept(0, False)


def test_the_smaller_of_the_policys_max_and_the_limit_is_named() -> None:
    max5 = EffectivePolicy(active=True, tick_time_ms=1000, max_delay_ms=5000, fixed_delay_ms=0)
    assert run(deliver_after_ms=5001, policy=max5, limit=60_000) == Reject.exceeding(5000)
    # A max stored before the limit was lowered does not lift it.
    big = EffectivePolicy(active=True, tick_time_ms=1000, max_delay_ms=MAX_LONG,
                          fixed_delay_ms=0)
    assert run(deliver_after_ms=60_001, policy=big, limit=60_000) == Reject.exceeding(60_000)
    assert run(deliver_after_ms=60_000, policy=big, limit=60_000) == Accept(T0 + 60_000, True)


def test_a_fixed_delay_past_the_limit_is_rejected_not_accepted() -> None:
    def fixed(ms: int) -> EffectivePolicy:
        return EffectivePolicy(active=True, tick_time_ms=1000, max_delay_ms=0,
                               fixed_delay_ms=ms)

    assert run(policy=fixed(60_000), limit=60_000) == Override(T0 + 60_000, None, True)
    assert run(policy=fixed(60_001), limit=60_000) == Reject.exceeding(60_000)
    assert run(deliver_after_ms=1, policy=fixed(MAX_LONG)) == Reject.exceeding(DELAY_LIMIT_MS)


def test_delays_that_are_ignored_are_not_checked() -> None:
    off = EffectivePolicy(active=False, tick_time_ms=1000, max_delay_ms=0, fixed_delay_ms=0)
    assert run(deliver_at=MAX_LONG, policy=off).__class__ is Accept
    got = admit(deliver_at=MAX_LONG, deliver_after_ms=None, policy=ON, persistent=False,
                publish_time=T0, now=T0)
    assert type(got) is Accept and not got.delayed


@pytest.mark.parametrize(("field", "value", "refused"), [
    ("maxDeliveryDelayInMillis", DELAY_LIMIT_MS, False),
    ("maxDeliveryDelayInMillis", DELAY_LIMIT_MS + 1, False),
    ("maxDeliveryDelayInMillis", MAX_LONG, False),
    ("fixedDeliveryDelayInMillis", DELAY_LIMIT_MS, False),
    ("fixedDeliveryDelayInMillis", DELAY_LIMIT_MS + 1, True),
    ("fixedDeliveryDelayInMillis", MAX_LONG, True),
    ("tickTime", MAX_LONG, False)])
def test_a_policy_past_the_limit_is_refused_naming_field_and_limit(field: str, value: int,
                                                                  refused: bool) -> None:
    reason = over_delay_limit(DelayedDeliveryPolicies(**{field: value}), DELAY_LIMIT_MS)
    if not refused:
        assert reason is None
        return
    assert reason == (f"{field}: {value} is more than the longest delay dwell accepts, "
                      f"{DELAY_LIMIT_MS} ms (DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS)")


def test_the_setting_has_bounds_and_holds_the_broker_defaults_within_it() -> None:
    assert CommonSettings().delayed_delivery_delay_limit_ms == DELAY_LIMIT_MS
    assert CommonSettings(delayed_delivery_delay_limit_ms=60_000).delayed_delivery_delay_limit_ms \
        == 60_000
    for bad in (0, DELAY_LIMIT_MS + 1, MAX_LONG):
        with pytest.raises(pydantic.ValidationError):
            CommonSettings(delayed_delivery_delay_limit_ms=bad)
    # A max past the limit is harmless (the limit caps each message); a fixed one is not.
    CommonSettings(delayed_delivery_max_delay_ms=60_001, delayed_delivery_delay_limit_ms=60_000)
    CommonSettings(delayed_delivery_fixed_delay_ms=60_000, delayed_delivery_delay_limit_ms=60_000)
    with pytest.raises(pydantic.ValidationError, match="DELAY_LIMIT_MS"):
        CommonSettings(delayed_delivery_fixed_delay_ms=60_001,
                       delayed_delivery_delay_limit_ms=60_000)
