"""The authorization matrix: every role × every endpoint of policy, admission and tracker
(read from the apps' route tables, so that a new endpoint fails this test until it has a
row in NEEDS below) × the role's own tenant and another tenant, against the three
services run with authentication and authorization on, over real Redis and Kafka.

The expected answers are written out here, from Pulsar 4.0's rules, independently of
dwell.core.authz: a cell fails on any unexpected allow and on any unexpected deny."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Route

from dwell.admission.app import build_app as admission_app
from dwell.admission.settings import AdmissionSettings
from dwell.auth.tokens import (
    create_delegated_token,
    create_kafka_token,
    create_secret_key,
    create_token,
)
from dwell.client import Consumer, Producer, PublishError, SubscribeError
from dwell.http import all_routes
from dwell.policy.app import build_app as policy_app
from dwell.policy.settings import PolicySettings
from dwell.tracker.app import build_app as tracker_app
from dwell.tracker.settings import TrackerSettings
from dwell_dev.testkit import ServiceFactory, wait_for

SUPER, ADMIN, OTHER_ADMIN = "root", "own-admin", "other-admin"
PRODUCER, CONSUMER = "own-producer", "own-consumer"

# What each route needs. S: a super-user; A: the tenant's admin (or a super-user);
# P: produce on the namespace; C: consume; L: produce or consume; U: any valid token;
# D: produce, and a delegated token of a role that may (admission's ingress sends one).
NEEDS: dict[str, dict[tuple[str, str], str]] = {
    "policy": {
        ("GET", "/admin/v2/clusters"): "U",
        ("POST", "/admin/v2/kafka-tokens"): "U",
        ("GET", "/admin/v2/brokers/configuration/runtime"): "S",
        ("GET", "/admin/v2/tenants"): "S",
        ("PUT", "/admin/v2/tenants/{tenant}"): "S",
        ("POST", "/admin/v2/tenants/{tenant}"): "A",
        ("GET", "/admin/v2/tenants/{tenant}"): "A",
        ("DELETE", "/admin/v2/tenants/{tenant}"): "A",
        ("GET", "/admin/v2/namespaces/{tenant}"): "A",
        ("PUT", "/admin/v2/namespaces/{tenant}/{namespace}"): "A",
        ("GET", "/admin/v2/namespaces/{tenant}/{namespace}"): "A",
        ("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}"): "A",
        ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/delayedDelivery"): "A",
        ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/delayedDelivery"): "A",
        ("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/delayedDelivery"): "A",
        ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/permissions"): "A",
        ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}"): "A",
        ("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}"): "A",
        ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/maxTopicsPerNamespace"): "A",
        ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/maxTopicsPerNamespace"): "A",
        ("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/maxTopicsPerNamespace"): "A",
        ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/maxSubscriptionsPerTopic"): "A",
        ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/maxSubscriptionsPerTopic"): "A",
        ("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/maxSubscriptionsPerTopic"): "A",
        ("GET", "/admin/v2/persistent/{tenant}/{namespace}"): "L",
        ("GET", "/admin/v2/non-persistent/{tenant}/{namespace}"): "L",
        ("GET", "/admin/v2/persistent/{tenant}/{namespace}/partitioned"): "L",
        ("GET", "/admin/v2/non-persistent/{tenant}/{namespace}/partitioned"): "L",
        ("PUT", "/admin/v2/persistent/{tenant}/{namespace}/{topic}"): "A",
        ("DELETE", "/admin/v2/persistent/{tenant}/{namespace}/{topic}"): "A",
        ("PUT", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"): "A",
        ("GET", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"): "L",
        ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"): "A",
        ("DELETE", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"): "A",
        ("GET", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats"): "L",
        ("GET", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitioned-stats"): "L",
        ("GET", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/delayedDelivery"): "A",
        ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/delayedDelivery"): "A",
        ("DELETE", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/delayedDelivery"): "A",
    },
    "admission": {
        ("POST", "/topics/{domain}/{tenant}/{namespace}/{topic}"): "P",
        ("POST", "/topics/{domain}/{tenant}/{namespace}/{topic}/partitions/{partition}"): "P",
        ("DELETE", "/topics/{domain}/{tenant}/{namespace}/{topic}/messages/{message_id}"): "P",
    },
    "tracker": {
        ("PUT", "/v1/topics/{kind}/{tenant}/{namespace}/{topic}/subscriptions/{sub}"): "C",
        ("GET", "/v1/topics/{kind}/{tenant}/{namespace}/{topic}/subscriptions/{sub}"): "C",
        ("DELETE", "/v1/topics/{kind}/{tenant}/{namespace}/{topic}/subscriptions/{sub}"): "C",
        ("DELETE", "/v1/topics/{kind}/{tenant}/{namespace}/{topic}/messages/{message_id}"): "D",
        ("POST", "/v1/topics/{kind}/{tenant}/{namespace}/{topic}/cancellations"): "D",
        ("GET", "/v1/topics/{kind}/{tenant}/{namespace}/{topic}/stats"): "L",
        ("GET", "/v1/stats"): "S",
        ("GET", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats"): "L",
    },
}
# Open with authentication on (probes, metrics, the OpenAPI documents).
OPEN = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect",
        "/redoc"}

# What each role meets on its own tenant and on the other one.
MEETS = {
    "super-user": ({"S", "A", "P", "D", "C", "L", "U"},) * 2,
    "tenant admin": ({"A", "P", "D", "C", "L", "U"}, {"U"}),
    "other tenant's admin": ({"U"}, {"A", "P", "D", "C", "L", "U"}),
    "produce-only": ({"P", "D", "L", "U"}, {"U"}),
    "consume-only": ({"C", "L", "U"}, {"U"}),
    "no token": (set(), set()),
    "expired token": (set(), set()),
    "bad signature": (set(), set()),
    # A super-user's Kafka token: good on Kafka, refused over HTTP.
    "Kafka token": (set(), set()),
    # A produce-only role's delegated token: the tracker's cancel route alone.
    "delegated token": ({"D"}, set()),
}


def routes(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route that is not open."""
    out: set[tuple[str, str]] = set()
    for route in all_routes(app):
        assert isinstance(route, (APIRoute, Route)), route
        if route.path in OPEN:
            continue
        out |= {(m, route.path) for m in route.methods or () if m != "HEAD"}
    return out


