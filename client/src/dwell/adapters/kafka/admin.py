"""Cluster administration: topics (creating dwell's own, listing, partitions), end
offsets, reachability, and starting a consumer group at the end of its topics."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Final

from confluent_kafka import Consumer as _Consumer
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from dwell.core import topics as names

from .config import connection
from .consumer import Consumer, close_within, watermarks
from .errors import KafkaUnavailable, RetentionRefused, TopicRefused

log = logging.getLogger("dwell.adapters.kafka")


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({**connection(bootstrap),
                        "socket.connection.setup.timeout.ms": 5000})


def ping(bootstrap: str, timeout: float = 2.0) -> bool:
    try:
        return bool(admin(bootstrap).list_topics(timeout=timeout).brokers)
    except KafkaException:
        return False


def ensure_topic(bootstrap: str, name: str, partitions: int = 1, replication: int = 1,
                 config: Mapping[str, str] | None = None, timeout: float = 15.0) -> bool:
    """Create a topic unless it exists; True when this call created it. An existing topic
    is taken as it is (its partition count is not checked against ``partitions``).
    TopicRefused when Kafka refuses the name, KafkaUnavailable when it cannot answer."""
    client = admin(bootstrap)
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication,
                  config=dict(config or {}))], operation_timeout=timeout)
    try:
        futures[name].result(timeout)
        created = True
    except KafkaException as exc:
        code = exc.args[0].code()
        if code == KafkaError.TOPIC_EXCEPTION:
            raise TopicRefused(exc.args[0].str()) from exc
        if code != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaUnavailable(f"cannot create topic {name}: {exc}") from exc
        created = False
    # Metadata for a new topic reaches every client a moment later.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = client.list_topics(name, timeout=timeout)
        t = md.topics.get(name)
        if t is not None and t.error is None and (
                not created or len(t.partitions) >= partitions):
            return created
        time.sleep(0.05)
    raise KafkaUnavailable(f"topic {name} not visible after {timeout}s")


# The Kafka tokens on dwell.publish and dwell.acks are checked against the time the
# broker wrote their record (dwell.auth.tokens): a timestamp the producer chose would let
# an expired token be sent again as if it were old.
BROKER_TIMESTAMPS: Final = {"message.timestamp.type": "LogAppendTime"}


# The delay logs and the delivered marks hold what a pending message or a rebuild needs,
# however old it is: no age or size limit may remove it. Disk is given back by the
# tracker's trim below the low watermarks (docs/internals.md, "Retention and trim").
KEEP_UNTIL_DELIVERED: dict[str, str] = {"retention.ms": "-1", "retention.bytes": "-1",
                                        "cleanup.policy": "delete"}
KEPT_TOPICS = (names.DELAYED, names.REFILED, names.DELIVERED)
# What dwell creates those topics with. Kafka removes a segment only once it lies wholly
# below the log's start and is no longer written to, so they roll every hour: the trim
# gives their disk back within about an hour plus the broker's retention check (a stock
# broker rolls weekly, log.roll.hours=168). An operator's own value is left alone.
HOURLY_SEGMENTS: dict[str, str] = {"segment.ms": "3600000"}
KEPT_TOPIC_CONFIG: dict[str, str] = KEEP_UNTIL_DELIVERED | HOURLY_SEGMENTS


def retention_risks(config: Mapping[str, str]) -> dict[str, str]:
    """The settings of a topic's config (as describe_configs gives it, broker defaults
    included) that could remove records dwell still needs, each with the value it needs
    instead; empty when there is none. Compaction would keep one record per Pulsar topic."""
    return {k: v for k, v in KEEP_UNTIL_DELIVERED.items() if config.get(k) != v}


def retention_refusal(topic: str, config: Mapping[str, str], risks: Mapping[str, str],
                      cause: str) -> str:
    """Why a process refuses to start against ``topic``: the settings, and what to do."""
    found = ", ".join(f"{k}={config.get(k, '(unknown)')}" for k in risks)
    wanted = ", ".join(f"{k}={v}" for k, v in risks.items())
    return (f"topic {topic} has {found}, which could drop pending messages, and dwell "
            f"cannot change it ({cause}): set {wanted} on {topic}, or grant dwell "
            "DESCRIBE_CONFIGS and ALTER_CONFIGS on it")


def _config_error(exc: KafkaException, what: str) -> str:
    err = exc.args[0]
    if err.retriable() or err.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                                         KafkaError._ALL_BROKERS_DOWN):
        raise KafkaUnavailable(f"{what}: {err.str()}") from exc
    return err.name()


def ensure_retention(bootstrap: str, topic: str, timeout: float = 15.0) -> dict[str, str]:
    """Make an existing ``topic`` keep its records until dwell removes them, altering what
    an operator (or the broker's defaults) set; returns the settings changed. Raises
    RetentionRefused when Kafka refuses to show or change them, KafkaUnavailable when it
    cannot answer."""
    client = admin(bootstrap)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        entries = client.describe_configs([res])[res].result(timeout)
    except KafkaException as exc:
        cause = _config_error(exc, f"describe configs of {topic}")
        raise RetentionRefused(retention_refusal(topic, {}, KEEP_UNTIL_DELIVERED,
                                                 cause)) from exc
    config = {k: e.value for k, e in entries.items()}
    risks = retention_risks(config)
    if not risks:
        return {}
    alter = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in risks.items()])
    try:
        client.incremental_alter_configs([alter])[alter].result(timeout)
    except KafkaException as exc:
        cause = _config_error(exc, f"alter configs of {topic}")
        raise RetentionRefused(retention_refusal(topic, config, risks, cause)) from exc
    log.warning("topic %s had %s; set to %s so that no pending message is dropped", topic,
                ", ".join(f"{k}={config.get(k)}" for k in risks),
                ", ".join(f"{k}={v}" for k, v in risks.items()))
    return risks


# The feeds a reader replays in full (policies, subscriptions): one record per key, the
# latest, compacted as soon as its segment rolls.
COMPACTED: dict[str, str] = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"} \
    | HOURLY_SEGMENTS
DWELL_TOPIC_DEFAULTS: dict[str, tuple[int, dict[str, str]]] = {
    names.POLICIES: (1, COMPACTED),
    names.PUBLISH: (4, BROKER_TIMESTAMPS),
    names.PUBLISH_RESULTS: (4, {}),
    names.DELAYED: (4, KEPT_TOPIC_CONFIG),
    names.REFILED: (4, KEPT_TOPIC_CONFIG),
    names.ACKS: (4, BROKER_TIMESTAMPS),
    names.DELIVERED: (4, KEPT_TOPIC_CONFIG),
    names.INVALID: (1, {}),
    names.SUBSCRIPTIONS: (1, COMPACTED),
}


def ensure_dwell_topics(bootstrap: str, replication: int = 1,
                        partitions: Mapping[str, int] | None = None) -> None:
    """Create dwell's own topics, with ``partitions`` where it names them; an existing
    dwell.publish or dwell.acks without broker timestamps is altered to have them, and the
    kept topics to keep their records. An existing topic keeps its partition count: one
    other than ``partitions`` asks for is logged, not changed (more partitions move keys,
    and with them the order of a subscription's events)."""
    for name, (default_parts, config) in DWELL_TOPIC_DEFAULTS.items():
        parts = (partitions or {}).get(name, default_parts)
        if not ensure_topic(bootstrap, name, parts, replication, config):
            enforced = {k: v for k, v in config.items() if k in BROKER_TIMESTAMPS}
            if enforced:
                ensure_topic_config(bootstrap, name, enforced)
            if partitions and name in partitions:
                has = partition_count(bootstrap, name)
                if has != parts:
                    log.warning("%s has %d partitions, not the %d set: an existing topic "
                                "keeps its count", name, has, parts)
    for name in KEPT_TOPICS:
        ensure_retention(bootstrap, name)


def ensure_topic_config(bootstrap: str, name: str, config: Mapping[str, str],
                        timeout: float = 15.0) -> bool:
    """Set ``config`` on an existing topic where its values differ; True when it altered
    it. KafkaUnavailable when Kafka cannot answer or refuses."""
    client = admin(bootstrap)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    try:
        current = client.describe_configs([resource])[resource].result(timeout)
        changes = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                   for k, v in config.items()
                   if k not in current or current[k].value != v]
        if not changes:
            return False
        altered = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=changes)
        client.incremental_alter_configs([altered])[altered].result(timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot set the config of topic {name}: {exc}") from exc
    return True


def topic_names(bootstrap: str, timeout: float = 15.0) -> set[str]:
    """Every topic the cluster has (one metadata request)."""
    try:
        return set(admin(bootstrap).list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise KafkaUnavailable(f"list_topics: {exc}") from exc


def partition_counts(bootstrap: str, timeout: float = 15.0) -> dict[str, int]:
    """Every topic the cluster has, with its number of partitions (one metadata request)."""
    try:
        md = admin(bootstrap).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"list_topics: {exc}") from exc
    return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}


