"""What every service's app shares (dwell.http), through FastAPI's TestClient: health and
readiness, /metrics, errors as `{"reason": ...}` with a 4xx for bad input and a 500 that
names no more than the exception's type, and the request-body limit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dwell.http import ApiError, BodyLimit, create_app


class Body(pydantic.BaseModel):
    name: str
    count: int = pydantic.Field(ge=0)


def app_with(ready: dict[str, Any] | Exception) -> FastAPI:
    async def check() -> dict[str, Any]:
        if isinstance(ready, Exception):
            raise ready
        return ready

    app = create_app("test", "dwell.http under test", check)

    @app.post("/things")
    async def things(body: Body) -> dict[str, Any]:
        if body.name == "taken":
            raise ApiError(409, "Thing already exists", {"x-why": "taken"})
        if body.name == "boom":
            raise RuntimeError("secret detail from deep inside")
        return {"name": body.name, "count": body.count}

    return app


@pytest.fixture()
def client() -> Iterator[TestClient]:
    with TestClient(app_with({"ready": True, "redis": "ok"}),
                    raise_server_exceptions=False) as c:
        yield c


def test_health_and_metrics(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    got = client.get("/metrics")
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/plain")
    assert "dwell_process_allocator_bytes" in got.text


@pytest.mark.parametrize(("ready", "status"), [
    ({"ready": True}, 200),
    ({"ready": False, "kafka": "unreachable"}, 503),
    (ConnectionError("redis down"), 503),
])
def test_readyz(ready: dict[str, Any] | Exception, status: int) -> None:
    with TestClient(app_with(ready)) as c:
        got = c.get("/readyz")
    assert got.status_code == status
    if isinstance(ready, Exception):
        assert got.json() == {"ready": False, "error": "redis down"}
    else:
        assert got.json() == ready


@pytest.mark.parametrize(("body", "reason"), [
    ({"name": "a", "count": -1}, "count: must be >= 0"),
    ({"count": 1}, "name: is required"),
    ([1, 2], "body: must be a JSON object"),
    ({"name": 5, "count": "x"}, "name: must be a string; count: must be an integer"),
])
def test_bad_input_is_a_400_naming_the_field(client: TestClient, body: Any,
                                             reason: str) -> None:
    got = client.post("/things", json=body)
    assert got.status_code == 400
    assert got.json()["reason"].startswith(reason), got.json()


def test_malformed_json_is_a_400(client: TestClient) -> None:
    got = client.post("/things", content=b'{"name": ', headers={"content-type":
                                                                 "application/json"})
    assert got.status_code == 400
    assert got.json() == {"reason": "body: is not valid JSON"}


def test_api_error_keeps_its_status_reason_and_headers(client: TestClient) -> None:
    got = client.post("/things", json={"name": "taken", "count": 1})
    assert (got.status_code, got.json(), got.headers["x-why"]) == (
        409, {"reason": "Thing already exists"}, "taken")


def test_unexpected_error_is_a_500_without_its_text(client: TestClient) -> None:
    got = client.post("/things", json={"name": "boom", "count": 1})
    assert got.status_code == 500
    assert got.json() == {"reason": "internal error (RuntimeError); see the service log"}
    assert "secret" not in got.text


def test_unknown_path_is_a_404_in_the_same_shape(client: TestClient) -> None:
    got = client.get("/nothing/here")
    assert (got.status_code, got.json()) == (404, {"reason": "Not Found"})


@pytest.fixture()
def limited() -> Iterator[TestClient]:
    app = BodyLimit(app_with({"ready": True}), max_bytes=64, setting="DWELL_TEST_MAX")
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_body_over_the_limit_is_a_413_naming_it(limited: TestClient) -> None:
    body = b'{"name": "' + b"x" * 100 + b'", "count": 1}'
    got = limited.post("/things", content=body, headers={"content-type": "application/json"})
    assert got.status_code == 413
    assert got.json()["reason"] == (f"request body: {len(body)} bytes; the limit is 64 bytes "
                                    "(DWELL_TEST_MAX)")


def test_streamed_body_over_the_limit_is_a_413(limited: TestClient) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the bytes read are counted
        yield b'{"name": "'
        yield b"x" * 100
        yield b'", "count": 1}'

    got = limited.post("/things", content=chunks(), headers={"content-type":
                                                             "application/json"})
    assert got.status_code == 413
    assert "more than 64 bytes" in got.json()["reason"]


def test_body_within_the_limit_passes(limited: TestClient) -> None:
    got = limited.post("/things", json={"name": "a", "count": 2})
    assert (got.status_code, got.json()) == (200, {"name": "a", "count": 2})


def test_openapi_declares_the_bearer_token_on_guarded_routes_only() -> None:
    from dwell.auth.guard import Guard
    from dwell.core.authz import Operation
    from dwell.settings import CommonSettings

    app = create_app("test", "dwell.http under test", _ready)
    guard = Guard(CommonSettings())

    @app.get("/guarded/{tenant}", dependencies=[guard.require(Operation.LIST_NAMESPACES)])
    async def guarded(tenant: str) -> dict[str, str]:
        return {"tenant": tenant}

    @app.get("/open")
    async def open_route() -> dict[str, str]:
        return {}

    doc = TestClient(app).get("/openapi.json").json()
    (name, scheme), = doc["components"]["securitySchemes"].items()
    assert name == "bearerAuth"
    assert (scheme["type"], scheme["scheme"], scheme["bearerFormat"]) == ("http", "bearer", "JWT")
    assert "DWELL_AUTHENTICATION_ENABLED" in scheme["description"]
    op = doc["paths"]["/guarded/{tenant}"]["get"]
    assert op["security"] == [{"bearerAuth": []}]
    assert {"401", "403"} <= set(op["responses"])
    assert "security" not in doc["paths"]["/open"]["get"]
    assert "401" not in doc["paths"]["/open"]["get"]["responses"]


async def _ready() -> dict[str, Any]:
    return {"ready": True}