@dataclass
class Secured:
    urls: dict[str, str]
    tokens: dict[str, str | None]
    own: str
    other: str
    secret: bytes


@pytest.fixture(scope="module")
def secured(services: ServiceFactory) -> Iterator[Secured]:
    secret = create_secret_key()
    env = {"DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
           "DWELL_SUPER_USER_ROLES": f"{SUPER},ops",
           "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode()}
    tracker = services.start("tracker", env=env)
    policy = services.start("policy", env=env | {"DWELL_TRACKER_URL": tracker.url})
    admission = services.start("admission", env=env | {"DWELL_TRACKER_URL": tracker.url})

    def token(role: str, **kw: float) -> str:
        return create_token(secret, "HS256", role, **kw)

    tokens: dict[str, str | None] = {
        "super-user": token(SUPER), "tenant admin": token(ADMIN),
        "other tenant's admin": token(OTHER_ADMIN), "produce-only": token(PRODUCER),
        "consume-only": token(CONSUMER), "no token": None,
        "expired token": token(ADMIN, expires_at=time.time() - 10),
        "bad signature": create_token(create_secret_key(), "HS256", SUPER),
        "Kafka token": create_kafka_token(secret, SUPER, 3_600_000)[0],
        "delegated token": create_delegated_token(secret, PRODUCER),
    }
    own, other = "own" + uuid.uuid4().hex[:8], "other" + uuid.uuid4().hex[:8]
    root = httpx.Client(base_url=policy.url, timeout=30,
                        headers={"Authorization": f"Bearer {tokens['super-user']}"})
    for tenant, admin in ((own, ADMIN), (other, OTHER_ADMIN)):
        assert root.put(f"/admin/v2/tenants/{tenant}",
                        json={"adminRoles": [admin]}).status_code == 204
        assert root.put(f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
        # A topic in the namespace, so that deleting the namespace is refused (409).
        assert root.put(f"/admin/v2/persistent/{tenant}/ns/t1").status_code == 204
    for role, action in ((PRODUCER, "produce"), (CONSUMER, "consume")):
        assert root.post(f"/admin/v2/namespaces/{own}/ns/permissions/{role}",
                         json=[action]).status_code == 204
    assert root.get(f"/admin/v2/namespaces/{own}/ns/permissions").json() == {
        PRODUCER: ["produce"], CONSUMER: ["consume"]}
    # Admission and the tracker check from their replay of dwell.policies.
    producer = {"Authorization": f"Bearer {tokens['produce-only']}"}
    consumer = {"Authorization": f"Bearer {tokens['consume-only']}"}
    wait_for(lambda: httpx.post(
        f"{admission.url}/topics/persistent/{own}/ns/t1", headers=producer,
        json={"messages": []}).status_code == 200, 30, "admission to see the grants")
    wait_for(lambda: httpx.get(f"{tracker.url}/v1/topics/persistent/{own}/ns/t1/stats",
                               headers=consumer).status_code == 200, 30,
             "the tracker to see the grants")
    yield Secured({"policy": policy.url, "admission": admission.url, "tracker": tracker.url},
                tokens, own, other, secret)
    root.close()
    for svc in (admission, policy, tracker):
        svc.stop()


def test_every_route_has_a_row(redis_url: str, kafka_bootstrap: str) -> None:
    base = {"redis_url": redis_url, "kafka_bootstrap": kafka_bootstrap}
    apps = {"policy": policy_app(PolicySettings(**base)),  # type: ignore[arg-type]
            "admission": admission_app(AdmissionSettings(**base)),  # type: ignore[arg-type]
            "tracker": tracker_app(TrackerSettings(**base),  # type: ignore[arg-type]
                                   redis.Redis.from_url(redis_url))}
    for name, app in apps.items():
        assert routes(app) == set(NEEDS[name]), name


def _fill(path: str, tenant: str, method: str) -> str:
    # A DELETE of a topic names one that does not exist: t1 must stay, so that deleting
    # the namespace stays refused for the cells that come after.
    topic = "gone" if method == "DELETE" else "t1"
    return (path.replace("{tenant}", tenant).replace("{namespace}", "ns")
            .replace("{topic}", topic).replace("{domain}", "persistent")
            .replace("{kind}", "persistent").replace("{sub}", "s1")
            .replace("{role}", "someone").replace("{partition}", "0")
            .replace("{message_id}", "x.ns.none:0:0"))


def _body(path: str, method: str, tenant: str) -> object:
    if method not in ("PUT", "POST"):
        return None
    if path.endswith("/delayedDelivery"):
        return {"active": True}
    if path.endswith("/permissions/{role}"):
        return ["consume"]
    if path.endswith(("/maxTopicsPerNamespace", "/maxSubscriptionsPerTopic")):
        return 0
    if path == "/admin/v2/tenants/{tenant}":
        # Keeps the tenant's admin what it is.
        return {"adminRoles": [ADMIN if tenant.startswith("own") else OTHER_ADMIN]}
    if path.endswith("/partitions"):
        return 2
    if path.endswith("/cancellations"):
        return {"messageIds": ["x.ns.none:0:0"]}
    if path.startswith("/topics/"):
        return {"producerName": "matrix", "messages": [{"payload": "x"}]}
    if "/subscriptions/" in path:
        return {"ackTimeoutMs": 0}
    return None


def test_matrix(secured: Secured) -> None:
    cells = allows = denies = 0
    wrong: list[str] = []
    with httpx.Client(timeout=30) as http:
        for service, table in NEEDS.items():
            for (method, path), need in sorted(table.items()):
                for side, tenant in enumerate((secured.own, secured.other)):
                    for role, tok in secured.tokens.items():
                        if role == "delegated token":  # it lives a minute
                            tok = create_delegated_token(secured.secret, PRODUCER)
                        headers = {"Authorization": f"Bearer {tok}"} if tok else {}
                        answer = http.request(method, secured.urls[service]
                                              + _fill(path, tenant, method), headers=headers,
                                              json=_body(path, method, tenant))
                        cells += 1
                        expect = need in MEETS[role][side]
                        where = (f"{role} {method} {service}{path} on "
                                 f"{'own' if side == 0 else 'other'} tenant: "
                                 f"{answer.status_code} {answer.text[:160]}")
                        assert answer.status_code < 500, where
                        got = answer.status_code not in (401, 403)
                        if got and not expect:
                            allows += 1
                            wrong.append("unexpected allow: " + where)
                        elif expect and not got:
                            denies += 1
                            wrong.append("unexpected deny: " + where)
                        elif not got:
                            # 401 for whoever has no valid token, 403 for the others.
                            want = 401 if role in ("no token", "expired token",
                                                   "bad signature", "Kafka token") else 403
                            if role == "delegated token" and need != "D":
                                want = 401
                            if answer.status_code != want:
                                wrong.append(f"{want} expected: {where}")
    print(f"authz matrix: {cells} cells, unexpected allows: {allows}, "
          f"unexpected denies: {denies}")
    assert not wrong, "\n".join(wrong)


def test_a_refusal_does_not_tell_whether_a_tenant_exists(secured: Secured) -> None:
    headers = {"Authorization": f"Bearer {secured.tokens['tenant admin']}"}
    missing = "nosuch" + uuid.uuid4().hex[:8]
    for path in ("/admin/v2/namespaces/{t}/ns/delayedDelivery", "/admin/v2/tenants/{t}",
                 "/admin/v2/namespaces/{t}/ns/permissions"):
        there = httpx.get(secured.urls["policy"] + path.format(t=secured.other), headers=headers)
        absent = httpx.get(secured.urls["policy"] + path.format(t=missing), headers=headers)
        assert there.status_code == absent.status_code == 403
        assert there.text.replace(secured.other, "T") == absent.text.replace(missing, "T")
    post = httpx.post(f"{secured.urls['admission']}/topics/persistent/{missing}/ns/x",
                      headers=headers, json={"messages": [{"payload": "x"}]})
    assert post.status_code == 403


def test_the_sdk_sends_its_token(secured: Secured, kafka_bootstrap: str) -> None:
    topic = f"persistent://{secured.own}/ns/sdk"
    with Producer(topic, admission_url=secured.urls["admission"],
                  token=secured.tokens["produce-only"]) as producer:
        assert producer.send(b"hello", deliver_after=60_000)
    with Producer(topic, admission_url=secured.urls["admission"]) as anonymous, \
            pytest.raises(PublishError, match="HTTP 401: Authentication required"):
        anonymous.send(b"hello")
    with pytest.raises(SubscribeError, match="HTTP 403: Unauthorized"):
        Consumer(topic, "billing", tracker_url=secured.urls["tracker"],
                 bootstrap=kafka_bootstrap, token=secured.tokens["produce-only"])
    consumer = Consumer(topic, "billing", tracker_url=secured.urls["tracker"],
                        bootstrap=kafka_bootstrap, token=secured.tokens["consume-only"])
    consumer.close()


def test_a_grant_is_in_force_as_soon_as_it_is_answered(secured: Secured) -> None:
    """Read your writes: admission and the tracker check against their replay of the
    feed, and a refusal first catches that replay up."""
    role = "late" + uuid.uuid4().hex[:6]
    admin = {"Authorization": f"Bearer {secured.tokens['tenant admin']}"}
    token = {"Authorization": "Bearer " + create_token(secured.secret, "HS256", role)}
    grant = httpx.post(f"{secured.urls['policy']}/admin/v2/namespaces/{secured.own}/ns/"
                       f"permissions/{role}", headers=admin, json=["produce", "consume"])
    assert grant.status_code == 204
    post = httpx.post(f"{secured.urls['admission']}/topics/persistent/{secured.own}/ns/t1",
                      headers=token, json={"messages": [{"payload": "x"}]}, timeout=30)
    assert post.status_code == 200, post.text
    sub = httpx.put(f"{secured.urls['tracker']}/v1/topics/persistent/{secured.own}/ns/t1/"
                    f"subscriptions/{role}", headers=token, json={}, timeout=30)
    assert sub.status_code == 200, sub.text
