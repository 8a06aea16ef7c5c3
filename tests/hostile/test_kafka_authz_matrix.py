"""The authorization matrix on the Kafka paths: every kind of caller × its own tenant and
another tenant × a publish request on dwell.publish and an ack event on dwell.acks, each
carrying the caller's Kafka token, against the real policy service, admission's ingress,
Kafka and Redis. Publish requests are judged by admission (a refusal is errorCode 4 on
dwell.publish.results, an allowed one lands on the ready topic); ack events by the Spark
app's check (dwell_spark.invalid.check_records, on the records as read back from
dwell.acks: a refusal is kind `unauthorized`).

The expected answers are written out here, from Pulsar's rules: publishing needs
`produce` on the namespace, acking `consume`; a tenant's admin may do both in its tenant,
a super-user everywhere."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from dwell import headers as hdr
from dwell import keys
from dwell.adapters import kafka
from dwell.adapters import redis as redis_adapter
from dwell.auth.tokens import create_secret_key, create_token
from dwell.core import invalid
from dwell.core import topics as names
from dwell.core.subscriptions import SubscriptionSettings
from dwell.core.topics import TopicName
from dwell.index import subscriptions
from dwell_dev.testkit import ServiceFactory, read_until
from dwell_spark.invalid import LOG_APPEND_TIME, AckAuth, SubscriptionCheck, check_records
from dwell_spark.settings import SparkSettings

SUPER, ADMIN, OTHER_ADMIN = "root", "own-admin", "other-admin"
PRODUCER, CONSUMER, NOBODY = "own-producer", "own-consumer", "no-grant"
CALLERS = {"super-user": SUPER, "tenant admin": ADMIN, "produce role": PRODUCER,
           "consume role": CONSUMER, "no role": NOBODY}
# Who may, in its own tenant (OWN) and in another (OTHER).
OWN, OTHER = "own", "other"
MAY_PUBLISH = {(SUPER, OWN), (SUPER, OTHER), (ADMIN, OWN), (PRODUCER, OWN)}
MAY_ACK = {(SUPER, OWN), (SUPER, OTHER), (ADMIN, OWN), (CONSUMER, OWN)}
CELLS = [(caller, where) for caller in CALLERS for where in (OWN, OTHER)]


def auth_env(secret: bytes) -> dict[str, str]:
    return {"DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
            "DWELL_SUPER_USER_ROLES": SUPER,
            "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode()}


@dataclass
class Matrix:
    """What each cell got: the publish result and the ack check's (kind, reason)."""

    topics: dict[str, str]
    published: dict[tuple[str, str], dict[str, Any]]
    ready: dict[str, list[bytes]]
    acked: dict[tuple[str, str], tuple[str | None, str | None]]