def partition_count(bootstrap: str, topic: str, timeout: float = 15.0) -> int:
    """The number of partitions of one topic, 0 when the cluster has no such topic (one
    metadata request for that topic alone; dwell's brokers do not auto-create topics)."""
    try:
        md = admin(bootstrap).list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"list_topics {topic}: {exc}") from exc
    t = md.topics.get(topic)
    if t is None:
        return 0
    err = t.error
    if err is not None:
        if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return 0
        raise KafkaUnavailable(f"list_topics {topic}: {err.str()}")
    return len(t.partitions)


def delete_topic(bootstrap: str, name: str, timeout: float = 15.0) -> bool:
    """Delete a topic; False when there was none. KafkaUnavailable when Kafka cannot answer.
    Returns once the cluster's metadata no longer lists it, so that what follows (a list,
    a create of the same name) sees it gone."""
    client = admin(bootstrap)
    futures = client.delete_topics([name], operation_timeout=timeout)
    try:
        futures[name].result(timeout)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return False
        raise KafkaUnavailable(f"cannot delete topic {name}: {exc}") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if name not in client.list_topics(timeout=timeout).topics:
            return True
        time.sleep(0.05)
    raise KafkaUnavailable(f"topic {name} still listed {timeout}s after its deletion")


def add_partitions(bootstrap: str, topic: str, total: int, timeout: float = 15.0) -> None:
    """Grow ``topic`` to ``total`` partitions; returns once the cluster's metadata lists
    them all. KafkaUnavailable when Kafka cannot answer or refuses (the topic is gone,
    or already has that many)."""
    client = admin(bootstrap)
    futures = client.create_partitions([NewPartitions(topic, total)],
                                       operation_timeout=timeout)
    try:
        futures[topic].result(timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot grow {topic} to {total} partitions: {exc}") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t = client.list_topics(topic, timeout=timeout).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) >= total:
            return
        time.sleep(0.05)
    raise KafkaUnavailable(f"{topic}'s {total} partitions not visible after {timeout}s")


# What an offset commit from outside a group meets while the group has members.
MEMBERS_PRESENT = frozenset({KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                             KafkaError.REBALANCE_IN_PROGRESS})


def start_groups_at(bootstrap: str, groups: Iterable[str], offsets: Mapping[tuple[str, int], int],
                    timeout: float = 15.0) -> set[str]:
    """Commit ``offsets`` for each of ``groups`` that has no member now (Kafka takes an
    offset commit from outside a group only while it is empty); the groups it was
    committed for. KafkaUnavailable when Kafka cannot answer."""
    client = admin(bootstrap)
    parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
    futures = {g: client.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(g, parts)], request_timeout=timeout)[g]
        for g in groups}
    done = set()
    for group, future in futures.items():
        try:
            errors = [tp.error for tp in future.result(timeout).topic_partitions or []
                      if tp.error is not None]
        except KafkaException as exc:
            errors = [exc.args[0]]
        if not errors:
            done.add(group)
        elif all(e.code() in MEMBERS_PRESENT for e in errors):
            log.info("group %s has members: its offsets on %s are left to its consumers",
                     group, sorted({t for t, _ in offsets}))
        else:
            raise KafkaUnavailable(f"cannot commit offsets for group {group}: {errors[0]}")
    return done


