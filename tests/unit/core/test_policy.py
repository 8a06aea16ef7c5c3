import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwell.core.policy import (
    MAX_LONG,
    BrokerDefaults,
    DelayedDeliveryPolicies,
    EffectivePolicy,
    bundles,
    pulsar_policies,
    resolve_policy,
)
from dwell.http import validation_reason

P = DelayedDeliveryPolicies


def errors_for(body: str) -> str:
    with pytest.raises(pydantic.ValidationError) as exc:
        P.model_validate_json(body)
    return validation_reason(exc.value)


# --- validation ------------------------------------------------------------------------


def test_accepts_full_pulsar_body() -> None:
    p = P.model_validate_json(
        '{"active": true, "tickTime": 1000, "maxDeliveryDelayInMillis": 5000,'
        ' "fixedDeliveryDelayInMillis": 0}'
    )
    assert p == P(
        active=True, tickTime=1000, maxDeliveryDelayInMillis=5000, fixedDeliveryDelayInMillis=0
    )


def test_null_means_unset() -> None:
    assert P.model_validate_json('{"tickTime": null}') == P()
    assert P(active=False) != P()


def test_limits_accepted() -> None:
    p = P.model_validate_json(f'{{"tickTime": 1, "maxDeliveryDelayInMillis": {MAX_LONG}}}')
    assert p.tickTime == 1
    assert p.maxDeliveryDelayInMillis == MAX_LONG


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"tickTime": 0}', "tickTime: must be >= 1"),
        ('{"tickTime": -5}', "tickTime: must be >= 1"),
        ('{"maxDeliveryDelayInMillis": -1}', "maxDeliveryDelayInMillis: must be >= 0"),
        ('{"fixedDeliveryDelayInMillis": -1}', "fixedDeliveryDelayInMillis: must be >= 0"),
        (
            f'{{"maxDeliveryDelayInMillis": {MAX_LONG + 1}}}',
            f"maxDeliveryDelayInMillis: must be <= {MAX_LONG}",
        ),
        ('{"tickTime": "5000"}', "tickTime: must be an integer"),
        ('{"tickTime": 5.0}', "tickTime: must be an integer"),
        ('{"tickTime": 5.5}', "tickTime: must be an integer"),
        ('{"tickTime": true}', "tickTime: must be an integer"),
        ('{"maxDeliveryDelayInMillis": false}', "maxDeliveryDelayInMillis: must be an integer"),
        ('{"active": "true"}', "active: must be true or false"),
        ('{"active": 1}', "active: must be true or false"),
        ('{"maxDelay": 5}', "maxDelay: unknown field"),
        ("[]", "body: must be a JSON object"),
        ("{", "body: is not valid JSON"),
        (
            '{"tickTime": 0, "maxDeliveryDelayInMillis": "x"}',
            "tickTime: must be >= 1; maxDeliveryDelayInMillis: must be an integer",
        ),
    ],
)
def test_rejects_with_one_line_naming_the_field(body: str, expected: str) -> None:
    assert errors_for(body) == expected


@pytest.mark.parametrize("value", [True, 5.0, "5"])
def test_python_values_are_strict_too(value: object) -> None:
    with pytest.raises(pydantic.ValidationError) as exc:
        P.model_validate({"tickTime": value})
    assert validation_reason(exc.value) == "tickTime: must be an integer"


# --- defaults and effective policy -----------------------------------------------------


def test_broker_defaults_match_broker_conf() -> None:
    b = BrokerDefaults()
    assert (
        b.enabled,
        b.tick_time_ms,
        b.max_delay_ms,
        b.fixed_delay_ms,
        b.strict,
        b.fixed_delay_detection_lookahead,
    ) == (True, 1000, 0, 0, False, 50000)


