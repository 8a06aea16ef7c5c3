"""The real `pulsar-admin` (Apache Pulsar 4.0) against a policy service with token
authentication and authorization on: `--auth-plugin AuthenticationToken --auth-params
token:...` as a Pulsar user passes them, and the namespace permission commands
`grant-permission`, `permissions` and `revoke-permission`."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from compat.conftest import BROKER, PulsarAdmin
from dwell.auth.tokens import create_secret_key, create_token

PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


@pytest.fixture(scope="module")
def secret() -> bytes:
    return create_secret_key()


@pytest.fixture(scope="module")
def secured_admin(services, secret: bytes, pulsar_admin_libs: Path,  # type: ignore[no-untyped-def]
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarAdmin]:
    svc = services.start("policy", env=BROKER | {
        "DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
        "DWELL_SUPER_USER_ROLES": "admin",
        "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode()})
    conf = tmp_path_factory.mktemp("pulsar-admin-auth") / "client.conf"
    conf.write_text(f"webServiceUrl={svc.url}\n")
    yield PulsarAdmin(pulsar_admin_libs, conf)
    svc.stop()


def printed(out: str) -> dict[str, set[str]]:
    """pulsar-admin's `namespaces permissions` table: `role    [action, action]` lines."""
    table = {}
    for line in out.splitlines():
        role, _, actions = line.partition(" ")
        table[role] = {a.strip() for a in actions.strip().strip("[]").split(",") if a.strip()}
    return table


def test_permissions_with_tokens(secured_admin: PulsarAdmin, secret: bytes,
                                 tmp_path: Path) -> None:
    t = "auth" + uuid.uuid4().hex[:8]
    ns = f"{t}/ns"

    def as_(role: str | None, *args: str) -> tuple[str, ...]:
        if role is None:
            return args
        return ("--auth-plugin", PLUGIN, "--auth-params",
                f"token:{create_token(secret, 'HS256', role)}", *args)

    commands = [
        as_("admin", "tenants", "create", t, "--admin-roles", "ops", "-c", "standalone"),
        as_("admin", "namespaces", "create", ns),
        as_("ops", "namespaces", "grant-permission", ns, "--role", "app",
            "--actions", "produce,consume"),
        as_("ops", "namespaces", "grant-permission", ns, "--role", "billing",
            "--actions", "consume"),
        as_("ops", "namespaces", "permissions", ns),
        as_("ops", "namespaces", "revoke-permission", ns, "--role", "app"),
        as_("ops", "namespaces", "permissions", ns),
        as_("app", "namespaces", "permissions", ns),  # a permission does not manage
        as_("ops", "tenants", "list"),  # a tenant admin is no super-user
        as_(None, "namespaces", "permissions", ns),  # no token
    ]
    results = secured_admin.batch(commands, tmp_path)
    for cmd, got in zip(commands[:4], results[:4], strict=True):
        assert got.rc == 0, (cmd[4:], got)
    granted, revoked = results[4], results[6]
    assert granted.rc == 0 and printed(granted.out) == {"app": {"consume", "produce"},
                                                         "billing": {"consume"}}, granted
    assert results[5].rc == 0
    assert revoked.rc == 0 and printed(revoked.out) == {"billing": {"consume"}}, revoked
    for got in results[7:9]:
        assert got.rc == 1 and "Unauthorized: role" in got.err, got
    assert results[9].rc == 1 and "Authentication required" in results[9].err, results[9]
    # And once as its own pulsar-admin process, exactly as a user runs it.
    one = secured_admin.cli(*as_("ops", "namespaces", "permissions", ns))
    assert one.rc == 0 and printed(one.out) == {"billing": {"consume"}}, one