def groups_reading(bootstrap: str, topic: str, timeout: float = 15.0) -> set[str]:
    """The consumer groups that read ``topic``: those with a member assigned one of its
    partitions, and those with an offset committed on it (a subscription kept while no
    consumer is connected). One request per group for the offsets: for an admin call,
    not a hot path. KafkaUnavailable when Kafka cannot answer."""
    client = admin(bootstrap)
    try:
        groups = [g.group_id for g in
                  client.list_consumer_groups(request_timeout=timeout).result(timeout).valid]
        if not groups:
            return set()
        found = set()
        described = client.describe_consumer_groups(groups, request_timeout=timeout)
        for group, future in described.items():
            members = future.result(timeout).members
            if any(tp.topic == topic for m in members
                   for tp in (m.assignment.topic_partitions if m.assignment else [])):
                found.add(group)
        offsets = {g: client.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g)], request_timeout=timeout)[g]
            for g in groups if g not in found}
        for group, future in offsets.items():
            if any(tp.topic == topic and tp.offset >= 0
                   for tp in future.result(timeout).topic_partitions or []):
                found.add(group)
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot list the consumer groups of {topic}: {exc}") from exc
    return found


def partitions(bootstrap: str, topic: str, timeout: float = 15.0) -> list[int]:
    """The partition ids of an existing topic; KafkaUnavailable when it is not there or
    Kafka does not answer."""
    try:
        md = admin(bootstrap).list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"partitions of {topic}: {exc.args[0].str()}") from exc
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise KafkaUnavailable(f"topic {topic} not found")
    return sorted(t.partitions)


