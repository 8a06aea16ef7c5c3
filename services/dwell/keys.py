"""Every Redis key dwell uses, built here and nowhere else.

A topic's keys share the hash tag `{<topic>}` (the full Pulsar name, which can
hold no braces) so that Redis Cluster keeps them on one slot and Lua scripts may
touch them together.
"""

from __future__ import annotations

# -- the shared per-topic index (tracker; ARCHITECTURE.md "Redis keys")


def index(topic: str) -> str:
    """ZSET: bucketStart (ms) -> bucketStart, for buckets that hold delayed messages."""
    return f"dwell:idx:{{{topic}}}"


def bucket(topic: str, bucket_start: int) -> str:
    """HASH: partition -> serialized Roaring64 bitmap of offsets in dwell.delayed."""
    return f"dwell:bkt:{{{topic}}}:{bucket_start}"


def bucket_prefix(topic: str) -> str:
    return f"dwell:bkt:{{{topic}}}:"


def stats(topic: str) -> str:
    """HASH of counters for one topic (messages, bytes)."""
    return f"dwell:stats:{{{topic}}}"


# -- one subscription's redeliveries: the same two shapes


def sub_index(topic: str, subscription: str) -> str:
    return f"dwell:sub:{{{topic}}}:{subscription}:idx"


def sub_bucket(topic: str, subscription: str, bucket_start: int) -> str:
    return f"dwell:sub:{{{topic}}}:{subscription}:bkt:{bucket_start}"


def sub_prefix(topic: str, subscription: str) -> str:
    return f"dwell:sub:{{{topic}}}:{subscription}:"


# -- the policy store (policy service)

POLICY_VERSION = "dwell:policy:version"  # INCR counter, the `version` on dwell.policies
TENANTS = "dwell:policy:tenants"  # SET of tenant names


def tenant(name: str) -> str:
    """STRING: the tenant's TenantInfo JSON."""
    return f"dwell:policy:tenant:{name}"


def namespaces(tenant_name: str) -> str:
    """SET of namespace names (`tenant/ns`) of one tenant."""
    return f"dwell:policy:namespaces:{tenant_name}"


def namespace(ns: str) -> str:
    """STRING: marker that namespace `tenant/ns` exists (its creation JSON)."""
    return f"dwell:policy:namespace:{ns}"


def namespace_policy(ns: str) -> str:
    """STRING: the namespace's DelayedDeliveryPolicies JSON with its version."""
    return f"dwell:policy:ns:{ns}"


def topic_policy(topic: str) -> str:
    """STRING: a topic's DelayedDeliveryPolicies JSON with its version."""
    return f"dwell:policy:topic:{topic}"


def namespace_topic_policies(ns: str) -> str:
    """SET of topics in namespace `tenant/ns` that have a topic policy."""
    return f"dwell:policy:nstopics:{ns}"
