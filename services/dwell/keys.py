"""Every Redis key dwell uses, built here and nowhere else.

A topic's keys share the hash tag `{<topic>}` (the full Pulsar name, which can
hold no braces) so that Redis Cluster keeps them on one slot and Lua scripts may
touch them together.
"""

from __future__ import annotations

# -- the shared per-topic index (tracker; docs/architecture.md "Redis keys")


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


def sub_prefix(topic: str, subscription: str) -> str:
    return f"dwell:sub:{{{topic}}}:{subscription}:"


# -- the policy store (policy service)

POLICY_VERSION = "dwell:policy:version"  # INCR counter, the `version` on dwell.policies
TENANTS = "dwell:policy:tenants"  # SET of tenant names
# ZSET scope -> version of its latest change (live or removed): what the change feed must
# carry. Scopes are the `dwell.policies` keys (`tenant:t`, `namespace:t/ns`, `ns:t/ns`,
# `topic:persistent://t/ns/x`); the policy service republishes any it finds behind.
POLICY_SCOPES = "dwell:policy:scopes"
# STRING: a random id written once the store holds everything `dwell.policies` holds (at
# first start, and after each rebuild). Its absence means Redis lost the store (FLUSHALL,
# a restart without its data): the policy service rebuilds it from the feed.
POLICY_EPOCH = "dwell:policy:epoch"
# SET of the tokens of rebuilds under way: a rebuild writes the epoch only if its token is
# still there, so a store that lost data while being rebuilt is not marked complete.
POLICY_REBUILDS = "dwell:policy:rebuilds"


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


# -- tracker: keys beyond docs/architecture.md's list (owner: dwell.tracker).
# Per-topic keys keep the `{topic}` hash tag; `index_keys()` bundles the shapes one
# index (a topic's, or one subscription's redeliveries) uses, so one Lua script and
# one Python class serve both.

TOPICS = "dwell:topics"  # SET of Pulsar topics the tracker has indexed (no hash tag: global)
# ZSET topic -> earliest bucketStart holding messages or an outstanding claim; a hint
# for due_topics(). Global (no hash tag): an addition to docs/architecture.md's list, and
# the one key the claim/complete scripts touch outside the topic's slot.
DUE = "dwell:due"
DUE_SUBSCRIPTIONS = "dwell:due:subs"  # ZSET "<topic> <sub>" -> earliest redelivery bucket


# HASH index field (dwell.core.positions.index_field) -> the next offset of that delay-log
# partition the ingest has indexed, written in the same pipeline as the positions (after
# them). Redis losing it, or holding less than the tracker wrote, is how the tracker sees
# that Redis lost writes (dwell.tracker.recovery).
INGESTED = "dwell:trk:ingested"
# STRING, expiring: the id of the tracker replica that does the bookkeeping every replica
# would otherwise repeat (the index figures its metrics export, the low watermarks;
# dwell.tracker.lease).
TRACKER_LEASE = "dwell:trk:bookkeeper"
# STRING: the offset of `dwell.subscriptions` below which Redis holds every registration
# (`dwell:subs:{topic}`). Only a rebuild of the registry creates it, so a Redis that lost
# it lost the registry; a value below what the tracker wrote means a rollback
# (dwell.tracker.registry).
SUBSCRIPTIONS_APPLIED = "dwell:trk:subs:applied"
# ZSET per tracker group: the committed low watermarks each trim round read (member: JSON
# `{"at": ms, "lows": {"<log>:<partition>": offset}}`, score: when), the newest one at
# least DWELL_TRIM_KEEP_DELIVERED_MS old and every one after it (dwell.tracker.trim). Kept
# so that a restart does not hold the trim back for a whole keep; losing it only does.


def trim_rounds(tracker_group: str) -> str:
    return f"dwell:trk:trim:{tracker_group}"


# HASH partition of dwell.acks -> the offset below which the subscriptions' redelivery
# indexes hold every event's decisions. Only a rebuild creates it (the backoff's writes
# move it only while it exists), so a Redis without it lost them; a value below what the
# backoff wrote means a rollback (dwell_spark.recovery).
BACKOFF_APPLIED = "dwell:backoff:applied"


def subscriptions(topic: str) -> str:
    """HASH subscription -> its redelivery settings JSON (tracker's subscription registry)."""
    return f"dwell:subs:{{{topic}}}"


