"""Who may do what: Pulsar's authorization rules (`PulsarAuthorizationProvider` and
`AuthorizationService` of Pulsar 4.0) as pure functions over a role, the super-user roles,
and what the policy store knows of one tenant (its `adminRoles`) and one namespace (its
`auth_policies.namespace_auth`).

- super-users may do everything;
- a tenant's admin roles manage that tenant: its namespaces, their policies and
  permissions, its topics, and the tenant itself (not other tenants, not the tenant list);
- `produce` on a namespace allows publishing to its topics, `consume` registering
  subscriptions and sending acknowledgement events; either one allows looking topics up
  and reading their stats. A tenant admin may produce and consume too.

An unknown tenant or namespace has no admin roles and no permissions, so a role that is
not a super-user is refused alike whether or not it exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Final


class AuthAction(StrEnum):
    """Pulsar's AuthAction: what a namespace permission grants."""

    produce = "produce"
    consume = "consume"
    functions = "functions"
    sources = "sources"
    sinks = "sinks"
    packages = "packages"


class Need(Enum):
    """What a role must be or hold for an operation."""

    SUPER_USER = "super-user"
    TENANT_ADMIN = "tenant admin"
    PRODUCE = "produce"
    CONSUME = "consume"
    LOOKUP = "produce or consume"  # Pulsar's canLookup
    AUTHENTICATED = "any authenticated role"


class Operation(Enum):
    """Every operation dwell's HTTP services offer, by Pulsar's operation names."""

    LIST_CLUSTERS = "list clusters"  # ClustersBase.getClusters checks no role
    GET_RUNTIME_CONFIGURATION = "get runtime configuration"
    LIST_TENANTS = "list tenants"
    CREATE_TENANT = "create tenant"
    GET_TENANT = "get tenant"
    UPDATE_TENANT = "update tenant"
    DELETE_TENANT = "delete tenant"
    LIST_NAMESPACES = "list namespaces"
    CREATE_NAMESPACE = "create namespace"
    DELETE_NAMESPACE = "delete namespace"
    GET_NAMESPACE_POLICIES = "get namespace policies"
    SET_NAMESPACE_POLICIES = "set namespace policies"
    GET_PERMISSION = "get permissions"
    GRANT_PERMISSION = "grant permission"
    REVOKE_PERMISSION = "revoke permission"
    CREATE_TOPIC = "create topic"
    DELETE_TOPIC = "delete topic"
    GET_TOPIC_POLICIES = "get topic policies"
    SET_TOPIC_POLICIES = "set topic policies"
    GET_TOPICS = "list topics"
    LOOKUP = "get topic metadata"
    GET_STATS = "get topic stats"
    GET_ALL_STATS = "get every topic's stats"
    PRODUCE = "produce"
    SUBSCRIBE = "subscribe"
    GET_SUBSCRIPTION = "get subscription"
    UNSUBSCRIBE = "unsubscribe"
    ACK = "acknowledge"
    CREATE_KAFKA_TOKEN = "create a Kafka token"


NEEDS: Final[Mapping[Operation, Need]] = {
    Operation.LIST_CLUSTERS: Need.AUTHENTICATED,
    Operation.GET_RUNTIME_CONFIGURATION: Need.SUPER_USER,
    # Pulsar asks the tenant's admins about a null tenant: only super-users pass.
    Operation.LIST_TENANTS: Need.SUPER_USER,
    # A tenant that does not exist yet has no admins.
    Operation.CREATE_TENANT: Need.SUPER_USER,
    Operation.GET_TENANT: Need.TENANT_ADMIN,
    Operation.UPDATE_TENANT: Need.TENANT_ADMIN,
    Operation.DELETE_TENANT: Need.TENANT_ADMIN,
    Operation.LIST_NAMESPACES: Need.TENANT_ADMIN,
    Operation.CREATE_NAMESPACE: Need.TENANT_ADMIN,
    Operation.DELETE_NAMESPACE: Need.TENANT_ADMIN,
    # Namespace and topic policies, read or written: validateTenantAdminAccess.
    Operation.GET_NAMESPACE_POLICIES: Need.TENANT_ADMIN,
    Operation.SET_NAMESPACE_POLICIES: Need.TENANT_ADMIN,
    Operation.GET_PERMISSION: Need.TENANT_ADMIN,
    Operation.GRANT_PERMISSION: Need.TENANT_ADMIN,
    Operation.REVOKE_PERMISSION: Need.TENANT_ADMIN,
    Operation.CREATE_TOPIC: Need.TENANT_ADMIN,
    Operation.DELETE_TOPIC: Need.TENANT_ADMIN,
    Operation.GET_TOPIC_POLICIES: Need.TENANT_ADMIN,
    Operation.SET_TOPIC_POLICIES: Need.TENANT_ADMIN,
    Operation.GET_TOPICS: Need.LOOKUP,
    Operation.LOOKUP: Need.LOOKUP,
    Operation.GET_STATS: Need.LOOKUP,
    # Every tenant's topics at once: Pulsar's broker-stats, a super-user's.
    Operation.GET_ALL_STATS: Need.SUPER_USER,
    Operation.PRODUCE: Need.PRODUCE,
    Operation.SUBSCRIBE: Need.CONSUME,
    Operation.GET_SUBSCRIPTION: Need.CONSUME,
    Operation.UNSUBSCRIBE: Need.CONSUME,
    Operation.ACK: Need.CONSUME,
    # For the caller's own role: it can do no more on Kafka than its grants allow.
    Operation.CREATE_KAFKA_TOKEN: Need.AUTHENTICATED,
}


