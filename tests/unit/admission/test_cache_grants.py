import orjson

from dwell.core.authz import NO_GRANTS, AuthAction, Grants
from dwell.core.policy import BrokerDefaults
from dwell.policy_view import PolicyCache


def record(version: int, scope: str, **fields: object) -> bytes:
    return orjson.dumps({"version": version, "scope": scope, **fields})


def test_grants_follow_the_feed() -> None:
    cache = PolicyCache(BrokerDefaults())
    assert cache.grants("acme", "ns") is NO_GRANTS
    cache.apply("tenant:acme", record(1, "tenant:acme", tenant={
        "adminRoles": ["ops"], "allowedClusters": []}), {})
    cache.apply("namespace:acme/ns", record(2, "namespace:acme/ns"), {})
    assert cache.grants("acme", "ns") == Grants.of(["ops"])
    cache.apply("namespace:acme/ns", record(3, "namespace:acme/ns", auth_policies={
        "namespace_auth": {"web": ["produce"]}, "destination_auth": {},
        "subscription_auth_roles": {}}), {})
    grants = cache.grants("acme", "ns")
    assert grants.admin_roles == {"ops"}
    assert grants.namespace_auth == {"web": frozenset({AuthAction.produce})}
    assert cache.grants("acme", "other").namespace_auth == {}
    # Removed (tombstones): nothing is granted any more.
    cache.apply("namespace:acme/ns", None, {"dwell-version": b"4"})
    cache.apply("tenant:acme", None, {"dwell-version": b"5"})
    assert cache.grants("acme", "ns") is NO_GRANTS