def sub_reservations(topic: str) -> str:
    """ZSET subscription -> expiry (ms): places held for registrations under way, so that
    maxSubscriptionsPerTopic is counted and taken in one step (tracker/lua/reserve-2.lua)."""
    return f"dwell:subs:{{{topic}}}:reserved"


def sub_counts(topic: str, subscription: str) -> str:
    """HASH messageId -> redelivery count of its pending index entry, for one
    subscription; -(count + 1) marks a dead letter (the drain sends it to the DLQ)."""
    return f"dwell:sub:{{{topic}}}:{subscription}:cnt"


def sub_pending(topic: str, subscription: str) -> str:
    """HASH messageId -> "dueAt,bucket,storedCount" of its pending index entry, for one
    subscription: what a later event of the message cancels (written by the backoff,
    deleted by the drain once it claimed the entry's bucket)."""
    return f"dwell:sub:{{{topic}}}:{subscription}:pend"


def sub_redelivery(topic: str, subscription: str) -> IndexKeys:
    return IndexKeys(prefix=sub_prefix(topic, subscription), index=sub_index(topic, subscription),
                     bucket_prefix=sub_prefix(topic, subscription) + "bkt:")


def topic_index(topic: str) -> IndexKeys:
    return IndexKeys(prefix=f"dwell:trk:{{{topic}}}:", index=index(topic),
                     bucket_prefix=bucket_prefix(topic))


class IndexKeys:
    """The keys of one Roaring index. Besides ARCHITECTURE's idx ZSET and bkt HASHes:

    - `<prefix>dlt:<b>`   STRING, appended 12-byte entries (u32 field, u64 offset, little
      endian) not yet compacted into bucket b's blobs;
    - `<prefix>dirty`     ZSET bucketStart -> bytes of its deltas, buckets to compact;
    - `<prefix>claims`    ZSET bucketStart -> lease expiry (ms), buckets handed to a drainer;
    - `<prefix>leases`    HASH bucketStart -> lease id;
    - `<prefix>clm:<b>`   LIST field, blob, field, blob, ... : a claimed bucket's blobs;
    - `<prefix>clmd:<b>`  STRING: a claimed bucket's deltas;
    - `<prefix>changes`   STREAM: entries `b` = bucket starts appended to, claimed or
      completed, a topic index only (index/lua/append-3.lua, claim-6.lua,
      complete-7.lua; read by dwell.tracker.index_view);
    - `<prefix>restaged`  STRING: the last chunk of buckets the tracker re-filed (a topic
      index only; dwell.tracker.restage);
    - `<prefix>cancelled` ZSET "<partition>:<offset>" -> bucketStart: cancelled messages
      (by the position in `dwell.delayed` their messageId names) the drain leaves out
      until it completes their bucket (a topic index only; index/lua/cancel-5.lua);
    - `<prefix>scheduled` HASH scheduleKey -> "<bucketStart> <partition>:<offset>": the
      newest message indexed with each schedule key, which a newer one replaces (a topic
      index only; index/lua/cancel-5.lua).
    """

    __slots__ = ("prefix", "index", "bucket_prefix")

    def __init__(self, prefix: str, index: str, bucket_prefix: str) -> None:
        self.prefix = prefix
        self.index = index
        self.bucket_prefix = bucket_prefix

    def bucket(self, bucket_start: int) -> str:
        return f"{self.bucket_prefix}{bucket_start}"

    @property
    def delta_prefix(self) -> str:
        return f"{self.prefix}dlt:"

    def delta(self, bucket_start: int) -> str:
        return f"{self.prefix}dlt:{bucket_start}"

    @property
    def dirty(self) -> str:
        return f"{self.prefix}dirty"

    @property
    def claims(self) -> str:
        return f"{self.prefix}claims"

    @property
    def leases(self) -> str:
        return f"{self.prefix}leases"

    @property
    def claimed_prefix(self) -> str:
        return f"{self.prefix}clm:"

    def claimed(self, bucket_start: int) -> str:
        return f"{self.prefix}clm:{bucket_start}"

    @property
    def claimed_delta_prefix(self) -> str:
        return f"{self.prefix}clmd:"

    def claimed_delta(self, bucket_start: int) -> str:
        return f"{self.prefix}clmd:{bucket_start}"

    @property
    def changes(self) -> str:
        return f"{self.prefix}changes"

    @property
    def restaged(self) -> str:
        return f"{self.prefix}restaged"

    @property
    def cancelled(self) -> str:
        return f"{self.prefix}cancelled"

    @property
    def scheduled(self) -> str:
        return f"{self.prefix}scheduled"
