"""Pulsar topics as dwell has them: a topic exists when its Kafka ready topic does
(dwell.core.topics maps the names). A ready topic with N > 1 Kafka partitions is a
partitioned topic, whose partition `x-partition-i` is the ready topic's Kafka partition i.
One with a single Kafka partition is a non-partitioned topic, unless the topic's record in
the policy store (and on `dwell.policies`) marks it as a partitioned topic of one
partition (`pulsar-admin topics create-partitioned-topic -p 1`). Kafka is the record of
which topics exist and of their partitions; that mark is the only other thing kept."""

from __future__ import annotations

import asyncio

from dwell.adapters import kafka
from dwell.core.topics import InvalidTopicName, TopicName, subscription_of_group
from dwell.http import ApiError
from dwell.policy.store import PolicyStore


def _unavailable(exc: Exception) -> ApiError:
    return ApiError(503, f"Kafka unavailable: {exc}")


class TopicCatalog:
    def __init__(self, bootstrap: str, replication: int, store: PolicyStore) -> None:
        self.bootstrap = bootstrap
        self.replication = replication
        self.store = store

    async def _counts(self) -> dict[str, int]:
        try:
            return await asyncio.to_thread(kafka.partition_counts, self.bootstrap)
        except kafka.KafkaUnavailable as exc:
            raise _unavailable(exc) from exc

    async def partitions(self, topic: TopicName) -> int:
        """The number of Kafka partitions of the topic's ready topic; 0 when it has none."""
        return (await self._counts()).get(topic.kafka_topic, 0)

    async def layout(self, topic: TopicName) -> tuple[int, bool]:
        """(partitions, partitioned): the number of Kafka partitions of the topic's ready
        topic (0 when it has none), and whether it is a partitioned topic."""
        count = await self.partitions(topic)
        if count != 1:
            return count, count > 1
        return 1, (await self.store.topic_policies(topic))[1].partitioned

    async def in_namespace(self, domain: str, ns: str) -> dict[TopicName, tuple[int, bool]]:
        """The namespace's topics of one domain, with their `layout`s."""
        counts = await self._counts()
        marked = await self.store.partitioned_marks(ns)
        found = {}
        for name, count in counts.items():
            try:
                topic = TopicName.from_kafka(name)
            except InvalidTopicName:
                continue  # dwell's own topics, and names that map to no Pulsar topic
            if topic.domain == domain and topic.namespace_name == ns:
                found[topic] = (count, count > 1 or str(topic) in marked)
        return found

    async def listing(self, domain: str, ns: str) -> list[str]:
        """Pulsar's topic list: non-partitioned topics and the partitions of the others."""
        names = []
        for topic, (count, partitioned) in (await self.in_namespace(domain, ns)).items():
            names += ([str(topic.partition(i)) for i in range(count)] if partitioned
                      else [str(topic)])
        return sorted(names)

    async def partitioned(self, domain: str, ns: str) -> list[str]:
        return sorted(str(topic) for topic, (_, partitioned) in
                      (await self.in_namespace(domain, ns)).items() if partitioned)

    async def create(self, topic: TopicName, partitions: int) -> bool:
        """Create the ready topic; False when it exists already."""
        try:
            return await asyncio.to_thread(kafka.ensure_topic, self.bootstrap, topic.kafka_topic,
                                           partitions, self.replication)
        except kafka.TopicRefused as exc:
            raise ApiError(409, f"topic: {topic} maps to the Kafka topic {topic.kafka_topic}, "
                                f"which Kafka refuses ({exc}); Kafka treats '.' and '_' in "
                                "topic names alike") from exc
        except kafka.KafkaUnavailable as exc:
            raise _unavailable(exc) from exc

    async def grow(self, topic: TopicName, current: int, total: int) -> None:
        """Grow the ready topic from `current` to `total` Kafka partitions, and start each
        consumer group that reads it and has no member now at offset 0 of the new ones:
        what is written there before a consumer of the group comes back is read, as
        Pulsar copies a topic's subscriptions to its new partitions at the earliest
        position. A group with members takes the new partitions when its consumers see
        them; the SDK's read them from the start (dwell.client.consumer)."""
        try:
            await asyncio.to_thread(kafka.add_partitions, self.bootstrap, topic.kafka_topic,
                                    total)
            groups = await asyncio.to_thread(kafka.groups_reading, self.bootstrap,
                                             topic.kafka_topic)
            new = {(topic.kafka_topic, p): 0 for p in range(current, total)}
            if groups and new:
                await asyncio.to_thread(kafka.start_groups_at, self.bootstrap, groups, new)
        except kafka.KafkaUnavailable as exc:
            raise _unavailable(exc) from exc

    async def consumer_groups(self, topic: TopicName) -> set[str]:
        """The subscriptions of the Kafka consumer groups reading the topic's ready topic
        (an SDK consumer's group named for its subscription, a plain consumer's group
        as it is)."""
        try:
            groups = await asyncio.to_thread(kafka.groups_reading, self.bootstrap,
                                             topic.kafka_topic)
        except kafka.KafkaUnavailable as exc:
            raise _unavailable(exc) from exc
        return {subscription_of_group(topic, g) for g in groups}

    async def delete(self, topic: TopicName) -> bool:
        """Delete the ready topic; False when there was none."""
        try:
            return await asyncio.to_thread(kafka.delete_topic, self.bootstrap, topic.kafka_topic)
        except kafka.KafkaUnavailable as exc:
            raise _unavailable(exc) from exc
