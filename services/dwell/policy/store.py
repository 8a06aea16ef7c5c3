"""The policy store in Redis: tenants, namespaces and delayed-delivery policies, each
record saved as the exact JSON its `dwell.policies` record carries
(`{"version", "scope", ...}`, docs/internals.md), written by Lua scripts so that every
check-and-write (exists? empty? parent there?) and its version are one atomic step.

The store runs on one Redis node: its keys (dwell.keys, policy section) share no hash tag.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Final

import orjson
import pydantic
import redis.asyncio as aredis
from pydantic import ConfigDict

from dwell import keys, policy_view
from dwell.adapters import redis as redis_adapter
from dwell.core import topics
from dwell.core.authz import AuthAction, Grants, auth_policies, namespace_auth
from dwell.core.policy import DelayedDeliveryPolicies
from dwell.core.topics import TopicName

# Pulsar 4.0's texts (pulsar-broker's TenantsBase, NamespacesBase, AdminResource), which
# pulsar-admin prints and its users grep for; Pulsar words one case differently per call.
TENANT_MISSING = "Tenant does not exist"  # get a tenant, create a namespace in it
TENANT_MISSING_ON_DELETE = "Tenant doesn't exist"
TENANT_MISSING_ON_LIST = "Tenant not found"  # list its namespaces
TENANT_EXISTS = "Tenant already exist"
TENANT_NOT_EMPTY = "The tenant still has active namespaces"
NAMESPACE_MISSING = "Namespace does not exist"
# Pulsar's text where it writes one field of a namespace's policies that is not there
# (NamespacesBase.internalSetPolicies): setting or removing its delayed-delivery policy.
NAMESPACE_POLICIES_MISSING = "Namespace policies does not exist"
NAMESPACE_EXISTS = "Namespace already exists"
NAMESPACE_NOT_EMPTY = "Cannot delete non empty namespace"


class Refused(Exception):
    """What the store refuses, with Pulsar's text (`reason`). The HTTP layer answers each
    kind with its status (dwell.policy.app.REFUSALS)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Missing(Refused):
    """The tenant or namespace (or its policies) is not there."""


class Exists(Refused):
    """The tenant or namespace is there already."""


class InUse(Refused):
    """The tenant still has namespaces, or the namespace topics or policies."""


class TooLarge(Refused):
    """The record would be bigger than `dwell.policies` carries."""


def tenant_missing_on_update(tenant: str) -> str:
    return f"Tenant {tenant} not found"


def namespace_missing_on_delete(ns: str) -> str:
    return f"Namespace {ns} does not exist."

# Return codes of lua/put-6.lua, remove-7.lua and namespace_delete-7.lua.
ABSENT = 0
PARENT_MISSING = -1
EXISTS = -2
NOT_EMPTY = -2
CHANGED = -3
STORE_BEHIND = -4


class StoreBehind(Exception):
    """A write script found the store behind `dwell.policies` (no epoch, or its version
    counter below the feed's highest version) and wrote nothing: the store must be
    rebuilt (dwell.policy.rebuild) before the write is tried again."""

LUA = Path(__file__).parent / "lua"

Change = tuple[str, int]  # (scope, version) of one write, to publish on the feed


# Bounds of a tenant's lists, so that every tenant record fits on dwell.policies and
# costs its readers (admission, the tracker, the authorization checks) little.
MAX_ADMIN_ROLES: Final = policy_view.MAX_ADMIN_ROLES
MAX_ALLOWED_CLUSTERS: Final = 100
MAX_NAME_CHARS: Final = 256
Name = Annotated[str, pydantic.StringConstraints(max_length=MAX_NAME_CHARS)]


class TenantInfo(pydantic.BaseModel):
    """Pulsar's TenantInfo, the body of `PUT /admin/v2/tenants/{tenant}`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    adminRoles: list[Name] = pydantic.Field([], max_length=MAX_ADMIN_ROLES)
    allowedClusters: list[Name] = pydantic.Field([], max_length=MAX_ALLOWED_CLUSTERS)


# -- scopes: the keys of `dwell.policies`, and the Redis record each one names


def tenant_scope(tenant: str) -> str:
    return f"tenant:{tenant}"


def namespace_scope(ns: str) -> str:
    return f"namespace:{ns}"


def namespace_policy_scope(ns: str) -> str:
    return f"ns:{ns}"


def topic_scope(topic: TopicName) -> str:
    return f"topic:{topic}"


def scope_key(scope: str) -> str:
    """The Redis key holding a scope's record."""
    kind, _, name = scope.partition(":")
    build = {"tenant": keys.tenant, "namespace": keys.namespace,
             "ns": keys.namespace_policy, "topic": keys.topic_policy}.get(kind)
    if build is None or not name:
        raise ValueError(f"not a policy scope: {scope!r}")
    return build(name)


