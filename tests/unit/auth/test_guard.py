import base64

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dwell.auth.guard import Guard, operation_of
from dwell.auth.tokens import (
    DELEGATED_TOKEN_TTL_S,
    DelegatedTokenVerifier,
    InvalidToken,
    KafkaTokenVerifier,
    create_delegated_token,
    create_kafka_token,
    create_secret_key,
    create_token,
)
from dwell.core.authz import Grants, Operation
from dwell.http import create_app
from dwell.settings import CommonSettings

SECRET = create_secret_key()
LOOKED_UP: list[tuple[str, str | None]] = []


async def grants(tenant: str, namespace: str | None) -> Grants:
    LOOKED_UP.append((tenant, namespace))
    return Grants.of(["acme-admin"], {"writer": ["produce"]}) if tenant == "acme" else Grants()


def app_with(**env: object) -> FastAPI:
    settings = CommonSettings(**env)  # type: ignore[arg-type]
    guard = Guard(settings, grants)

    async def ready() -> dict[str, bool]:
        return {"ready": True}

    app = create_app("t", "t", ready)

    @app.post("/p/{tenant}/{namespace}", dependencies=[guard.require(Operation.PRODUCE)])
    async def produce(tenant: str, namespace: str) -> str:
        return "ok"

    @app.delete("/c/{tenant}/{namespace}",
                dependencies=[guard.require(Operation.PRODUCE, delegated=True)])
    async def cancel(tenant: str, namespace: str) -> str:
        return "ok"

    @app.get("/tenants", dependencies=[guard.require(Operation.LIST_TENANTS)])
    async def tenants() -> list[str]:
        return []

    return app


ON = {"authentication_enabled": True, "authorization_enabled": True, "super_user_roles": "root",
      "token_secret_key": base64.b64encode(SECRET).decode()}


def bearer(role: str, **kw: float) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(SECRET, 'HS256', role, **kw)}"}


def test_off_lets_everything_through() -> None:
    c = TestClient(app_with())
    assert c.post("/p/acme/ns").status_code == 200
    assert c.get("/tenants").status_code == 200


def test_401_and_403() -> None:
    c = TestClient(app_with(**ON))
    missing = c.post("/p/acme/ns")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert c.post("/p/acme/ns", headers={"Authorization": "Basic eDp5"}).status_code == 401
    assert c.post("/p/acme/ns", headers=bearer("writer", expires_at=1)).json()["reason"] == (
        "Authentication required: token expired")
    assert c.post("/p/acme/ns", headers=bearer("writer")).status_code == 200
    assert c.post("/p/acme/ns", headers=bearer("acme-admin")).status_code == 200
    assert c.post("/p/acme/ns", headers=bearer("root")).status_code == 200
    # Another tenant, existing or not, and a role without the permission: the same 403.
    for path, role in (("/p/globex/ns", "writer"), ("/p/nope/ns", "writer"),
                       ("/p/acme/ns", "reader")):
        answer = c.post(path, headers=bearer(role))
        assert answer.status_code == 403, path
    assert c.get("/tenants", headers=bearer("acme-admin")).status_code == 403
    assert c.get("/tenants", headers=bearer("root")).status_code == 200
    assert c.get("/healthz").status_code == 200 and c.get("/metrics").status_code == 200


def test_super_users_and_401s_look_nothing_up() -> None:
    c = TestClient(app_with(**ON))
    LOOKED_UP.clear()
    c.post("/p/acme/ns", headers=bearer("root"))
    c.post("/p/acme/ns")
    c.get("/tenants", headers=bearer("acme-admin"))
    assert LOOKED_UP == []


def test_authentication_only_needs_a_token() -> None:
    c = TestClient(app_with(**ON | {"authorization_enabled": False}))
    assert c.post("/p/globex/ns", headers=bearer("anyone")).status_code == 200
    assert c.post("/p/globex/ns").status_code == 401


def test_routes_name_their_operation() -> None:
    app = app_with(**ON)
    ops = {r.path: [operation_of(d) for d in r.dependencies]  # type: ignore[attr-defined]
           for r in app.routes if hasattr(r, "dependencies")}
    assert ops["/p/{tenant}/{namespace}"] == [Operation.PRODUCE]
    assert ops["/tenants"] == [Operation.LIST_TENANTS]


