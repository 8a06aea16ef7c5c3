"""Tokens do not live on Kafka: requests on dwell.publish and events on dwell.acks carry
short-lived Kafka tokens (dwell.auth.tokens), judged at the time the broker wrote their
record, against real Kafka, Redis, the policy and admission services and Spark local.

Found: the long-lived bearer token a client sent on Kafka stayed readable in the topic
for its retention, and anyone who read it could reuse it on HTTP or on Kafka."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import orjson
import pytest

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.auth.tokens import KAFKA_AUDIENCE, create_kafka_token, create_secret_key, create_token
from dwell.client import Consumer
from dwell.core import invalid
from dwell.core import topics as names
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName
from dwell.index import subscriptions
from dwell_dev.testkit import ServiceFactory, configure_topic, read_until, topic_config, wait_for

# Kafka tokens short enough to outlive in a test, and long enough for a loaded machine to
# write a record with one before it expires (their times are whole seconds).
TTL_MS = 6000


@pytest.fixture(scope="module")
def secret() -> bytes:
    return create_secret_key()


def auth_env(secret: bytes) -> dict[str, str]:
    return {"DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
            "DWELL_SUPER_USER_ROLES": "root", "DWELL_KAFKA_TOKEN_TTL_MS": str(TTL_MS),
            "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode()}


@pytest.fixture(scope="module")
def policy(services: ServiceFactory, secret: bytes) -> Iterator[str]:
    svc = services.start("policy", env=auth_env(secret))
    yield svc.url
    svc.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def kafka_token(policy: str, token: str) -> tuple[str, int]:
    got = httpx.post(f"{policy}/admin/v2/kafka-tokens", headers=bearer(token), timeout=30)
    assert got.status_code == 200, got.text
    return got.json()["token"], got.json()["expiresAtMs"]


def namespace(policy: str, secret: bytes, tenant: str, grants: dict[str, str]) -> None:
    root = bearer(create_token(secret, "HS256", "root"))
    assert httpx.put(f"{policy}/admin/v2/tenants/{tenant}", json={}, headers=root,
                     timeout=30).status_code == 204
    assert httpx.put(f"{policy}/admin/v2/namespaces/{tenant}/ns", headers=root,
                     timeout=30).status_code == 204
    for role, action in grants.items():
        assert httpx.post(f"{policy}/admin/v2/namespaces/{tenant}/ns/permissions/{role}",
                          json=[action], headers=root, timeout=30).status_code == 204


def test_the_route_gives_a_kafka_token_for_the_callers_role(policy: str,
                                                            secret: bytes) -> None:
    url = f"{policy}/admin/v2/kafka-tokens"
    assert httpx.post(url, timeout=30).status_code == 401
    expired = create_token(secret, "HS256", "app", expires_at=time.time() - 10)
    assert httpx.post(url, headers=bearer(expired), timeout=30).status_code == 401
    before = int(time.time())
    token, expires_ms = kafka_token(policy, create_token(secret, "HS256", "app"))
    claims = jwt.decode(token, secret, algorithms=["HS256"], audience=KAFKA_AUDIENCE,
                        options={"verify_iat": False})
    assert claims["sub"] == "app" and claims["aud"] == KAFKA_AUDIENCE
    assert claims["exp"] - claims["iat"] == TTL_MS // 1000
    assert before <= claims["iat"] <= time.time() and expires_ms == claims["exp"] * 1000
    # Not a credential over HTTP: neither for the admin API nor to renew itself.
    for path in ("/admin/v2/clusters", "/admin/v2/kafka-tokens"):
        method = "POST" if path.endswith("kafka-tokens") else "GET"
        got = httpx.request(method, f"{policy}{path}", headers=bearer(token), timeout=30)
        assert got.status_code == 401 and "not over HTTP" in got.json()["reason"], got.text
    spec = httpx.get(f"{policy}/openapi.json", timeout=30).json()
    assert "post" in spec["paths"]["/admin/v2/kafka-tokens"]


def test_a_kafka_token_never_outlives_the_token_it_was_exchanged_for(
        policy: str, secret: bytes) -> None:
    # Found: a token about to expire (or one the operator let expire to revoke it) could be
    # exchanged for a Kafka token of the full TTL, and the exchange repeated for good.
    soon = int(time.time()) + 2
    token, expires_ms = kafka_token(policy, create_token(secret, "HS256", "app",
                                                         expires_at=soon))
    claims = jwt.decode(token, secret, algorithms=["HS256"], audience=KAFKA_AUDIENCE,
                        options={"verify_exp": False, "verify_iat": False})
    assert claims["exp"] <= soon and expires_ms == claims["exp"] * 1000
    assert claims["exp"] - claims["iat"] < TTL_MS // 1000


def test_publish_and_acks_have_broker_timestamps_even_when_made_without(
        kafka_bootstrap: str) -> None:
    configure_topic(kafka_bootstrap, names.ACKS, {"message.timestamp.type": "CreateTime"})
    kafka.ensure_dwell_topics(kafka_bootstrap)
    for name in (names.PUBLISH, names.ACKS):
        assert topic_config(kafka_bootstrap, name)["message.timestamp.type"] == \
            "LogAppendTime", name


def test_the_ingress_judges_kafka_tokens_when_written_and_refuses_the_others(
        services: ServiceFactory, policy: str, secret: bytes, kafka_bootstrap: str) -> None:
    tenant = "kt" + uuid.uuid4().hex[:8]
    namespace(policy, secret, tenant, {"writer": "produce", "reader": "consume"})
    topic = f"persistent://{tenant}/ns/x"
    writer = create_token(secret, "HS256", "writer")
    group = f"dwell-admission-kt-{uuid.uuid4().hex[:8]}"
    # Admission starts after the records are written, as after an outage: it reads them
    # once their tokens have expired.
    kafka.start_group_at_end(kafka_bootstrap, group, [names.PUBLISH])
    producer_name = f"prod-{tenant}"
    ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    p = kafka.Producer(kafka_bootstrap, linger_ms=0)
    fresh, expires_ms = kafka_token(policy, writer)
    reader_kafka, _ = kafka_token(policy, create_token(secret, "HS256", "reader"))
    old, _ = create_kafka_token(secret, "writer", 60_000, now=time.time() - 3600)
    forged, _ = create_kafka_token(create_secret_key(), "root", 60_000)
    cases: dict[int, tuple[str | None, int, str]] = {  # seq: (token, errorCode, words)
        1: (fresh, 0, ""),
        2: (writer, 3, "POST /admin/v2/kafka-tokens"),  # the long-lived token
        3: (forged, 3, "signature"),
        4: (old, 3, "expired before the record was written"),
        5: (None, 3, "no dwell-authorization header"),
        6: (reader_kafka, 4, "may not produce"),
    }

    def send(seq: int, token: str | None) -> None:
        p.send(names.PUBLISH, orjson.dumps({
            "topic": topic, "producerName": producer_name,
            "messages": [{"payload": f"m{seq}", "sequenceId": seq}]}), topic,
            {hdr.AUTHORIZATION: f"Bearer {token}"} if token else None).result(15)

    for seq, (token, _, _) in cases.items():
        send(seq, token)
    # The fresh token, read out of Kafka by a thief, is sent again after it expired.
    wait_for(lambda: time.time() * 1000 > expires_ms + 1000, TTL_MS / 1000 + 5,
             "the Kafka token to expire")
    send(7, fresh)
    cases[7] = (fresh, 3, "expired before the record was written")
    send(8, kafka_token(policy, writer)[0])
    cases[8] = ("", 0, "")
    p.close()

    admission = services.start("admission", env=auth_env(secret) | {
        "DWELL_INGRESS_GROUP": group})
    try:
        def by_seq(recs: list[kafka.Record]) -> dict[int, dict[str, Any]]:
            return {res["sequenceId"]: res for res in (
                orjson.loads(r.value) for r in recs if r.key == producer_name.encode())}

        got = by_seq(read_until(kafka_bootstrap, names.PUBLISH_RESULTS, ends,
                                lambda recs: len(by_seq(recs)) >= len(cases), 90))
    finally:
        admission.stop()
    assert set(got) == set(cases), got
    for seq, (_, code, words) in cases.items():
        assert got[seq]["errorCode"] == code, (seq, got[seq])
        assert words in got[seq].get("errorMsg", ""), (seq, got[seq])
    # Read until both are there (a topic admission made a moment ago may not list all its
    # partitions to a new reader at once); exactly those two, then.
    ready = read_until(kafka_bootstrap, f"{tenant}.ns.x", {}, lambda recs: len(recs) >= 2, 30)
    assert sorted(r.value for r in ready) == [b"m1", b"m8"]


def test_the_sdk_acks_with_a_kafka_token_never_its_own(
        services: ServiceFactory, policy: str, secret: bytes, kafka_bootstrap: str) -> None:
    tenant = "ks" + uuid.uuid4().hex[:8]
    namespace(policy, secret, tenant, {"app": "consume"})
    tracker = services.start("tracker", env=auth_env(secret))
    own = create_token(secret, "HS256", "app")
    topic = f"persistent://{tenant}/ns/x"
    try:
        wait_for(lambda: httpx.get(
            f"{tracker.url}/v1/topics/persistent/{tenant}/ns/x/subscriptions/s",
            headers=bearer(own), timeout=30).status_code != 403, 30,
            "the tracker to see the grant")
        consumer = Consumer(topic, "s", tracker_url=tracker.url, policy_url=policy,
                            bootstrap=kafka_bootstrap, token=own, initial_position="earliest")
        p = kafka.Producer(kafka_bootstrap, linger_ms=0)
        p.send(f"{tenant}.ns.x", b"hello").result(15)
        p.close()
        acks_end = kafka.end_offsets(kafka_bootstrap, names.ACKS)
        msg = None
        deadline = time.monotonic() + 60
        while msg is None and time.monotonic() < deadline:
            msg = consumer.receive(1.0)
        assert msg is not None
        consumer.acknowledge(msg)
        consumer.close()
    finally:
        tracker.stop()
    mine = [r for r in read_until(kafka_bootstrap, names.ACKS, acks_end, lambda rs: any(
        r.key == f"{topic}/s".encode() for r in rs), 30) if r.key == f"{topic}/s".encode()]
    header = mine[0].header(hdr.AUTHORIZATION) or ""
    sent = header.removeprefix("Bearer ")
    assert own not in header
    claims = jwt.decode(sent, secret, algorithms=["HS256"], audience=KAFKA_AUDIENCE,
                        options={"verify_exp": False, "verify_iat": False})
    assert claims["sub"] == "app"
    assert mine[0].log_append_time


def test_the_ack_check_judges_kafka_tokens_when_written(
        policy: str, secret: bytes, kafka_bootstrap: str, redis_url: str) -> None:
    """The backoff pass's check of dwell.acks (dwell_spark.invalid), on records read back
    from Kafka as the pass gets them: a Kafka token valid when its event was written passes
    however late it is read; a long-lived, forged or replayed one is refused, and a
    replay's own timestamp, set by its producer to when the token was valid, is not the
    one judged: the broker's is."""
    from dwell_spark.invalid import LOG_APPEND_TIME, AckAuth, SubscriptionCheck, check_records
    from dwell_spark.recovery import columns
    from dwell_spark.settings import SparkSettings

    settings = SparkSettings(  # type: ignore[call-arg]
        kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, authentication_enabled=True,
        token_secret_key="data:;base64," + base64.b64encode(secret).decode())
    topic = f"persistent://t{uuid.uuid4().hex[:8]}/ns/x"
    own = create_token(secret, "HS256", "app")
    fresh, expires_ms = kafka_token(policy, own)
    forged, _ = create_kafka_token(create_secret_key(), "app", 60_000)
    ready = TopicName.parse(topic).kafka_topic
    # Registered, as the SDK does: the check sets aside events of unknown subscriptions.
    subscriptions.put(redis_adapter.connect(redis_url), topic, "s",
                      SubscriptionSettings.from_json({}))
    event = json.dumps({"event": "ack", "topic": topic, "subscription": "s",
                        "messageId": f"{ready}:0:1", "ts": int(time.time() * 1000)}).encode()
    starts = kafka.end_offsets(kafka_bootstrap, names.ACKS)
    p = kafka.Producer(kafka_bootstrap, linger_ms=0)
    key = f"{topic}/s".encode()
    sent: dict[tuple[int, int], str | None] = {}
    for token, kind in ((fresh, None), (own, invalid.UNAUTHENTICATED),
                        (forged, invalid.UNAUTHENTICATED)):
        sent[p.send(names.ACKS, event, key, {hdr.AUTHORIZATION: f"Bearer {token}"})
             .result(15)] = kind
    wait_for(lambda: time.time() * 1000 > expires_ms + 1000, TTL_MS / 1000 + 5,
             "the Kafka token to expire")
    replayed = p.send(names.ACKS, event, key, {hdr.AUTHORIZATION: f"Bearer {fresh}"},
                      timestamp_ms=expires_ms - 1000).result(15)
    sent[replayed] = invalid.UNAUTHENTICATED
    p.close()
    messages = [m for m in kafka.iter_messages_from(kafka_bootstrap, names.ACKS, starts)
                if (m.partition(), m.offset()) in sent]
    cols = columns(messages)
    assert set(cols["tsType"]) == {LOG_APPEND_TIME}
    stamps = dict(zip(zip(cols["partition"], cols["offset"], strict=True), cols["ts"],
                      strict=True))
    assert stamps[replayed] > expires_ms  # the broker's time, not the producer's
    checked = check_records(cols["value"], cols["auths"], settings.acks_max_event_bytes,
                            frozenset(), AckAuth.of(settings), timestamps=cols["ts"],
                            timestamp_types=cols["tsType"],
                            subscriptions=SubscriptionCheck.of(settings))
    got = {(part, off): (kind, reason) for part, off, (kind, reason, _) in zip(
        cols["partition"], cols["offset"], checked, strict=True)}
    assert {pos: kind for pos, (kind, _) in got.items()} == sent, got
    reasons = [reason or "" for kind, reason in got.values() if kind]
    assert any("POST /admin/v2/kafka-tokens" in r for r in reasons), reasons
    assert "expired before the record was written" in (got[replayed][1] or ""), got
