"""The publish path shared by HTTP and the Kafka ingress: a request's topic, the policy
feed caught up with when the topic's namespace is unknown here, its plan (`plan.py`),
its records written and its messages counted.

Kafka not acknowledging every accepted message within `publish_timeout_ms` fails the
whole request as retriable (HTTP 503): no message of it is reported as accepted, and a
retry may duplicate the ones that did land.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Final

from dwell.adapters import kafka
from dwell.cache import BoundedCache
from dwell.core import topics as names
from dwell.core.policy import MAX_TOPICS_FIELD, TOPICS_OVER_MAX, applied_limit, over_limit
from dwell.core.topics import InvalidTopicName, TopicName
from dwell.policy_view import PolicyCache

from . import metrics
from .deliveries import Deliveries
from .plan import Plan, Planner
from .schema import PublishError, PublishRequest
from .settings import AdmissionSettings

# Topic creation is serialized per namespace (by stripe), in this process.
_CREATING: Final = [threading.Lock() for _ in range(64)]


def creating(namespace: str) -> threading.Lock:
    """The lock under which `namespace`'s topics are counted and created."""
    return _CREATING[hash(namespace) % len(_CREATING)]


class Publisher(Planner):
    """Applies the publish rule (`Planner`) and writes the records; one per process, both
    paths."""

    def __init__(self, settings: AdmissionSettings, cache: PolicyCache, producer: kafka.Producer,
                 clock: Callable[[], float] = time.time,
                 catch_up: Callable[[], Future[bool]] | None = None) -> None:
        super().__init__(settings, cache, clock)
        # The policy follower's catch_up (see cache.py): asked before a miss is answered.
        self.catch_up = catch_up
        self._topics: BoundedCache[tuple[str, str, str, str], TopicName | str] = BoundedCache()
        # Ready topics known to exist, and the Kafka partition of each partition topic
        # (`route`).
        self._ready_topics: set[str] = set()
        self._partitions: BoundedCache[TopicName, int] = BoundedCache()
        # Per producer that writes (this one, the Kafka ingress's transactional one): the
        # partitions of each ready topic its metadata is known to hold.
        self._known_counts: weakref.WeakKeyDictionary[
            kafka.Producer, BoundedCache[str, int]] = weakref.WeakKeyDictionary()
        self._labels: dict[str, tuple[Any, Any]] = {}
        self._counters: dict[tuple[str, str], Any] = {}
        self.deliveries = Deliveries(producer, settings.publish_timeout_ms / 1000 + 1.0)
        self._producer = producer

    # -- topics

    def topic(self, domain: str, tenant: str, namespace: str, local: str) -> TopicName:
        """Parse and remember a topic; 404 for an unknown domain, 400 for a bad name."""
        key = (domain, tenant, namespace, local)
        got = self._topics.get(key)
        if got is None:
            try:
                got = TopicName.of(domain, tenant, namespace, local)
            except InvalidTopicName as exc:
                got = str(exc)
            self._topics.put(key, got)
        if isinstance(got, str):
            raise PublishError(400 if domain in names.DOMAINS else 404, f"topic: {got}")
        return got

    def route_known(self, topic: TopicName) -> bool:
        """Whether `route` can answer without asking Kafka, for this publisher's producer."""
        if topic.partition_index < 0:
            return topic.kafka_topic in self._ready_topics
        known = self._known_counts.get(self._producer)
        return (topic in self._partitions and known is not None
                and topic.partition_index < known.get(topic.partitioned_topic.kafka_topic, 0))

    def route(self, topic: TopicName, writer: kafka.Producer | None = None) -> int:
        """The Kafka partition of the ready topic (`Plan.partitions`) that the topic's
        immediate messages go to, -1 for the partitioner's choice; blocking admin calls,
        once per topic and process. ``writer`` is the producer that will write them (this
        publisher's own by default): a partition added since it last looked (by
        `update-partitioned-topic`) is made known to it first, as it would refuse the
        send until its next metadata refresh. The ready topic must exist: it is created on first
        use when `allow_auto_topic_creation` (Pulsar's `allowAutoTopicCreation`), else
        the publish is refused with 404 `Topic persistent://t/ns/x not found`. A partition
        `x-partition-N` is Kafka partition N of x's ready topic: 404 when x is not a
        partitioned topic or has no partition N (Pulsar's wording); a ready topic of one
        Kafka partition is a partitioned topic's when the policy feed's record of the topic
        says so (caught up with before a 404). PublishError 409 when Kafka refuses the
        name, KafkaUnavailable when it cannot answer.

        Every request with messages needs it, delayed or rejected ones too: the drain
        will write them there, a name Kafka refuses must be refused now rather than when
        they come due, and a request to a topic that does not exist is refused whole,
        whatever its messages."""
        index = topic.partition_index
        if index < 0:
            if topic.kafka_topic not in self._ready_topics:
                self._ensure_exists(topic, topic)
                self._ready_topics.add(topic.kafka_topic)
            return -1
        owner = topic.partitioned_topic
        got = self._partitions.get(topic)
        if got is None:
            got = self._route_partition(topic, owner)
        self._make_known(writer or self._producer, owner.kafka_topic, got)
        return got

    def _route_partition(self, topic: TopicName, owner: TopicName) -> int:
        index = topic.partition_index
        count = kafka.partition_count(self.settings.kafka_bootstrap, owner.kafka_topic)
        if count == 0:
            self._ensure_exists(owner, topic)
            count = kafka.partition_count(self.settings.kafka_bootstrap, owner.kafka_topic)
        if count == 1 and not self._partitioned_one(owner):
            count = 0
        if count == 0:
            raise PublishError(404, f"Topic {topic} not found: {owner} is not a partitioned "
                                    "topic")
        if index >= count:
            raise PublishError(404, f"Illegal topic partition name {topic} with max allowed "
                                    f"{count} partitions")
        self._ready_topics.add(owner.kafka_topic)
        return self._partitions.put(topic, index)

    def _make_known(self, writer: kafka.Producer, kafka_topic: str, index: int) -> None:
        known = self._known_counts.setdefault(writer, BoundedCache())
        if index >= known.get(kafka_topic, 0):
            known.put(kafka_topic, max(index + 1, writer.learn(kafka_topic)))

    def forget_route(self, topic: TopicName) -> None:
        """Ask Kafka again at `topic`'s next `route`: a write to it failed, and its ready
        topic may have been deleted (`topics delete`) since it was routed, so that the next
        publish makes it again, as in Pulsar."""
        owner = topic.partitioned_topic if topic.partition_index >= 0 else topic
        self._ready_topics.discard(owner.kafka_topic)
        self._partitions.pop(topic, None)

    def forget_routes(self) -> None:
        """`forget_route` for every topic (a batch of the Kafka ingress failed)."""
        self._ready_topics.clear()
        self._partitions.clear()

    def _partitioned_one(self, topic: TopicName) -> bool:
        """Whether the policy feed marks `topic` as a partitioned topic of one partition,
        asked again after a catch-up when the cache does not (it may have just been made)."""
        name = str(topic)
        if name in self.cache.partitioned_one:
            return True
        return (self.catch_up is not None and self._catch_up_blocking()
                and name in self.cache.partitioned_one)

    def _ensure_exists(self, owner: TopicName, asked: TopicName) -> None:
        """Create `owner`'s ready topic unless it exists (the topic published to is
        `asked`); 404 instead when topics are not auto-created and it does not exist."""
        s = self.settings
        kafka_topic = owner.kafka_topic
        if not s.allow_auto_topic_creation:
            if kafka.partition_count(s.kafka_bootstrap, kafka_topic) == 0:
                raise PublishError(404, f"Topic {asked} not found")
            return
        try:
            # Counted and created under one lock, so that concurrent first publishes to a
            # namespace's new topics cannot each see room for one more.
            with creating(owner.namespace_name):
                self._check_topic_quota(owner)
                kafka.ensure_topic(s.kafka_bootstrap, kafka_topic, s.ready_topic_partitions,
                                   s.kafka_replication_factor)
        except kafka.TopicRefused as exc:
            raise PublishError(409, f"topic: {asked} maps to the Kafka topic {kafka_topic}"
                                    f", which Kafka refuses ({exc}); Kafka treats '.' "
                                    "and '_' in topic names alike") from None

    def _check_topic_quota(self, owner: TopicName) -> None:
        """Refuse auto-creating `owner` past the namespace's maxTopicsPerNamespace (its own,
        else the broker's); its partitions count as topics, as in Pulsar."""
        s = self.settings
        limit = applied_limit(self.cache.namespace_limit(owner.namespace_name,
                                                         MAX_TOPICS_FIELD),
                              s.max_topics_per_namespace)
        if not limit:
            return
        counts = kafka.partition_counts(s.kafka_bootstrap)
        if counts.get(owner.kafka_topic):
            return
        have = 0
        for name, count in counts.items():
            try:
                topic = TopicName.from_kafka(name)
            except InvalidTopicName:
                continue
            if topic.domain == owner.domain and topic.namespace_name == owner.namespace_name:
                have += count if count > 1 or str(topic) in self.cache.partitioned_one else 1
        if over_limit(limit, have, s.ready_topic_partitions):
            raise PublishError(412, TOPICS_OVER_MAX)

    # -- the policy feed

    def misses(self, topic: TopicName) -> bool:
        """Whether the topic's namespace is unknown here, so that the policy feed must be
        caught up with (`caught_up`) before the publish is answered 404."""
        return (self.catch_up is not None and self.cache.ready.is_set()
                and not self.cache.namespace_known(topic.tenant, topic.namespace))

    def _not_caught_up(self) -> PublishError:
        return PublishError(503, "policies: could not catch up with dwell.policies within "
                                 f"{self.settings.policy_catch_up_timeout_ms} ms "
                                 "(policy_catch_up_timeout_ms); retry shortly")

    async def _catch_up(self) -> bool:
        assert self.catch_up is not None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.catch_up()),
                                          self.settings.policy_catch_up_timeout_ms / 1000 + 1)
        except TimeoutError:  # the catch-up thread's own deadline should come first
            return False

    async def caught_up(self) -> None:
        """Wait until the cache holds every policy change acknowledged before this call;
        PublishError 503 when that cannot be done in time (the answer is not known)."""
        if not await self._catch_up():
            raise self._not_caught_up()

    def replan_if_newer(self, plan: Plan, req: PublishRequest, version: int) -> Plan:
        """`plan` again from `req` when the rule refused a message of it and the policy
        feed, caught up with now, holds policies newer than `version` (the cache's when
        `plan` was made): the Kafka ingress's counterpart of what `publish` does."""
        if not plan.rejected or self.catch_up is None:
            return plan
        if self._catch_up_blocking() and self.cache.version != version:
            return self.plan(plan.topic, req)
        return plan

    def _catch_up_blocking(self) -> bool:
        assert self.catch_up is not None
        try:
            return self.catch_up().result(self.settings.policy_catch_up_timeout_ms / 1000 + 1.0)
        except TimeoutError:  # the catch-up thread's own deadline should come first
            return False

    def caught_up_blocking(self) -> None:
        """`caught_up` for a thread (the Kafka ingress)."""
        if not self._catch_up_blocking():
            raise self._not_caught_up()

    # -- counting

    def count(self, plan: Plan, path: str) -> None:
        """Count a plan's messages by outcome, and its policy outcomes per topic."""
        self._count_policy_outcomes(plan.topic, plan.rejected, plan.overridden)
        for outcome, n in (("immediate", plan.immediate), ("delayed", plan.delayed),
                           ("rejected", plan.rejected), ("invalid", plan.invalid)):
            if n:
                counter = self._counters.get((outcome, path))
                if counter is None:
                    counter = self._counters[outcome, path] = metrics.MESSAGES.labels(outcome,
                                                                                      path)
                counter.inc(n)

    def _count_policy_outcomes(self, topic: TopicName, rejected: int, overridden: int) -> None:
        if rejected or overridden:
            rejected_c, overridden_c = self._topic_counters(topic)
            if rejected:
                rejected_c.inc(rejected)
            if overridden:
                overridden_c.inc(overridden)

    def _topic_counters(self, topic: TopicName) -> tuple[Any, Any]:
        key = str(topic)
        got = self._labels.get(key)
        if got is None:
            labels = (self.settings.cluster, topic.namespace_name, key)
            got = (metrics.DELAYED_REJECTED.labels(*labels),
                   metrics.FIXED_DELAY_OVERRIDDEN.labels(*labels))
            self._labels[key] = got
        return got

    # -- writing

    @staticmethod
    def send(plan: Plan, producer: kafka.Producer) -> Future[list[tuple[int, int]]]:
        """Write a plan's records as one batch through `producer` (the ingress's; the HTTP
        path sends through `deliveries`): a future of their (partition, offset)s."""
        return producer.send_many(plan.sends, plan.partitions())

    async def publish(self, topic: TopicName, body: bytes) -> bytes:
        """The HTTP path: the JSON answer (see `answer`) to a request's body once Kafka
        acknowledged every accepted message.

        Nothing the answer does not need waits for Kafka's acks with it: the body goes
        once planned and the records once the producer has copied them, so that the next
        requests reuse memory still in the CPU's caches rather than each waiting request
        holding its own. The caller must not keep `body` either (admission's handler
        lets it go)."""
        if self.misses(topic):
            await self.caught_up()
        version = self.cache.version
        plan = self.plan_body(topic, body)
        # The rule refused a message: answer that from the policies in force now (a max
        # delay may have been raised a moment ago). A catch-up that fails leaves the
        # answer to the policies applied.
        if (plan.rejected and self.catch_up is not None and await self._catch_up()
                and self.cache.version != version):
            plan = self.plan_body(topic, body)
        del body
        # After the plan: an unknown namespace is refused before its topic is looked up,
        # and a request without messages asks Kafka nothing.
        if plan.results and not self.route_known(topic):
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.route, topic)
            except kafka.KafkaUnavailable as exc:
                raise PublishError(503, f"Kafka unavailable: {exc}") from None
        offsets: list[tuple[int, int]] = []
        sends = len(plan.sends)
        if sends:
            try:
                acked = self.deliveries.send(plan.sends, plan.partitions())
                plan.sends = []
                offsets = await acked
            except (kafka.KafkaUnavailable, TimeoutError) as exc:
                self.forget_route(topic)
                metrics.MESSAGES.labels("unavailable", "http").inc(sends - plan.releases)
                raise PublishError(503, f"Kafka unavailable: {exc}") from None
        self.count(plan, "http")
        return self.answer(plan, offsets)