def scope_listing(scope: str) -> tuple[str, str]:
    """The SET that lists a scope's record and its member there, or ("", "") when no set
    lists it (a namespace's policy)."""
    kind, _, name = scope.partition(":")
    if kind == "tenant":
        return keys.TENANTS, name
    if kind == "namespace":
        return keys.namespaces(name.partition("/")[0]), name
    if kind == "topic":
        return keys.namespace_topic_policies(TopicName.parse(name).namespace_name), name
    return "", ""


# `{"version":` and the digits of a version, which the put script writes before a tail.
_VERSION_HEAD: Final = 32


def _tail(scope: str, **fields: Any) -> str:
    """The record's JSON after `{"version":N` (Lua prepends it once it holds the version)."""
    body = orjson.dumps({"scope": scope, **fields}).decode()
    return "," + body[1:]


def _policy(raw: bytes | None) -> DelayedDeliveryPolicies | None:
    if raw is None:
        return None
    return DelayedDeliveryPolicies.model_validate(orjson.loads(raw)["policy"])


class TopicPolicies(pydantic.BaseModel):
    """A topic's record: its two policies, as Pulsar keeps them, the local one (this
    cluster) and the global one (`isGlobal`, replicated to every cluster in Pulsar); and
    whether it is a partitioned topic of one partition (`partitioned`), which its ready
    topic, with one Kafka partition as a non-partitioned topic's, cannot tell."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    local: DelayedDeliveryPolicies | None = None
    global_: DelayedDeliveryPolicies | None = pydantic.Field(None, alias="global")
    partitioned: bool = False

    def level(self, is_global: bool) -> DelayedDeliveryPolicies | None:
        return self.global_ if is_global else self.local

    def with_level(self, is_global: bool,
                   policy: DelayedDeliveryPolicies | None) -> TopicPolicies:
        return self.model_copy(update={"global_" if is_global else "local": policy})

    @property
    def empty(self) -> bool:
        """Nothing left to keep: the record is removed."""
        return self.local is None and self.global_ is None and not self.partitioned

    def merged(self) -> DelayedDeliveryPolicies | None:
        """The topic level as admission resolves it: field by field the local value,
        else the global one (Pulsar's PolicyHierarchyValue: local, global, namespace,
        broker)."""
        if self.local is None:
            return self.global_
        if self.global_ is None:
            return self.local
        return DelayedDeliveryPolicies.model_validate(
            self.global_.model_dump(exclude_none=True) | self.local.model_dump(exclude_none=True))

    def record_fields(self) -> dict[str, Any]:
        """The record's fields after its scope: `policy` (what admission reads) plus the
        levels that are set."""
        merged = self.merged()
        fields: dict[str, Any] = {
            "policy": merged.model_dump(exclude_none=True) if merged is not None else None}
        if self.local is not None:
            fields["local"] = self.local.model_dump(exclude_none=True)
        if self.global_ is not None:
            fields["global"] = self.global_.model_dump(exclude_none=True)
        if self.partitioned:
            fields["partitioned"] = True
        return fields


def _topic_record(raw: bytes | None) -> tuple[int, TopicPolicies]:
    """(version, policies) of a topic's record; version 0 when there is none. A record
    written before local and global were kept apart holds only `policy`: the local one."""
    if raw is None:
        return 0, TopicPolicies()
    doc = orjson.loads(raw)
    if "local" not in doc and "global" not in doc:
        doc["local"] = doc["policy"]
    return int(doc["version"]), TopicPolicies.model_validate(doc)


# Versions are counted by Lua, whose numbers are doubles: exact up to 2**53.
MAX_VERSION: Final = 2**53


def unreadable(scope: str, version: int, value: bytes | None,
               max_record_bytes: int | None) -> str | None:
    """Why a `dwell.policies` record of a policy scope is not one the store can hold and
    read back (it was forged, or written by something else), or None when it is: a
    version out of range, a record over `max_record_bytes`, not a JSON object, or a body
    its scope's reads would fail on."""
    if not 0 <= version <= MAX_VERSION:
        return f"version {version} is out of range (0 to {MAX_VERSION})"
    if value is None:
        return None
    if max_record_bytes is not None and len(value) > max_record_bytes:
        return (f"{len(value)} bytes, more than max_policy_record_bytes "
                f"({max_record_bytes})")
    try:
        doc = orjson.loads(value)
        if not isinstance(doc, dict):
            return "not a JSON object"
        kind = scope.partition(":")[0]
        if kind == "tenant":
            TenantInfo.model_validate(doc["tenant"])
        elif kind == "namespace":
            perms = namespace_auth(doc)
            if not all(isinstance(a, list) and all(isinstance(x, str) for x in a)
                       for a in perms.values()):
                return "auth_policies.namespace_auth: each role's actions must be a list"
        elif kind == "ns":
            _policy(value)
        elif kind == "topic":
            _topic_record(value)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # pydantic's ValidationError is a ValueError; its first line names the model.
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


