"""The tracker's routes that answer bad input before they touch Redis, through FastAPI's
TestClient. The Redis client points at a closed port, so a route that reached Redis
would fail the test with a 500 instead of the 400 it must give."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from dwell.tracker.app import build_app
from dwell.tracker.settings import TrackerSettings

BASE = "/v1/topics/persistent/acme/orders/payments/subscriptions"


@pytest.fixture()
def client() -> Iterator[TestClient]:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    app = build_app(TrackerSettings(redis_url="redis://127.0.0.1:1/0"), dead)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize(("path", "body", "reason"), [
    (f"{BASE}/s1", {"ackTimeoutMs": -5}, "ackTimeoutMs: must be a non-negative integer"),
    (f"{BASE}/s1", {"ackTimeoutMs": 10}, "ackTimeoutMs: "),
    (f"{BASE}/s1", {"maxRedeliverCount": 0},
     "maxRedeliverCount: MaxRedeliverCount must be > 0."),
    (f"{BASE}/s1", {"maxRedeliverCount": "3"}, "maxRedeliverCount: must be an integer"),
    (f"{BASE}/s1", {"colour": "red"}, "colour: unknown field"),
    (f"{BASE}/s1", ["not", "an", "object"], "body: must be a JSON object"),
    (f"{BASE}/s1", {"negativeAckRedeliveryBackoff": {"minDelayMs": -1}},
     "negativeAckRedeliveryBackoff: "),
])
def test_bad_subscription_settings_are_a_400(client: TestClient, path: str, body: object,
                                             reason: str) -> None:
    got = client.put(path, json=body)
    assert got.status_code == 400, got.text
    assert got.json()["reason"].startswith(reason), got.json()


def test_malformed_json_is_a_400(client: TestClient) -> None:
    got = client.put(f"{BASE}/s1", content=b"{nope", headers={"content-type":
                                                              "application/json"})
    assert (got.status_code, got.json()) == (400, {"reason": "body: is not valid JSON"})


@pytest.mark.parametrize("path", [
    "/v1/topics/persistent/acme/orders/bad{name}/subscriptions/s1",
    "/v1/topics/durable/acme/orders/payments/subscriptions/s1",
    f"{BASE}/" + "s" * 300,
])
def test_bad_names_are_a_400(client: TestClient, path: str) -> None:
    for method in ("put", "get", "delete"):
        kwargs = {"json": {}} if method == "put" else {}
        got = getattr(client, method)(path, **kwargs)
        assert got.status_code == 400, (method, got.text)
        assert got.json()["reason"]


def test_not_ready_without_redis(client: TestClient) -> None:
    got = client.get("/readyz")
    assert got.status_code == 503
    assert got.json()["ready"] is False