@dataclass(frozen=True, slots=True)
class Grants:
    """What the store holds about the tenant and namespace an operation is on: the
    tenant's admin roles, and the namespace's permissions (role -> actions)."""

    admin_roles: frozenset[str] = frozenset()
    namespace_auth: Mapping[str, frozenset[AuthAction]] = field(default_factory=dict)

    @staticmethod
    def of(admin_roles: Iterable[str] = (),
           namespace_auth: Mapping[str, Iterable[str]] | None = None) -> Grants:
        return Grants(frozenset(admin_roles), {
            role: frozenset(AuthAction(a) for a in actions)
            for role, actions in (namespace_auth or {}).items()})


NO_GRANTS: Final = Grants()


def is_super_user(role: str, super_users: frozenset[str]) -> bool:
    return role in super_users


def is_tenant_admin(role: str, super_users: frozenset[str], grants: Grants) -> bool:
    return role in super_users or role in grants.admin_roles


def _holds(role: str, grants: Grants, action: AuthAction) -> bool:
    actions = grants.namespace_auth.get(role)
    return actions is not None and action in actions


def allowed(role: str, operation: Operation, super_users: frozenset[str],
            grants: Grants = NO_GRANTS) -> bool:
    """Whether an authenticated `role` may do `operation` on the tenant / namespace that
    `grants` describes."""
    need = NEEDS[operation]
    if need is Need.AUTHENTICATED or role in super_users:
        return True
    if need is Need.SUPER_USER:
        return False
    if role in grants.admin_roles:
        return True
    if need is Need.PRODUCE:
        return _holds(role, grants, AuthAction.produce)
    if need is Need.CONSUME:
        return _holds(role, grants, AuthAction.consume)
    if need is Need.LOOKUP:
        return (_holds(role, grants, AuthAction.produce)
                or _holds(role, grants, AuthAction.consume))
    return False


def parse_actions(raw: object) -> frozenset[AuthAction]:
    """A grant's body, Pulsar's `Set<AuthAction>`: a JSON list of action names.
    ValueError naming what is wrong."""
    if not isinstance(raw, list):
        raise ValueError("body: must be a list of actions (produce, consume, functions, "
                         "sources, sinks, packages)")
    out: set[AuthAction] = set()
    names = {a.value: a for a in AuthAction}
    for i, item in enumerate(raw):
        action = names.get(item) if isinstance(item, str) else None
        if action is None:
            raise ValueError(f"body[{i}]: {item!r} is not an action (produce, consume, "
                             "functions, sources, sinks, packages)")
        out.add(action)
    return frozenset(out)


def auth_policies(namespace_auth: Mapping[str, list[str]]) -> dict[str, Any]:
    """Pulsar's AuthPolicies JSON, as a namespace's record on `dwell.policies` carries
    it; dwell grants permissions per namespace only."""
    return {"namespace_auth": dict(namespace_auth), "destination_auth": {},
            "subscription_auth_roles": {}}


def namespace_auth(record: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """A namespace record's permissions, role -> actions ({} for none)."""
    if not record:
        return {}
    policies = record.get("auth_policies") or {}
    return dict(policies.get("namespace_auth") or {})
