import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwell.core.admit import (
    DISABLED_REASON,
    NON_PERSISTENT_REASON,
    Accept,
    Decision,
    Override,
    Reject,
    admit,
)
from dwell.core.policy import EffectivePolicy

T0 = 1_700_000_000_000  # publish time
NOW = T0 + 10  # admission sees the message shortly after the producer stamped it

ON = EffectivePolicy(active=True, tick_time_ms=1000, max_delay_ms=0, fixed_delay_ms=0)
OFF = EffectivePolicy(active=False, tick_time_ms=1000, max_delay_ms=5000, fixed_delay_ms=3000)
MAX5 = EffectivePolicy(active=True, tick_time_ms=1000, max_delay_ms=5000, fixed_delay_ms=0)
FIX3 = EffectivePolicy(active=True, tick_time_ms=1000, max_delay_ms=5000, fixed_delay_ms=3000)


def run(
    deliver_at: int | None = None,
    deliver_after_ms: int | None = None,
    policy: EffectivePolicy = ON,
    persistent: bool = True,
    strict: bool = False,
    now: int = NOW,
) -> Decision:
    return admit(
        deliver_at=deliver_at,
        deliver_after_ms=deliver_after_ms,
        policy=policy,
        persistent=persistent,
        publish_time=T0,
        now=now,
        strict=strict,
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # no delay requested
        ({}, Accept(None, False)),
        # plain delayed message
        ({"deliver_at": T0 + 60_000}, Accept(T0 + 60_000, True)),
        ({"deliver_after_ms": 60_000}, Accept(T0 + 60_000, True)),
        # deliver_at wins over deliver_after_ms
        ({"deliver_at": T0 + 20_000, "deliver_after_ms": 60_000}, Accept(T0 + 20_000, True)),
        # past or within the tick cutoff: delivered at once, deliver_at kept
        ({"deliver_at": T0 - 5}, Accept(T0 - 5, False)),
        ({"deliver_at": -1}, Accept(-1, False)),
        ({"deliver_at": NOW + 1000}, Accept(NOW + 1000, False)),
        ({"deliver_at": NOW + 1001}, Accept(NOW + 1001, True)),
        # strict: cutoff is now itself
        ({"deliver_at": NOW, "strict": True}, Accept(NOW, False)),
        ({"deliver_at": NOW + 1, "strict": True}, Accept(NOW + 1, True)),
        # non-persistent: never delayed, the producer is told why
        (
            {"deliver_at": T0 + 60_000, "persistent": False},
            Accept(None, False, NON_PERSISTENT_REASON),
        ),
        ({"deliver_after_ms": 1, "persistent": False}, Accept(None, False, NON_PERSISTENT_REASON)),
        ({"persistent": False}, Accept(None, False)),
        ({"persistent": False, "policy": FIX3}, Accept(None, False)),
        # disabled: same, with its own reason, even with max and fixed set
        ({"deliver_at": T0 + 60_000, "policy": OFF}, Accept(None, False, DISABLED_REASON)),
        ({"policy": OFF}, Accept(None, False)),
        # max delay (PIP-315): strictly greater is rejected, equal is accepted
        ({"deliver_at": T0 + 5000, "policy": MAX5}, Accept(T0 + 5000, True)),
        ({"deliver_at": T0 + 5001, "policy": MAX5}, Reject.exceeding(5000)),
        ({"deliver_after_ms": 5001, "policy": MAX5}, Reject.exceeding(5000)),
        ({"deliver_after_ms": 5000, "policy": MAX5}, Accept(T0 + 5000, True)),
        ({"policy": MAX5}, Accept(None, False)),
        # measured from publish time, not now: a late-arriving message is still judged fairly
        ({"deliver_at": T0 + 5000, "policy": MAX5, "now": T0 + 4000}, Accept(T0 + 5000, False)),
        # fixed delay (PIP-437): every message, client's value replaced, max skipped
        ({"policy": FIX3}, Override(T0 + 3000, None, True)),
        ({"deliver_at": T0 + 999_999, "policy": FIX3}, Override(T0 + 3000, T0 + 999_999, True)),
        ({"deliver_after_ms": 10, "policy": FIX3}, Override(T0 + 3000, T0 + 10, True)),
        (
            {"deliver_at": T0 + 60_000, "policy": FIX3, "now": T0 + 2500},
            Override(T0 + 3000, T0 + 60_000, False),
        ),
    ],
)
def test_admit_table(kwargs: dict[str, object], expected: Decision) -> None:
    assert run(**kwargs) == expected  # type: ignore[arg-type]


def test_reject_texts() -> None:
    r = Reject.exceeding(5000)
    assert r.error == "Exceeds max allowed delivery delay of 5000 milliseconds"
    assert (
        r.full_error == "org.apache.pulsar.broker.service.BrokerServiceException$"
        "NotAllowedException: Exceeds max allowed delivery delay of 5000 milliseconds"
    )
    assert r.error_code == 2
    assert Reject.error_code == 2


def test_override_counts_only_requested() -> None:
    assert Override(1, 5, True).counts_as_override
    assert not Override(1, None, True).counts_as_override


_policies = st.builds(
    EffectivePolicy,
    active=st.booleans(),
    tick_time_ms=st.integers(min_value=1, max_value=10**6),
    max_delay_ms=st.integers(min_value=0, max_value=10**9),
    fixed_delay_ms=st.integers(min_value=0, max_value=10**9),
)
_times = st.integers(min_value=-(10**12), max_value=10**13)
_maybe_time = st.none() | _times
_maybe_after = st.none() | st.integers(min_value=0, max_value=10**12)


@given(_maybe_time, _maybe_after, _policies, st.booleans(), _times, _times, st.booleans())
def test_admit_properties(
    deliver_at: int | None,
    deliver_after_ms: int | None,
    policy: EffectivePolicy,
    persistent: bool,
    publish_time: int,
    now: int,
    strict: bool,
) -> None:
    d = admit(
        deliver_at=deliver_at,
        deliver_after_ms=deliver_after_ms,
        policy=policy,
        persistent=persistent,
        publish_time=publish_time,
        now=now,
        strict=strict,
    )
    requested = (
        deliver_at
        if deliver_at is not None
        else (None if deliver_after_ms is None else publish_time + deliver_after_ms)
    )
    if policy.max_delay_ms == 0 or policy.fixed_delay_ms > 0 or not policy.active:
        assert not isinstance(d, Reject)
    if not persistent or not policy.active:
        assert isinstance(d, Accept)
        assert d.deliver_at is None and not d.delayed
        assert (d.delay_ignored is not None) == (requested is not None)
        return
    if policy.fixed_delay_ms > 0:
        assert isinstance(d, Override)
        assert d.deliver_at == publish_time + policy.fixed_delay_ms
        assert d.requested_deliver_at == requested
    if isinstance(d, Reject):
        assert requested is not None
        assert requested - publish_time > policy.max_delay_ms > 0
        return
    cutoff = now if strict else now + policy.tick_time_ms
    assert d.delayed == (d.deliver_at is not None and d.deliver_at > cutoff)
    if strict and d.delayed:
        assert d.deliver_at is not None and d.deliver_at > now