def end_offsets(bootstrap: str, topic: str, timeout: float = 15.0) -> dict[int, int]:
    """The high watermark (next offset to be written) of every partition of a topic."""
    c = _Consumer({**connection(bootstrap), "group.id": "dwell-reader"})
    try:
        return {p: watermarks(c, topic, p, timeout)[1]
                for p in partitions(bootstrap, topic, timeout)}
    finally:
        close_within(c)


def delete_below(bootstrap: str, offsets: Mapping[tuple[str, int], int],
                 timeout: float = 15.0) -> dict[tuple[str, int], int]:
    """Delete the records of each (topic, partition) below its offset (Kafka's
    DeleteRecords: the partition's start offset moves up, its segments below go);
    returns how many records each partition lost, for those whose start was below."""
    c = _Consumer({**connection(bootstrap), "group.id": "dwell-reader"})
    try:
        starts = {tp: watermarks(c, tp[0], tp[1], timeout)[0] for tp in offsets}
    finally:
        close_within(c)
    wanted = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if o > starts[(t, p)]]
    if not wanted:
        return {}
    client = admin(bootstrap)
    out: dict[tuple[str, int], int] = {}
    for tp, fut in client.delete_records(wanted, request_timeout=timeout,
                                         operation_timeout=timeout).items():
        try:
            low = fut.result(timeout).low_watermark
        except KafkaException as exc:
            raise KafkaUnavailable(f"delete records of {tp.topic}[{tp.partition}] below "
                                   f"{tp.offset}: {exc.args[0].str()}") from exc
        out[(tp.topic, tp.partition)] = low - starts[(tp.topic, tp.partition)]
    return out


class LogStarts:
    """The first offset each partition still holds: below it, records were removed (by
    retention, an operator's DeleteRecords, the trim). One admin client, kept open; one
    ListOffsets request per broker for any number of partitions."""

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self._admin = admin(bootstrap)

    def get(self, tps: Iterable[tuple[str, int]],
            timeout: float = 15.0) -> dict[tuple[str, int], int]:
        wanted = {TopicPartition(t, p): OffsetSpec.earliest() for t, p in tps}
        if not wanted:
            return {}
        out: dict[tuple[str, int], int] = {}
        for tp, fut in self._admin.list_offsets(wanted, request_timeout=timeout).items():
            try:
                out[(tp.topic, tp.partition)] = fut.result(timeout).offset
            except KafkaException as exc:
                # A client that met a restarted broker can keep its stale leaders (leader
                # epoch fenced, no leaders found) for good: the next call gets a new one.
                self._admin = admin(self._bootstrap)
                raise KafkaUnavailable(f"first offset of {tp.topic}[{tp.partition}]: "
                                       f"{exc.args[0].str()}") from exc
        return out


def offsets_at(bootstrap: str, topic: str, ts_ms: int, timeout: float = 15.0) -> dict[int, int]:
    """Per partition of an existing topic, the first offset whose record timestamp is at or
    after ``ts_ms`` (the partition's end offset when there is none)."""
    c = _Consumer({**connection(bootstrap), "group.id": "dwell-reader"})
    try:
        wanted = [TopicPartition(topic, p, ts_ms)
                  for p in partitions(bootstrap, topic, timeout)]
        try:
            found = c.offsets_for_times(wanted, timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(f"offsets_for_times {topic}: {exc}") from exc
        return {tp.partition: tp.offset if tp.offset >= 0
                else watermarks(c, topic, tp.partition, timeout)[1] for tp in found}
    finally:
        close_within(c)


def start_group_at_end(bootstrap: str, group_id: str, topics: Iterable[str]) -> None:
    """Commit the current end offsets of ``topics`` (created when missing) for a fresh
    consumer group, so that it reads only what is written from now on."""
    c = Consumer(bootstrap, group_id)
    try:
        offsets: dict[tuple[str, int], int] = {}
        for t in topics:
            ensure_topic(bootstrap, t, DWELL_TOPIC_DEFAULTS.get(t, (1, {}))[0])
            offsets |= {(t, p): o for p, o in end_offsets(bootstrap, t).items()}
        c.commit(offsets)
    finally:
        c.close()
