"""PolicyCache bookkeeping: feed records in, effective policies and versions out."""

from __future__ import annotations

import orjson

from dwell.core.policy import BrokerDefaults, EffectivePolicy
from dwell.core.topics import TopicName
from dwell.policy_view import PolicyCache

TOPIC = TopicName.parse("persistent://acme/orders/new")


def rec(version: int, scope: str, **extra: object) -> bytes:
    return orjson.dumps({"version": version, "scope": scope, **extra})


def filled() -> PolicyCache:
    c = PolicyCache(BrokerDefaults(max_delay_ms=9000))
    c.apply("tenant:acme", rec(1, "tenant:acme", tenant={"adminRoles": []}), {})
    c.apply("namespace:acme/orders", rec(2, "namespace:acme/orders"), {})
    return c


def test_namespace_known_needs_tenant_and_namespace() -> None:
    c = filled()
    assert c.namespace_known("acme", "orders")
    assert not c.namespace_known("acme", "other")
    assert not c.namespace_known("other", "orders")
    c.apply("tenant:acme", None, {"dwell-version": b"7"})
    assert not c.namespace_known("acme", "orders")
    assert c.version == 7


def test_field_by_field_resolution_and_invalidation() -> None:
    c = filled()
    assert c.effective(TOPIC) == EffectivePolicy(True, 1000, 9000, 0)
    c.apply("ns:acme/orders", rec(3, "ns:acme/orders",
                                  policy={"tickTime": 500, "maxDeliveryDelayInMillis": 5000}), {})
    assert c.effective(TOPIC) == EffectivePolicy(True, 500, 5000, 0)
    c.apply(f"topic:{TOPIC}", rec(4, f"topic:{TOPIC}", policy={"maxDeliveryDelayInMillis": 100}),
            {})
    # topic max wins, tickTime still from the namespace
    assert c.effective(TOPIC) == EffectivePolicy(True, 500, 100, 0)
    c.apply(f"topic:{TOPIC}", None, {"dwell-version": b"5"})
    assert c.effective(TOPIC) == EffectivePolicy(True, 500, 5000, 0)
    assert c.version == 5


def test_version_is_the_highest_applied_and_malformed_records_are_skipped() -> None:
    c = filled()
    c.apply("ns:acme/orders", b"{not json", {})
    c.apply("ns:acme/orders", rec(9, "ns:acme/orders", policy={"tickTime": -1}), {})
    c.apply("weird:x", rec(10, "weird:x"), {})
    assert c.version == 2
    assert c.effective(TOPIC).tick_time_ms == 1000
    c.apply("namespace:acme/orders", rec(1, "namespace:acme/orders"), {})
    assert c.version == 2


def test_a_topic_record_marks_a_partitioned_topic_of_one_partition() -> None:
    c = filled()
    scope = f"topic:{TOPIC}"
    c.apply(scope, rec(3, scope, policy=None, partitioned=True), {})
    assert str(TOPIC) in c.partitioned_one
    assert c.effective(TOPIC) == EffectivePolicy(True, 1000, 9000, 0)  # no policy of its own
    c.apply(scope, rec(4, scope, policy={"tickTime": 5}, local={"tickTime": 5},
                       partitioned=True), {})
    assert str(TOPIC) in c.partitioned_one and c.effective(TOPIC).tick_time_ms == 5
    c.apply(scope, rec(5, scope, policy={"tickTime": 5}, local={"tickTime": 5}), {})
    assert str(TOPIC) not in c.partitioned_one
    c.apply(scope, rec(6, scope, policy=None, partitioned=True), {})
    c.apply(scope, None, {"dwell-version": b"7"})
    assert str(TOPIC) not in c.partitioned_one


def test_only_a_true_partitioned_field_is_a_mark() -> None:
    c = filled()
    scope = f"topic:{TOPIC}"
    for value in ("yes", 1, None, [True]):
        c.apply(scope, rec(3, scope, policy=None, partitioned=value), {})
        assert str(TOPIC) not in c.partitioned_one, value
