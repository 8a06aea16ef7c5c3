import pytest

from dwell.core.authz import NEEDS, AuthAction, Grants, Need, Operation, allowed, parse_actions

SUPER = frozenset({"root"})
GRANTS = Grants.of(admin_roles=["acme-admin"],
                   namespace_auth={"writer": ["produce"], "reader": ["consume"],
                                   "both": ["produce", "consume"], "fn": ["functions"]})

# role -> the needs it meets on the tenant / namespace GRANTS describes
MEETS = {
    "root": set(Need),
    "acme-admin": set(Need) - {Need.SUPER_USER},
    "writer": {Need.AUTHENTICATED, Need.PRODUCE, Need.LOOKUP},
    "reader": {Need.AUTHENTICATED, Need.CONSUME, Need.LOOKUP},
    "both": {Need.AUTHENTICATED, Need.PRODUCE, Need.CONSUME, Need.LOOKUP},
    "fn": {Need.AUTHENTICATED},
    "stranger": {Need.AUTHENTICATED},
}


@pytest.mark.parametrize("role", sorted(MEETS))
@pytest.mark.parametrize("operation", list(Operation), ids=lambda o: o.name)
def test_table(role: str, operation: Operation) -> None:
    assert allowed(role, operation, SUPER, GRANTS) == (NEEDS[operation] in MEETS[role])


def test_every_operation_has_a_need() -> None:
    assert set(NEEDS) == set(Operation)


@pytest.mark.parametrize(("operation", "need"), [
    (Operation.LIST_TENANTS, Need.SUPER_USER),
    (Operation.CREATE_TENANT, Need.SUPER_USER),
    (Operation.GET_TENANT, Need.TENANT_ADMIN),
    (Operation.UPDATE_TENANT, Need.TENANT_ADMIN),
    (Operation.GET_NAMESPACE_POLICIES, Need.TENANT_ADMIN),
    (Operation.GRANT_PERMISSION, Need.TENANT_ADMIN),
    (Operation.GET_STATS, Need.LOOKUP),
    (Operation.PRODUCE, Need.PRODUCE),
    (Operation.SUBSCRIBE, Need.CONSUME),
    (Operation.ACK, Need.CONSUME),
])
def test_pulsar_table(operation: Operation, need: Need) -> None:
    # Pulsar 4.0: tenant admins read policies and stats; produce/consume roles never manage.
    assert NEEDS[operation] is need


def test_unknown_tenant_grants_nothing() -> None:
    for op in Operation:
        if NEEDS[op] is not Need.AUTHENTICATED:
            assert not allowed("acme-admin", op, SUPER)
    assert allowed("root", Operation.DELETE_TENANT, SUPER)


def test_another_tenants_admin_is_a_stranger() -> None:
    other = Grants.of(admin_roles=["globex-admin"])
    assert not allowed("acme-admin", Operation.SET_NAMESPACE_POLICIES, SUPER, other)
    assert not allowed("acme-admin", Operation.PRODUCE, SUPER, other)


def test_parse_actions() -> None:
    assert parse_actions(["produce", "consume", "produce"]) == {AuthAction.produce,
                                                                 AuthAction.consume}
    assert parse_actions([]) == frozenset()
    for bad, where in ((["write"], "body[0]"), ([{}], "body[0]"), ("produce", "body"),
                       ({"actions": []}, "body"), (["consume", 1], "body[1]")):
        with pytest.raises(ValueError, match=where.replace("[", r"\[")):
            parse_actions(bad)