class PolicyStore:
    """`floor` answers the highest version the service has seen on `dwell.policies`: every
    write refuses (StoreBehind) while the version counter is below it or the epoch is gone,
    in the same script as the write."""

    def __init__(self, client: aredis.Redis, floor: Callable[[], int] = lambda: 0,
                 max_record_bytes: int | None = None) -> None:
        self.redis = client
        self._floor = floor
        self._scripts = redis_adapter.Scripts(client, LUA)
        self.max_record_bytes = max_record_bytes

    async def _run(self, script: str, keys_: list[str], args: list[str | int]) -> Any:
        return await self._scripts.run(script, keys_, args)

    async def _write(self, script: str, keys_: list[str], args: list[str | int]) -> Any:
        """Run a write script (put, remove, namespace_delete), whose last key is the epoch
        and last argument the floor; StoreBehind when it refused. A record too big for the
        feed (max_record_bytes) is refused (TooLarge) before the script runs: what is stored
        must fit on dwell.policies, or the feed could never carry it."""
        if script == "put" and self.max_record_bytes is not None:
            size = len(args[4].encode()) + _VERSION_HEAD if isinstance(args[4], str) else 0
            if size > self.max_record_bytes:
                raise TooLarge(f"{args[3]}: the record would be {size} bytes; the limit is "
                               f"{self.max_record_bytes} bytes (max_policy_record_bytes)")
        result = await self._run(script, [*keys_, keys.POLICY_EPOCH], [*args, self._floor()])
        if (result[0] if isinstance(result, list) else result) == STORE_BEHIND:
            raise StoreBehind(f"{script}: the policy store is behind {topics.POLICIES}")
        return result

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def version(self) -> int:
        return int(await self.redis.get(keys.POLICY_VERSION) or 0)

    async def floor_version(self, version: int) -> int:
        return int(await self._run("floor_version", [keys.POLICY_VERSION], [version]))

    # -- losing Redis (dwell.policy.rebuild)

    async def health(self) -> tuple[bool, int]:
        """(whether the store's epoch is there, the version counter), read together."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.exists(keys.POLICY_EPOCH)
            pipe.get(keys.POLICY_VERSION)
            epoch, version = await pipe.execute()
        return bool(epoch), int(version or 0)

    async def restore(self, scope: str, version: int, value: bytes | None) -> bool:
        """Put back a scope as the feed carries it, unless the store holds that version
        or a later one; True when something was written."""
        listing, member = scope_listing(scope)
        record = scope_key(scope)
        return bool(await self._run(
            "restore", [keys.POLICY_SCOPES, record, listing or record],
            [scope, version, value.decode() if value is not None else "", member]))

    async def begin_rebuild(self, token: str, ttl_ms: int) -> None:
        """Note a rebuild under way; its token outlives it by `ttl_ms` at most (a rebuild
        cut short leaves it behind)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.sadd(keys.POLICY_REBUILDS, token)
            pipe.pexpire(keys.POLICY_REBUILDS, ttl_ms)
            await pipe.execute()

    async def mark_complete(self, token: str) -> bool:
        """Write the epoch that ends the rebuild begun with `token`; False, writing
        nothing, when Redis lost data since it began."""
        return bool(await self._run("complete", [keys.POLICY_REBUILDS, keys.POLICY_EPOCH],
                                    [token]))

    # -- tenants

    async def create_tenant(self, name: str, info: TenantInfo) -> list[Change]:
        scope = tenant_scope(name)
        v = await self._write(
            "put", [keys.POLICY_VERSION, keys.TENANTS, keys.tenant(name), keys.TENANTS,
                    keys.POLICY_SCOPES],
            ["0", "1", name, scope, _tail(scope, tenant=info.model_dump()), ""])
        if v == EXISTS:
            raise Exists(TENANT_EXISTS)
        return [(scope, int(v))]

    async def update_tenant(self, name: str, info: TenantInfo) -> list[Change]:
        scope = tenant_scope(name)
        # The tenant record is its own parent: the update writes only over an existing one.
        v = await self._write(
            "put", [keys.POLICY_VERSION, keys.tenant(name), keys.tenant(name), keys.TENANTS,
                    keys.POLICY_SCOPES],
            ["1", "0", name, scope, _tail(scope, tenant=info.model_dump()), ""])
        if v == PARENT_MISSING:
            raise Missing(tenant_missing_on_update(name))
        return [(scope, int(v))]

    async def get_tenant(self, name: str) -> TenantInfo:
        raw = await self.redis.get(keys.tenant(name))
        if raw is None:
            raise Missing(TENANT_MISSING)
        return TenantInfo.model_validate(orjson.loads(raw)["tenant"])

    async def list_tenants(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.smembers(keys.TENANTS))

    async def delete_tenant(self, name: str) -> list[Change]:
        scope = tenant_scope(name)
        v = await self._write(
            "remove", [keys.POLICY_VERSION, keys.TENANTS, keys.tenant(name),
                       keys.namespaces(name), keys.TENANTS, keys.POLICY_SCOPES],
            ["0", scope, "1", name, ""])
        if v == ABSENT:
            raise Missing(TENANT_MISSING_ON_DELETE)
        if v == NOT_EMPTY:
            raise InUse(TENANT_NOT_EMPTY)
        return [(scope, int(v))]

    # -- namespaces (`ns` is `tenant/namespace`)

    async def create_namespace(self, ns: str) -> list[Change]:
        tenant_name = ns.partition("/")[0]
        scope = namespace_scope(ns)
        v = await self._write(
            "put", [keys.POLICY_VERSION, keys.tenant(tenant_name), keys.namespace(ns),
                    keys.namespaces(tenant_name), keys.POLICY_SCOPES],
            ["1", "1", ns, scope, _tail(scope), ""])
        if v == PARENT_MISSING:
            raise Missing(TENANT_MISSING)
        if v == EXISTS:
            raise Exists(NAMESPACE_EXISTS)
        return [(scope, int(v))]

    async def list_namespaces(self, tenant_name: str) -> list[str]:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.exists(keys.tenant(tenant_name))
            pipe.smembers(keys.namespaces(tenant_name))
            exists, members = await pipe.execute()
        if not exists:
            raise Missing(TENANT_MISSING_ON_LIST)
        return sorted(m.decode() for m in members)

    async def delete_namespace(self, ns: str) -> list[Change]:
        tenant_name = ns.partition("/")[0]
        code, v_ns, v_policy = await self._write(
            "namespace_delete",
            [keys.POLICY_VERSION, keys.namespace(ns), keys.namespace_topic_policies(ns),
             keys.namespace_policy(ns), keys.namespaces(tenant_name), keys.POLICY_SCOPES],
            [namespace_scope(ns), namespace_policy_scope(ns), ns])
        if code == ABSENT:
            raise Missing(namespace_missing_on_delete(ns))
        if code == NOT_EMPTY:
            # dwell's namespace holds topics once a topic policy names them.
            raise InUse(NAMESPACE_NOT_EMPTY)
        changes = [(namespace_policy_scope(ns), int(v_policy))] if v_policy else []
        return [*changes, (namespace_scope(ns), int(v_ns))]

    # -- permissions (Pulsar's auth_policies, in the namespace's record)

    async def grants(self, tenant_name: str, namespace: str | None) -> Grants:
        """The tenant's admin roles and its namespace `namespace`'s permissions; empty for
        what does not exist."""
        ns = f"{tenant_name}/{namespace}" if namespace else None
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.tenant(tenant_name))
            pipe.get(keys.namespace(ns) if ns else keys.tenant(tenant_name))
            tenant_raw, ns_raw = await pipe.execute()
        admins = orjson.loads(tenant_raw)["tenant"]["adminRoles"] if tenant_raw else ()
        return Grants.of(admins, namespace_auth(orjson.loads(ns_raw)) if ns and ns_raw
                         else None)

    async def permissions(self, ns: str) -> dict[str, list[str]]:
        """The namespace's permissions, role -> actions; Missing when it does not exist."""
        raw = await self.redis.get(keys.namespace(ns))
        if raw is None:
            raise Missing(NAMESPACE_MISSING)
        return namespace_auth(orjson.loads(raw))

    async def set_permission(self, ns: str, role: str,
                             actions: frozenset[AuthAction] | None) -> list[Change]:
        """Grant `role` exactly `actions` on the namespace (Pulsar replaces a role's set),
        or with None revoke them."""

        def change(fields: dict[str, Any]) -> bool:
            perms = namespace_auth(fields)
            if actions is None:
                if perms.pop(role, None) is None:
                    return False
            else:
                perms[role] = sorted(a.value for a in actions)
            fields["auth_policies"] = auth_policies(perms)
            return True

        return await self._update_namespace(ns, change)

    async def namespace_fields(self, ns: str) -> dict[str, Any]:
        """The namespace's record (its Pulsar Policies fields); Missing when it does not exist."""
        raw = await self.redis.get(keys.namespace(ns))
        if raw is None:
            raise Missing(NAMESPACE_MISSING)
        return dict(orjson.loads(raw))

    async def set_namespace_field(self, ns: str, name: str, value: Any) -> list[Change]:
        """Set one field of the namespace's record (None removes it)."""

        def change(fields: dict[str, Any]) -> bool:
            if fields.get(name) == value:
                return False
            if value is None:
                fields.pop(name, None)
            else:
                fields[name] = value
            return True

        return await self._update_namespace(ns, change)

    async def _update_namespace(self, ns: str,
                                change: Callable[[dict[str, Any]], bool]) -> list[Change]:
        """Rewrite the namespace's record with `change` made to its fields (False: nothing
        to write). A compare-and-set on the record's version, retried when another write
        came between the read and it, so that no field written meanwhile is lost."""
        tenant_name = ns.partition("/")[0]
        scope, record = namespace_scope(ns), keys.namespace(ns)
        while True:
            raw = await self.redis.get(record)
            if raw is None:
                raise Missing(NAMESPACE_MISSING)
            doc = orjson.loads(raw)
            fields = {k: v for k, v in doc.items() if k not in ("version", "scope")}
            if not change(fields):
                return []
            v = await self._write(
                "put", [keys.POLICY_VERSION, record, record, keys.namespaces(tenant_name),
                        keys.POLICY_SCOPES],
                ["1", "0", ns, scope, _tail(scope, **fields), str(doc["version"])])
            if v != CHANGED:
                break
        if v == PARENT_MISSING:
            raise Missing(NAMESPACE_MISSING)
        return [(scope, int(v))]

    # -- delayed-delivery policies

    async def namespace_policy(self, ns: str) -> DelayedDeliveryPolicies | None:
        """The namespace's own policy; Missing when the namespace does not exist."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.exists(keys.namespace(ns))
            pipe.get(keys.namespace_policy(ns))
            exists, ns_raw = await pipe.execute()
        if not exists:
            raise Missing(NAMESPACE_MISSING)
        return _policy(ns_raw)

    async def set_namespace_policy(self, ns: str, policy: DelayedDeliveryPolicies
                                   ) -> list[Change]:
        scope = namespace_policy_scope(ns)
        v = await self._write(
            "put", [keys.POLICY_VERSION, keys.namespace(ns), keys.namespace_policy(ns),
                    keys.namespace_policy(ns), keys.POLICY_SCOPES],
            ["1", "0", "", scope, _tail(scope, policy=policy.model_dump(exclude_none=True)), ""])
        if v == PARENT_MISSING:
            raise Missing(NAMESPACE_POLICIES_MISSING)
        return [(scope, int(v))]

    async def remove_namespace_policy(self, ns: str) -> list[Change]:
        scope = namespace_policy_scope(ns)
        v = await self._write(
            "remove", [keys.POLICY_VERSION, keys.namespace(ns), keys.namespace_policy(ns),
                       keys.namespace_policy(ns), keys.namespace_policy(ns), keys.POLICY_SCOPES],
            ["1", scope, "0", "", ""])
        if v == PARENT_MISSING:
            raise Missing(NAMESPACE_POLICIES_MISSING)
        return [(scope, int(v))] if v > 0 else []

    async def topic_policies(self, topic: TopicName
                             ) -> tuple[DelayedDeliveryPolicies | None, TopicPolicies]:
        """The namespace's policy and the topic's local and global ones, read together;
        Missing when the namespace does not exist."""
        ns = topic.namespace_name
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.exists(keys.namespace(ns))
            pipe.get(keys.namespace_policy(ns))
            pipe.get(keys.topic_policy(str(topic)))
            exists, ns_raw, topic_raw = await pipe.execute()
        if not exists:
            raise Missing(NAMESPACE_MISSING)
        return _policy(ns_raw), _topic_record(topic_raw)[1]

    async def set_topic_policy(self, topic: TopicName, policy: DelayedDeliveryPolicies | None,
                               is_global: bool = False) -> list[Change]:
        """Set (or, with None, remove) the topic's local or global policy; the other one
        stays."""
        return await self._update_topic(topic, lambda t: t.with_level(is_global, policy))

    async def mark_partitioned(self, topic: TopicName, partitioned: bool) -> list[Change]:
        """Record whether the topic is a partitioned topic of one partition (see
        TopicPolicies); its policies stay."""
        return await self._update_topic(
            topic, lambda t: t.model_copy(update={"partitioned": partitioned}))

    async def recorded_topics(self, ns: str) -> list[str]:
        """The namespace's topics that have a record (a policy, or the mark below)."""
        return sorted(m.decode() for m in
                      await self.redis.smembers(keys.namespace_topic_policies(ns)))

    async def partitioned_marks(self, ns: str) -> set[str]:
        """The namespace's topics recorded as partitioned topics of one partition."""
        names = await self.recorded_topics(ns)
        if not names:
            return set()
        raws = await self.redis.mget([keys.topic_policy(n) for n in names])
        return {n for n, raw in zip(names, raws, strict=True)
                if _topic_record(raw)[1].partitioned}

    async def _update_topic(self, topic: TopicName,
                            change: Callable[[TopicPolicies], TopicPolicies]) -> list[Change]:
        """Write the topic's record as `change` makes it from the current one (removed
        when nothing is left in it). The record holds several things, so the write is a
        compare-and-set on its version, retried when another write came between the
        read and it."""
        ns, name, scope = topic.namespace_name, str(topic), topic_scope(topic)
        while True:
            version, current = _topic_record(await self.redis.get(keys.topic_policy(name)))
            after = change(current)
            if after.empty:
                v = await self._write(
                    "remove", [keys.POLICY_VERSION, keys.namespace(ns), keys.topic_policy(name),
                               keys.topic_policy(name), keys.namespace_topic_policies(ns),
                               keys.POLICY_SCOPES],
                    ["1", scope, "0", name, str(version)])
            else:
                v = await self._write(
                    "put", [keys.POLICY_VERSION, keys.namespace(ns), keys.topic_policy(name),
                            keys.namespace_topic_policies(ns), keys.POLICY_SCOPES],
                    ["1", "0", name, scope, _tail(scope, **after.record_fields()),
                     str(version)])
            if v != CHANGED:
                break
        if v == PARENT_MISSING:
            raise Missing(NAMESPACE_MISSING)
        return [(scope, int(v))] if v > 0 else []

    async def remove_topic_policy(self, topic: TopicName, is_global: bool = False
                                  ) -> list[Change]:
        return await self.set_topic_policy(topic, None, is_global)

    async def drop_topic_policies(self, topic: TopicName) -> list[Change]:
        """Remove both of a deleted topic's policies, as Pulsar does with the topic."""
        ns, name, scope = topic.namespace_name, str(topic), topic_scope(topic)
        v = await self._write(
            "remove", [keys.POLICY_VERSION, keys.namespace(ns), keys.topic_policy(name),
                       keys.topic_policy(name), keys.namespace_topic_policies(ns),
                       keys.POLICY_SCOPES],
            ["0", scope, "0", name, ""])
        return [(scope, int(v))] if v > 0 else []

    # -- what the change feed reads

    async def scopes(self) -> dict[str, int]:
        """Every scope ever written, with the version of its latest change."""
        rows = await self.redis.zrange(keys.POLICY_SCOPES, 0, -1, withscores=True)
        return {m.decode(): int(score) for m, score in rows}

    async def scope_state(self, scope: str) -> tuple[int, bytes | None] | None:
        """(version, record JSON) of a scope's latest change, read atomically; the JSON is
        None when that change removed it (a tombstone), and None when it was never written."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zscore(keys.POLICY_SCOPES, scope)
            pipe.get(scope_key(scope))
            score, raw = await pipe.execute()
        if raw is not None:
            return int(orjson.loads(raw)["version"]), raw
        if score is None:
            return None
        return int(score), None
