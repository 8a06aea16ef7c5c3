"""Pulsar's quotas on the policy service: the checks made when a topic is created
(`maxNumPartitionsPerPartitionedTopic`, 406, and the namespace's topic count, 412) or
grown, with Pulsar's texts (dwell.core.policy). The namespace policies
`maxTopicsPerNamespace` and `maxSubscriptionsPerTopic` are set through
dwell.policy.routes.limits."""

from __future__ import annotations

import asyncio
from typing import Final

from dwell.core.policy import (
    MAX_TOPICS_FIELD,
    PARTITIONS_OVER_MAX,
    TOPICS_OVER_MAX,
    BrokerLimits,
    applied_limit,
    over_limit,
)
from dwell.core.topics import TopicName
from dwell.http import ApiError
from dwell.policy.store import PolicyStore
from dwell.policy.topics import TopicCatalog


class CreateLocks:
    """The locks under which a namespace's topics are counted and created, so that
    concurrent creates in this process cannot each see room for one more (a fixed set of
    stripes, whatever the number of namespaces)."""

    STRIPES: Final = 64

    def __init__(self) -> None:
        self._locks = [asyncio.Lock() for _ in range(self.STRIPES)]

    def __call__(self, namespace: str) -> asyncio.Lock:
        return self._locks[hash(namespace) % self.STRIPES]


async def check_create(store: PolicyStore, catalog: TopicCatalog, broker: BrokerLimits,
                       topic: TopicName, partitions: int) -> None:
    """Refuse creating `topic` with `partitions` partitions beyond the quotas. A
    partitioned topic's partitions each count as a topic, as in Pulsar."""
    if over_limit(broker.max_partitions_per_topic, 0, partitions):
        raise ApiError(406, PARTITIONS_OVER_MAX.format(max=broker.max_partitions_per_topic))
    own = (await store.namespace_fields(topic.namespace_name)).get(MAX_TOPICS_FIELD)
    limit = applied_limit(own, broker.max_topics_per_namespace)
    if limit and over_limit(limit, len(await catalog.listing(topic.domain,
                                                              topic.namespace_name)),
                            partitions):
        raise ApiError(412, TOPICS_OVER_MAX)


async def check_growth(store: PolicyStore, catalog: TopicCatalog, broker: BrokerLimits,
                       topic: TopicName, current: int, total: int) -> None:
    """Refuse growing the partitioned `topic` from `current` to `total` partitions beyond
    the quotas: Pulsar's 422 past `maxNumPartitionsPerPartitionedTopic`, and, as at
    creation, the namespace's topic count for the partitions added (412). Pulsar does not
    count them there; in dwell each one is a Kafka partition, which the quota bounds."""
    if over_limit(broker.max_partitions_per_topic, 0, total):
        raise ApiError(422, f"Desired partitions {total} can't be greater than the maximum "
                            f"partitions per topic {broker.max_partitions_per_topic}.")
    own = (await store.namespace_fields(topic.namespace_name)).get(MAX_TOPICS_FIELD)
    limit = applied_limit(own, broker.max_topics_per_namespace)
    if limit and over_limit(limit, len(await catalog.listing(topic.domain,
                                                              topic.namespace_name)),
                            total - current):
        raise ApiError(412, TOPICS_OVER_MAX)