@pytest.fixture(scope="module")
def matrix(services: ServiceFactory, stack: Any) -> Iterator[Matrix]:
    secret = create_secret_key()
    env = auth_env(secret)
    bootstrap = stack.kafka_bootstrap
    policy = services.start("policy", env=env)
    own, other = "ko" + uuid.uuid4().hex[:8], "kx" + uuid.uuid4().hex[:8]
    root = {"Authorization": f"Bearer {create_token(secret, 'HS256', SUPER)}"}
    for tenant, admin in ((own, ADMIN), (other, OTHER_ADMIN)):
        assert httpx.put(f"{policy.url}/admin/v2/tenants/{tenant}", json={
            "adminRoles": [admin]}, headers=root, timeout=30).status_code == 204
        assert httpx.put(f"{policy.url}/admin/v2/namespaces/{tenant}/ns", headers=root,
                         timeout=30).status_code == 204
    for role, action in ((PRODUCER, "produce"), (CONSUMER, "consume")):
        assert httpx.post(f"{policy.url}/admin/v2/namespaces/{own}/ns/permissions/{role}",
                          json=[action], headers=root, timeout=30).status_code == 204
    tokens = {}
    for role in CALLERS.values():
        got = httpx.post(f"{policy.url}/admin/v2/kafka-tokens", headers={
            "Authorization": f"Bearer {create_token(secret, 'HS256', role)}"}, timeout=30)
        assert got.status_code == 200, got.text
        tokens[role] = got.json()["token"]
    topics = {OWN: f"persistent://{own}/ns/x", OTHER: f"persistent://{other}/ns/x"}
    redis_url = policy.env["DWELL_REDIS_URL"]
    r = redis_adapter.connect(redis_url)
    for topic in topics.values():  # registered, as the SDK does
        subscriptions.put(r, topic, "s", SubscriptionSettings.from_json({}))

    group = f"dwell-admission-km-{uuid.uuid4().hex[:8]}"
    kafka.start_group_at_end(bootstrap, group, [names.PUBLISH])
    results_end = kafka.end_offsets(bootstrap, names.PUBLISH_RESULTS)
    acks_end = kafka.end_offsets(bootstrap, names.ACKS)
    producer_name = f"matrix-{own}"
    p = kafka.Producer(bootstrap, linger_ms=0)
    for seq, (caller, where) in enumerate(CELLS):
        role = CALLERS[caller]
        auth = {hdr.AUTHORIZATION: f"Bearer {tokens[role]}"}
        p.send(names.PUBLISH, orjson.dumps({
            "topic": topics[where], "producerName": producer_name,
            "messages": [{"payload": f"{caller}/{where}", "sequenceId": seq}]}),
            topics[where], auth).result(15)
        ready = TopicName.parse(topics[where]).kafka_topic
        p.send(names.ACKS, json.dumps({
            "event": "ack", "topic": topics[where], "subscription": "s",
            "messageId": f"{ready}:0:{seq}", "ts": int(time.time() * 1000)}).encode(),
            f"{caller}/{where}".encode(), auth).result(15)
    p.close()

    admission = services.start("admission", env=env | {"DWELL_INGRESS_GROUP": group})
    try:
        def by_seq(recs: list[kafka.Record]) -> dict[int, dict[str, Any]]:
            return {res["sequenceId"]: res for res in (
                orjson.loads(x.value) for x in recs if x.key == producer_name.encode())}
        results = by_seq(read_until(bootstrap, names.PUBLISH_RESULTS, results_end,
                                    lambda recs: len(by_seq(recs)) >= len(CELLS), 90))
    finally:
        admission.stop()
        policy.stop()
    published = {cell: results[seq] for seq, cell in enumerate(CELLS)}
    ready = {where: sorted(x.value for x in kafka.read_all(
        bootstrap, TopicName.parse(topic).kafka_topic)) for where, topic in topics.items()}

    cell_keys = {f"{caller}/{where}".encode(): (caller, where) for caller, where in CELLS}
    events = [x for x in read_until(bootstrap, names.ACKS, acks_end, lambda recs: len(
        [x for x in recs if x.key in cell_keys]) >= len(CELLS), 30) if x.key in cell_keys]
    settings = SparkSettings(  # type: ignore[call-arg]
        kafka_bootstrap=bootstrap, redis_url=redis_url, authentication_enabled=True,
        authorization_enabled=True, super_user_roles=SUPER,
        token_secret_key=env["DWELL_TOKEN_SECRET_KEY"])
    checked = check_records(
        [x.value for x in events], [[x.headers[hdr.AUTHORIZATION]] for x in events],
        settings.acks_max_event_bytes, frozenset(), AckAuth.of(settings),
        [x.timestamp_ms for x in events],
        [LOG_APPEND_TIME if x.log_append_time else 0 for x in events],
        SubscriptionCheck.of(settings))
    acked = {cell_keys[x.key]: (kind, reason) for x, (kind, reason, _) in zip(
        events, checked, strict=True)}
    yield Matrix(topics, published, ready, acked)
    for topic in topics.values():
        r.delete(keys.subscriptions(topic))


@pytest.mark.parametrize(("caller", "where"), CELLS)
def test_publish_on_kafka(matrix: Matrix, caller: str, where: str) -> None:
    result = matrix.published[(caller, where)]
    payload = f"{caller}/{where}".encode()
    if (CALLERS[caller], where) in MAY_PUBLISH:
        assert result["errorCode"] == 0, result
        assert payload in matrix.ready[where]
    else:
        assert result["errorCode"] == 4, result
        assert result["messageId"] == "-1"
        assert f"may not produce on {TopicName.parse(matrix.topics[where]).namespace_name}" \
            in result["errorMsg"], result
        assert payload not in matrix.ready[where]


@pytest.mark.parametrize(("caller", "where"), CELLS)
def test_ack_event_on_kafka(matrix: Matrix, caller: str, where: str) -> None:
    kind, reason = matrix.acked[(caller, where)]
    if (CALLERS[caller], where) in MAY_ACK:
        assert (kind, reason) == (None, None)
    else:
        assert kind == invalid.UNAUTHORIZED, (kind, reason)
        assert reason == (f"role {CALLERS[caller]!r} may not consume on "
                          f"{TopicName.parse(matrix.topics[where]).namespace_name}")
