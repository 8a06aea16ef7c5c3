"""Delayed-delivery policies (Pulsar's ``DelayedDeliveryPolicies`` JSON), broker defaults,
and their resolution into the one effective policy a topic runs with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Final, TypeVar

import pydantic
from pydantic import ConfigDict, Field

MAX_LONG: Final = 2**63 - 1

_Millis = Annotated[int, Field(ge=0, le=MAX_LONG)]
_Tick = Annotated[int, Field(ge=1, le=MAX_LONG)]
_T = TypeVar("_T")


class DelayedDeliveryPolicies(pydantic.BaseModel):
    """A namespace or topic policy as posted; a field left out (or null) inherits."""

    # strict refuses "5000", 5.0 and true for the int fields instead of coercing them.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    active: bool | None = None
    tickTime: _Tick | None = None
    maxDeliveryDelayInMillis: _Millis | None = None
    fixedDeliveryDelayInMillis: _Millis | None = None


@dataclass(frozen=True, slots=True)
class BrokerDefaults:
    """Broker-wide settings (``broker.conf``'s delayedDelivery* keys), the hierarchy's floor."""

    enabled: bool = True
    tick_time_ms: int = 1000
    max_delay_ms: int = 0
    fixed_delay_ms: int = 0
    strict: bool = False
    fixed_delay_detection_lookahead: int = 50000

    def __post_init__(self) -> None:
        if self.tick_time_ms < 1:
            raise ValueError("tick_time_ms must be >= 1")
        for name in ("max_delay_ms", "fixed_delay_ms", "fixed_delay_detection_lookahead"):
            if not 0 <= getattr(self, name) <= MAX_LONG:
                raise ValueError(f"{name} must be between 0 and {MAX_LONG}")


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """The fully resolved policy of one topic; 0 switches max and fixed delay off."""

    active: bool
    tick_time_ms: int
    max_delay_ms: int
    fixed_delay_ms: int

    def to_pulsar_json(self) -> dict[str, bool | int]:
        return {
            "active": self.active,
            "tickTime": self.tick_time_ms,
            "maxDeliveryDelayInMillis": self.max_delay_ms,
            "fixedDeliveryDelayInMillis": self.fixed_delay_ms,
        }


def resolve_policy(
    broker: BrokerDefaults,
    namespace: DelayedDeliveryPolicies | None,
    topic: DelayedDeliveryPolicies | None,
) -> EffectivePolicy:
    """Resolve field by field: topic value if set, else namespace value, else broker value.

    Pulsar resolves whole objects of primitive fields, so a namespace policy saved without
    a max silently stores 0 and lifts a broker-wide limit; dwell lets unset fields inherit.
    """

    levels = [p for p in (topic, namespace) if p is not None]

    def pick(field: Callable[[DelayedDeliveryPolicies], _T | None], fallback: _T) -> _T:
        for level in levels:
            value = field(level)
            if value is not None:
                return value
        return fallback

    return EffectivePolicy(
        active=pick(lambda p: p.active, broker.enabled),
        tick_time_ms=pick(lambda p: p.tickTime, broker.tick_time_ms),
        max_delay_ms=pick(lambda p: p.maxDeliveryDelayInMillis, broker.max_delay_ms),
        fixed_delay_ms=pick(lambda p: p.fixedDeliveryDelayInMillis, broker.fixed_delay_ms),
    )


# -- Pulsar's quotas: broker.conf's maxNumPartitionsPerPartitionedTopic, maxTopicsPerNamespace
# and maxSubscriptionsPerTopic, the last two also namespace policies (Pulsar's Policies
# fields max_topics_per_namespace, max_subscriptions_per_topic). 0 is unlimited, as in Pulsar.

# Pulsar 4.0's texts (AdminResource, PersistentTopicsBase, NamespacesBase, PersistentTopic).
PARTITIONS_OVER_MAX: Final = "Number of partitions should be less than or equal to {max}"
TOPICS_OVER_MAX: Final = "Exceed maximum number of topics in namespace."
SUBSCRIPTIONS_OVER_MAX: Final = "Exceed the maximum number of subscriptions of the topic: {topic}"
NAMESPACE_LIMIT_NEGATIVE: Final = "{name} must be 0 or more"
# The namespace record's fields, Pulsar's names in its Policies JSON.
MAX_TOPICS_FIELD: Final = "max_topics_per_namespace"
MAX_SUBSCRIPTIONS_FIELD: Final = "max_subscriptions_per_topic"
NAMESPACE_LIMIT_FIELDS: Final = (MAX_TOPICS_FIELD, MAX_SUBSCRIPTIONS_FIELD)


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    """The broker-wide quotas; each 0 means unlimited."""

    max_partitions_per_topic: int = 0
    max_topics_per_namespace: int = 0
    max_subscriptions_per_topic: int = 0


def applied_limit(namespace_value: int | None, broker_value: int) -> int:
    """The namespace's limit when it set one (0 included: unlimited), else the broker's."""
    return broker_value if namespace_value is None else namespace_value


def over_limit(limit: int, current: int, adding: int) -> bool:
    """Whether `adding` more on top of `current` passes `limit` (0: no limit)."""
    return limit > 0 and current + adding > limit


def namespace_limit(value: object, name: str) -> int:
    """A namespace limit as posted (a JSON integer, 0 or more): TypeError when it is not
    an integer, ValueError with Pulsar's text when it is negative."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"body: {name} must be an integer")
    if value < 0:
        raise ValueError(NAMESPACE_LIMIT_NEGATIVE.format(name=name))
    if value > 2**31 - 1:
        raise ValueError(f"body: {name} must be at most {2**31 - 1} (a Java int)")
    return value


# -- A namespace's Policies as Pulsar 4.0.8's `GET /admin/v2/namespaces/{t}/{ns}` answers
# them (AdminResource.getNamespacePoliciesAsync; Jackson leaves nulls out).

# Pulsar's defaultNumberOfNamespaceBundles. dwell has no bundles; it answers the ranges a
# namespace created without a bundle count has (PoliciesUtil.getBundles).
DEFAULT_BUNDLES: Final = 4
_HASH_RANGE: Final = 1 << 32


def bundles(count: int = DEFAULT_BUNDLES) -> dict[str, object]:
    """Pulsar's BundlesData of `count` equal hash ranges."""
    size = _HASH_RANGE // count
    bounds = [0, *(size * (i + 1) for i in range(count - 1)), _HASH_RANGE - 1]
    return {"boundaries": [f"0x{b:08x}" for b in bounds], "numBundles": count}


def pulsar_policies(record: dict[str, object], delayed: dict[str, object] | None,
                    cluster: str) -> dict[str, object]:
    """The Policies JSON of a namespace whose record (its permissions and quotas, under
    Pulsar's names) is `record` and whose own delayed-delivery policy is `delayed`: every
    field Pulsar answers for a namespace created with `namespaces create`, the ones dwell
    keeps in place of their defaults. `replication_clusters` is the one cluster, as
    Pulsar defaults it to the local one (NamespacesBase.validatePoliciesAsync), and
    `is_allow_auto_update_schema` the broker's default."""
    policies: dict[str, object] = {
        "auth_policies": {"namespace_auth": {}, "destination_auth": {},
                          "subscription_auth_roles": {}},
        "replication_clusters": [cluster], "allowed_clusters": [], "bundles": bundles(),
        "backlog_quota_map": {}, "clusterDispatchRate": {}, "topicDispatchRate": {},
        "subscriptionDispatchRate": {}, "replicatorDispatchRate": {},
        "clusterSubscribeRate": {}, "publishMaxMessageRate": {},
        "latency_stats_sample_rate": {}, "deleted": False, "encryption_required": False,
        "subscription_auth_mode": "None", "offload_threshold": -1,
        "offload_threshold_in_seconds": -1, "schema_compatibility_strategy": "UNDEFINED",
        "is_allow_auto_update_schema": True, "schema_validation_enforced": False,
        "subscription_types_enabled": [], "properties": {}, "migrated": False,
        # A getter of 4.0.8's Policies: the one replication cluster.
        "clusterThatCanDeleteNamespace": cluster,
    }
    policies.update({k: v for k, v in record.items()
                     if k == "auth_policies" or k in NAMESPACE_LIMIT_FIELDS})
    if delayed is not None:
        policies["delayed_delivery_policies"] = delayed
    return policies
