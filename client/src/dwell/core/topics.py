"""Pulsar topic names, their one-to-one mapping onto Kafka topic names, and every Kafka
topic name dwell itself uses.

Mapping rule (the README quotes it):

* ``persistent://<tenant>/<namespace>/<topic>`` → ``<tenant>.<namespace>.<topic>``
* ``non-persistent://<tenant>/<namespace>/<topic>`` →
  ``non-persistent.<tenant>.<namespace>.<topic>``, so four dot-separated parts mean
  non-persistent and three mean persistent.
* Inside each part, characters in ``[A-Za-z0-9_-]`` stand for themselves; every other
  character is written as its UTF-8 bytes, each byte as ``..`` followed by two lowercase
  hex digits (``.`` → ``..2e``, ``:`` → ``..3a``, ``é`` → ``..c3..a9``).
* Reading back: a ``.`` followed by ``.`` and two hex digits starts an escape; any other
  ``.`` separates parts. Parts are never empty, so a separator followed by an escape
  (``...2e``) still reads one way only.
* A name whose Kafka form is longer than 249 characters (Kafka's limit) is refused, and
  the tenant ``dwell`` is reserved because its names would collide with dwell's own
  topics below.

Per-subscription redeliveries go to ``<ready>-<subscription>-RETRY`` and dead letters to
``<ready>-<subscription>-DLQ`` (Pulsar's names), with the subscription escaped the same way.

A subscription's Kafka consumer group is ``<ready>/<subscription>`` (``group_id``): unique
per tenant, namespace, topic and subscription, since ``/`` never occurs in a Kafka topic
name, and starting with the ready topic, so that a prefix ACL ``<tenant>.`` on groups
covers exactly the groups of a tenant's persistent topics.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final

POLICIES: Final = "dwell.policies"
PUBLISH: Final = "dwell.publish"
PUBLISH_RESULTS: Final = "dwell.publish.results"
# The second part of a tenant's own copy of its results (tenant_results_topic).
TENANT_RESULTS: Final = "dwell-publish-results"
DELAYED: Final = "dwell.delayed"
# The tracker's re-filed copies of long, varied delays (dwell.tracker.restage).
REFILED: Final = "dwell.delayed.refiled"
ACKS: Final = "dwell.acks"
# What the drain (and the restage, for the originals it moved) took out of the index, per
# completed bucket: the record of delivered positions a rebuild of the index skips.
DELIVERED: Final = "dwell.delivered"
# Compacted record of the tracker's subscription registry: key "<topic> <subscription>",
# value the settings JSON, a tombstone when the subscription is deleted.
SUBSCRIPTIONS: Final = "dwell.subscriptions"
# Malformed records read from dwell.publish and dwell.acks, set aside with the reason
# (dwell.core.invalid) so that their readers go on.
INVALID: Final = "dwell.invalid"

# Pulsar names partition i of a partitioned topic x `x-partition-i`; dwell's ready topic
# for x has i as a Kafka partition.
PARTITION_SUFFIX: Final = "-partition-"

PERSISTENT: Final = "persistent"
NON_PERSISTENT: Final = "non-persistent"
DOMAINS: Final = (PERSISTENT, NON_PERSISTENT)
RESERVED_TENANT: Final = "dwell"
KAFKA_MAX_TOPIC_LENGTH: Final = 249
MAX_SUBSCRIPTION_LENGTH: Final = 200

# Pulsar's NamespaceName/TenantResources pattern; Java's \w is ASCII-only, so is ours.
_TENANT_OR_NAMESPACE = re.compile(r"[-=:.\w]+", re.ASCII)
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# Uppercase hex is read so that the canonical-form check can name the problem.
_HEX = frozenset("0123456789abcdefABCDEF")


class InvalidTopicName(ValueError):
    """A topic, tenant, namespace or subscription name dwell cannot accept."""


def _bad_char(part: str) -> str | None:
    """Describe the first character a name part may not contain, or None."""
    for ch in part:
        if ch.isspace():
            return "whitespace"
        if ch in "{}":
            return f"'{ch}'"
        if ch == "/":
            return "'/'"
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs"):
            return f"control character U+{ord(ch):04X}"
    return None


def _check_part(what: str, part: str) -> None:
    if not part:
        raise InvalidTopicName(f"{what} name must not be empty")
    bad = _bad_char(part)
    if bad is not None:
        raise InvalidTopicName(f"{what} name {part!r} must not contain {bad}")


def validate_tenant(name: str) -> str:
    """Return ``name`` if it is a usable tenant name, else raise InvalidTopicName."""
    _check_part("tenant", name)
    if not _TENANT_OR_NAMESPACE.fullmatch(name):
        raise InvalidTopicName(
            f"tenant name {name!r} may only contain letters, digits, '_', '-', '=', ':' and '.'"
        )
    if name == RESERVED_TENANT:
        raise InvalidTopicName(
            f"tenant name {name!r} is reserved: dwell's own Kafka topics use the prefix 'dwell.'"
        )
    return name


def validate_new_tenant(name: str) -> str:
    """:func:`validate_tenant`, and what a tenant being created must also be: the Kafka
    ACLs grant its users every name that starts with its prefixes (``<tenant>.``,
    ``non-persistent.<tenant>.``), so these must start no other tenant's names and none of
    dwell's own topics and groups. Hence only characters Kafka names write as themselves
    (an escaped one begins ``..``: tenant ``a``'s prefix ``a.`` starts ``a..2eb.``, tenant
    ``a.b``'s), and not ``non-persistent`` (its prefix starts every tenant's non-persistent
    topics) nor ``dwell-`` names (dwell's groups, ``dwell-tracker.lowmark`` among them).
    Existing tenants keep their names: only creation is checked."""
    validate_tenant(name)
    if any(ch not in _PLAIN for ch in name):
        raise InvalidTopicName(
            f"tenant name {name!r} may only contain letters, digits, '_' and '-': Kafka names "
            "write any other character as '..' and hex digits, so another tenant's Kafka "
            "prefix would match this tenant's topics"
        )
    if name == NON_PERSISTENT:
        raise InvalidTopicName(
            f"tenant name {name!r} is reserved: its Kafka prefix '{name}.' starts every "
            "tenant's non-persistent topics"
        )
    if name.startswith(RESERVED_TENANT + "-"):
        raise InvalidTopicName(
            f"tenant name {name!r} is reserved: names starting '{RESERVED_TENANT}-' are "
            "dwell's own Kafka consumer groups"
        )
    return name


def validate_namespace(tenant: str, ns: str) -> str:
    """Validate tenant and namespace together; return the namespace part (``ns``)."""
    validate_tenant(tenant)
    _check_part("namespace", ns)
    if not _TENANT_OR_NAMESPACE.fullmatch(ns):
        raise InvalidTopicName(
            f"namespace name {ns!r} may only contain letters, digits, '_', '-', '=', ':' and '.'"
        )
    return ns


def validate_subscription(name: str) -> str:
    """Return ``name`` if it is a usable subscription name, else raise InvalidTopicName."""
    if not name:
        raise InvalidTopicName("subscription name must not be empty")
    if len(name) > MAX_SUBSCRIPTION_LENGTH:
        raise InvalidTopicName(
            f"subscription name is {len(name)} characters long; "
            f"the limit is {MAX_SUBSCRIPTION_LENGTH}"
        )
    for ch in name:
        if ch.isspace():
            raise InvalidTopicName(f"subscription name {name!r} must not contain whitespace")
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs"):
            raise InvalidTopicName(
                f"subscription name {name!r} must not contain control character U+{ord(ch):04X}"
            )
    return name


def tenant_results_topic(tenant: str) -> str:
    """The Kafka topic with the publish results of `tenant`'s requests on dwell.publish,
    a copy of theirs on `dwell.publish.results` that only the tenant's principals read:
    it starts with the tenant's prefix `<tenant>.`, which their ACLs cover, and has two
    parts, so it is no ready, retry or DLQ topic (three)."""
    return f"{escape_kafka_part(tenant)}.{TENANT_RESULTS}"


def escape_kafka_part(part: str) -> str:
    """Write one name part in the Kafka alphabet (see the module docstring)."""
    out: list[str] = []
    for ch in part:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f"..{b:02x}" for b in ch.encode("utf-8"))
    return "".join(out)


def _split_kafka(name: str) -> list[str]:
    """Split a Kafka name into decoded parts; raise InvalidTopicName on malformed input."""
    parts: list[str] = []
    buf = bytearray()
    i, n = 0, len(name)
    while i < n:
        ch = name[i]
        if ch == ".":
            if i + 3 < n and name[i + 1] == "." and name[i + 2] in _HEX and name[i + 3] in _HEX:
                buf.append(int(name[i + 2 : i + 4], 16))
                i += 4
                continue
            if not buf:
                raise InvalidTopicName(f"Kafka topic {name!r} has an empty part")
            parts.append(_decode(name, buf))
            buf = bytearray()
        elif ch in _PLAIN:
            buf.append(ord(ch))
        else:
            raise InvalidTopicName(
                f"Kafka topic {name!r} contains {ch!r}, which dwell's name mapping never writes"
            )
        i += 1
    if not buf:
        raise InvalidTopicName(f"Kafka topic {name!r} has an empty part")
    parts.append(_decode(name, buf))
    return parts


def _decode(name: str, buf: bytearray) -> str:
    try:
        return buf.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidTopicName(f"Kafka topic {name!r} escapes bytes that are not UTF-8") from None


def _check_kafka_length(kafka: str, what: str) -> str:
    if len(kafka) > KAFKA_MAX_TOPIC_LENGTH:
        raise InvalidTopicName(
            f"{what} maps to a Kafka topic of {len(kafka)} characters; "
            f"Kafka allows at most {KAFKA_MAX_TOPIC_LENGTH}"
        )
    return kafka


@dataclass(frozen=True)
class TopicName:
    """A validated Pulsar topic name; constructing one directly validates it too."""

    domain: str
    tenant: str
    namespace: str
    local: str

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise InvalidTopicName(
                f"topic domain {self.domain!r} must be 'persistent' or 'non-persistent'"
            )
        validate_namespace(self.tenant, self.namespace)
        _check_part("topic", self.local)
        _check_kafka_length(self.kafka_topic, f"topic '{self}'")

    @classmethod
    def of(cls, domain: str, tenant: str, namespace: str, local: str) -> TopicName:
        return cls(domain, tenant, namespace, local)

    @classmethod
    def parse(cls, s: str) -> TopicName:
        """Parse ``persistent://t/ns/x`` or ``non-persistent://t/ns/x``."""
        domain, sep, rest = s.partition("://")
        if not sep:
            raise InvalidTopicName(
                f"topic {s!r} must start with 'persistent://' or 'non-persistent://'"
            )
        if domain not in DOMAINS:
            raise InvalidTopicName(
                f"topic {s!r} has domain {domain!r}; use 'persistent' or 'non-persistent'"
            )
        parts = rest.split("/")
        if len(parts) != 3:
            raise InvalidTopicName(
                f"topic {s!r} must have exactly three parts after '{domain}://': "
                "tenant/namespace/topic"
            )
        return cls(domain, *parts)

    @classmethod
    def from_kafka(cls, name: str) -> TopicName:
        """Invert :attr:`kafka_topic`; only canonical Kafka forms are accepted."""
        parts = _split_kafka(name)
        if len(parts) == 4 and parts[0] == NON_PERSISTENT:
            topic = cls(NON_PERSISTENT, parts[1], parts[2], parts[3])
        elif len(parts) == 3:
            topic = cls(PERSISTENT, *parts)
        else:
            raise InvalidTopicName(
                f"Kafka topic {name!r} is not a dwell ready topic: expected "
                "<tenant>.<namespace>.<topic> or non-persistent.<tenant>.<namespace>.<topic>"
            )
        # Uppercase hex or needless escapes decode fine but are not what dwell writes;
        # refusing them keeps the mapping one-to-one.
        if topic.kafka_topic != name:
            raise InvalidTopicName(
                f"Kafka topic {name!r} is not in canonical form (expected {topic.kafka_topic!r})"
            )
        return topic

    @property
    def persistent(self) -> bool:
        return self.domain == PERSISTENT

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def kafka_topic(self) -> str:
        body = ".".join(escape_kafka_part(p) for p in (self.tenant, self.namespace, self.local))
        return body if self.persistent else f"{NON_PERSISTENT}.{body}"

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def partition_index(self) -> int:
        """i when the name is Pulsar's partition `x-partition-i`, else -1 (Pulsar's
        TopicName.getPartitionIndex)."""
        base, sep, index = self.local.rpartition(PARTITION_SUFFIX)
        if sep and base and index.isascii() and index.isdigit() and len(index) < 10:
            return int(index)
        return -1

    @property
    def partitioned_topic(self) -> TopicName:
        """The partitioned topic a partition belongs to; the topic itself otherwise."""
        if self.partition_index < 0:
            return self
        return TopicName(self.domain, self.tenant, self.namespace,
                         self.local.rpartition(PARTITION_SUFFIX)[0])

    def partition(self, index: int) -> TopicName:
        return TopicName(self.domain, self.tenant, self.namespace,
                         f"{self.local}{PARTITION_SUFFIX}{index}")


def retry_topic(topic: TopicName, subscription: str) -> str:
    """The Kafka topic holding ``subscription``'s redeliveries of ``topic``."""
    return _per_subscription(topic, subscription, "RETRY")


def dlq_topic(topic: TopicName, subscription: str) -> str:
    """The Kafka topic holding ``subscription``'s dead letters from ``topic``."""
    return _per_subscription(topic, subscription, "DLQ")


def _per_subscription(topic: TopicName, subscription: str, suffix: str) -> str:
    validate_subscription(subscription)
    kafka = f"{topic.kafka_topic}-{escape_kafka_part(subscription)}-{suffix}"
    return _check_kafka_length(kafka, f"the {suffix} topic of '{topic}' for '{subscription}'")


# Never in a Kafka topic name ([A-Za-z0-9._-]), so a group id splits back one way.
GROUP_SEPARATOR: Final = "/"


def group_id(topic: TopicName, subscription: str) -> str:
    """The Kafka consumer group of ``subscription`` on ``topic`` (see the module's text)."""
    validate_subscription(subscription)
    return f"{topic.kafka_topic}{GROUP_SEPARATOR}{subscription}"


def subscription_of_group(topic: TopicName, group: str) -> str:
    """The subscription a Kafka consumer group reading ``topic``'s ready topic stands for:
    the subscription of a ``group_id`` of the topic, else the group itself (a plain Kafka
    consumer's group is its subscription)."""
    prefix = f"{topic.kafka_topic}{GROUP_SEPARATOR}"
    return group.removeprefix(prefix) if group.startswith(prefix) else group