def test_a_refusal_catches_the_grants_up_once() -> None:
    import asyncio

    from dwell.http import ApiError

    granted: dict[str, list[str]] = {}
    calls: list[str] = []

    async def lookup(tenant: str, namespace: str | None) -> Grants:
        return Grants.of((), granted)

    async def catch_up() -> bool:
        calls.append("catch-up")
        granted["late"] = ["produce"]  # what the replay learns on catching up
        return True

    guard = Guard(CommonSettings(**ON), lookup, catch_up)  # type: ignore[arg-type]
    header = bearer("late")["Authorization"]
    assert asyncio.run(guard.check(header, Operation.PRODUCE, "acme", "ns")) == "late"
    assert calls == ["catch-up"]
    assert asyncio.run(guard.check(header, Operation.PRODUCE, "acme", "ns")) == "late"
    assert calls == ["catch-up"]  # allowed at once now
    try:
        asyncio.run(guard.check(header, Operation.SUBSCRIBE, "acme", "ns"))
    except ApiError as exc:
        assert exc.status == 403
    else:
        raise AssertionError("consume was allowed")
    assert calls == ["catch-up", "catch-up"]


def test_a_refusal_of_a_kafka_record_catches_the_grants_up_when_the_caller_may() -> None:
    """`authorize_sync` (the Kafka ingress's check) asks again after a catch-up that ran,
    and refuses at once when the caller's catch-up has already run for its batch."""
    import pytest

    from dwell.http import ApiError

    granted: dict[str, list[str]] = {}
    looked_up: list[str] = []

    def lookup(tenant: str, namespace: str | None) -> Grants:
        looked_up.append(tenant)
        return Grants.of((), granted)

    def catch_up() -> bool:
        granted["late"] = ["produce"]
        return True

    guard = Guard(CommonSettings(**ON))  # type: ignore[arg-type]
    with pytest.raises(ApiError) as refused:
        guard.authorize_sync("late", Operation.PRODUCE, "acme", "ns", lookup, lambda: False)
    assert refused.value.status == 403 and looked_up == ["acme"]
    assert guard.authorize_sync("late", Operation.PRODUCE, "acme", "ns", lookup,
                                catch_up) == "late"
    assert looked_up == ["acme", "acme", "acme"]
    with pytest.raises(ApiError):
        guard.authorize_sync("late", Operation.SUBSCRIBE, "acme", "ns", lookup, catch_up)


def test_a_delegated_token_opens_only_the_routes_that_take_one() -> None:
    """Admission's ingress signs a delegated token for the role a Kafka request
    authenticated; the tracker's cancel route takes it (and still checks the role's
    grants), no other route does, and neither do the Kafka paths."""
    c = TestClient(app_with(**ON))
    writer = {"Authorization": f"Bearer {create_delegated_token(SECRET, 'writer')}"}
    reader = {"Authorization": f"Bearer {create_delegated_token(SECRET, 'reader')}"}
    assert c.delete("/c/acme/ns", headers=writer).status_code == 200
    assert c.delete("/c/acme/ns", headers=reader).status_code == 403
    assert c.delete("/c/globex/ns", headers=writer).status_code == 403
    # A user's own token still works there; a delegated one nowhere else.
    assert c.delete("/c/acme/ns", headers=bearer("writer")).status_code == 200
    refused = c.post("/p/acme/ns", headers=writer)
    assert refused.status_code == 401
    assert "accepted only on the tracker's cancel route" in refused.json()["reason"]
    # Expired, forged (another key) or a Kafka token: refused on the cancel route too.
    old = create_delegated_token(SECRET, "writer", now=1_000_000)
    forged = create_delegated_token(create_secret_key(), "root")
    kafka_token = create_kafka_token(SECRET, "writer", 60_000)[0]
    for token in (old, forged, kafka_token):
        assert c.delete("/c/acme/ns", headers={"Authorization": f"Bearer {token}"}
                        ).status_code == 401, token
    with pytest.raises(InvalidToken):
        KafkaTokenVerifier(SECRET).role_at(create_delegated_token(SECRET, "w"), 0)


def test_a_delegated_token_lives_a_minute() -> None:
    now = [1_800_000_000.0]
    v = DelegatedTokenVerifier(SECRET, clock=lambda: now[0])
    token = create_delegated_token(SECRET, "writer", now=now[0])
    assert v.role(token) == "writer"
    now[0] += DELEGATED_TOKEN_TTL_S - 1
    assert v.role(token) == "writer"  # from the cache
    now[0] += 1
    with pytest.raises(InvalidToken, match="expired"):
        v.role(token)