@pytest.mark.parametrize(
    "kwargs", [{"tick_time_ms": 0}, {"max_delay_ms": -1}, {"fixed_delay_ms": -1}]
)
def test_broker_defaults_validate(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        BrokerDefaults(**kwargs)  # type: ignore[arg-type]


def test_to_pulsar_json() -> None:
    assert EffectivePolicy(True, 1000, 5000, 0).to_pulsar_json() == {
        "active": True,
        "tickTime": 1000,
        "maxDeliveryDelayInMillis": 5000,
        "fixedDeliveryDelayInMillis": 0,
    }


# --- resolution ------------------------------------------------------------------------

BROKER = BrokerDefaults(enabled=True, tick_time_ms=1000, max_delay_ms=60_000, fixed_delay_ms=0)


@pytest.mark.parametrize(
    ("namespace", "topic", "expected"),
    [
        (None, None, EffectivePolicy(True, 1000, 60_000, 0)),
        (P(), P(), EffectivePolicy(True, 1000, 60_000, 0)),
        # Pulsar would store max=0 here and lift the broker limit; dwell inherits it.
        (P(active=True, tickTime=500), None, EffectivePolicy(True, 500, 60_000, 0)),
        (P(maxDeliveryDelayInMillis=5000), None, EffectivePolicy(True, 1000, 5000, 0)),
        (P(maxDeliveryDelayInMillis=0), None, EffectivePolicy(True, 1000, 0, 0)),
        (P(active=False), P(tickTime=200), EffectivePolicy(False, 200, 60_000, 0)),
        (P(active=False), P(active=True), EffectivePolicy(True, 1000, 60_000, 0)),
        (
            P(maxDeliveryDelayInMillis=5000),
            P(maxDeliveryDelayInMillis=9000),
            EffectivePolicy(True, 1000, 9000, 0),
        ),
        (None, P(fixedDeliveryDelayInMillis=3000), EffectivePolicy(True, 1000, 60_000, 3000)),
        (
            P(fixedDeliveryDelayInMillis=3000),
            P(fixedDeliveryDelayInMillis=0),
            EffectivePolicy(True, 1000, 60_000, 0),
        ),
    ],
)
def test_resolve_table(namespace: P | None, topic: P | None, expected: EffectivePolicy) -> None:
    assert resolve_policy(BROKER, namespace, topic) == expected


def test_resolve_broker_disabled() -> None:
    assert not resolve_policy(BrokerDefaults(enabled=False), None, None).active


_maybe_bool = st.none() | st.booleans()
_maybe_tick = st.none() | st.integers(min_value=1, max_value=MAX_LONG)
_maybe_ms = st.none() | st.integers(min_value=0, max_value=MAX_LONG)
_policies = st.none() | st.builds(
    P,
    active=_maybe_bool,
    tickTime=_maybe_tick,
    maxDeliveryDelayInMillis=_maybe_ms,
    fixedDeliveryDelayInMillis=_maybe_ms,
)
_brokers = st.builds(
    BrokerDefaults,
    enabled=st.booleans(),
    tick_time_ms=st.integers(min_value=1, max_value=10**6),
    max_delay_ms=st.integers(min_value=0, max_value=10**9),
    fixed_delay_ms=st.integers(min_value=0, max_value=10**9),
)

_FIELDS = [
    ("active", "active", "enabled"),
    ("tickTime", "tick_time_ms", "tick_time_ms"),
    ("maxDeliveryDelayInMillis", "max_delay_ms", "max_delay_ms"),
    ("fixedDeliveryDelayInMillis", "fixed_delay_ms", "fixed_delay_ms"),
]


@given(_brokers, _policies, _policies)
def test_resolution_precedence(broker: BrokerDefaults, ns: P | None, topic: P | None) -> None:
    eff = resolve_policy(broker, ns, topic)
    for wire, eff_name, broker_name in _FIELDS:
        topic_value = getattr(topic, wire) if topic is not None else None
        ns_value = getattr(ns, wire) if ns is not None else None
        if topic_value is not None:
            expected = topic_value
        elif ns_value is not None:
            expected = ns_value
        else:
            expected = getattr(broker, broker_name)
        assert getattr(eff, eff_name) == expected


@given(_brokers, _policies)
def test_empty_levels_change_nothing(broker: BrokerDefaults, policy: P | None) -> None:
    base = resolve_policy(broker, policy, None)
    assert resolve_policy(broker, policy, P()) == base
    assert resolve_policy(broker, None, policy) == resolve_policy(broker, P(), policy)


@given(_policies)
def test_policy_json_round_trip(policy: P | None) -> None:
    if policy is None:
        return
    assert P.model_validate_json(policy.model_dump_json()) == policy


def test_quotas_zero_is_unlimited_and_a_namespace_value_wins() -> None:
    from dwell.core.policy import applied_limit, namespace_limit, over_limit

    assert not over_limit(0, 10**9, 10**9)
    assert not over_limit(3, 1, 2) and over_limit(3, 2, 2)
    assert applied_limit(None, 100) == 100 and applied_limit(0, 100) == 0
    assert applied_limit(5, 100) == 5
    assert namespace_limit(0, "maxTopicsPerNamespace") == 0
    with pytest.raises(ValueError, match="^maxTopicsPerNamespace must be 0 or more$"):
        namespace_limit(-1, "maxTopicsPerNamespace")
    for bad in ("3", 3.0, True, None, [3], 2**31):
        with pytest.raises((TypeError, ValueError)):
            namespace_limit(bad, "maxSubscriptionsPerTopic")


@pytest.mark.parametrize(("count", "boundaries"), [
    (1, ["0x00000000", "0xffffffff"]),
    (3, ["0x00000000", "0x55555555", "0xaaaaaaaa", "0xffffffff"]),
    (4, ["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"]),
])
def test_bundles_are_pulsars_equal_hash_ranges(count: int, boundaries: list[str]) -> None:
    assert bundles(count) == {"boundaries": boundaries, "numBundles": count}


def test_a_namespaces_policies_carry_what_dwell_keeps_over_pulsars_defaults() -> None:
    auth = {"namespace_auth": {"app": ["consume"]}, "destination_auth": {},
            "subscription_auth_roles": {}}
    got = pulsar_policies({"auth_policies": auth, "max_topics_per_namespace": 7,
                           "unrelated": 1}, {"active": True}, "east")
    assert (got["auth_policies"], got["max_topics_per_namespace"]) == (auth, 7)
    assert got["delayed_delivery_policies"] == {"active": True}
    assert got["replication_clusters"] == ["east"]
    assert got["clusterThatCanDeleteNamespace"] == "east"
    assert "unrelated" not in got and "max_subscriptions_per_topic" not in got
    assert "delayed_delivery_policies" not in pulsar_policies({}, None, "east")
