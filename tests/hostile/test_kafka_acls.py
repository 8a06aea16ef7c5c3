"""Kafka locked down with ACLs (issue 28, finding 3): on the secured stack (devstack
`--secure`, KRaft's StandardAuthorizer, dwell_dev.kafka_acls) a user's principal is
refused by Kafka everything but what its tenant needs: it cannot write `dwell.policies`
(make itself a tenant's admin) or `dwell.delayed` (have the drain deliver to a victim),
read the requests and ack events other clients sent (their tokens ride in the headers),
read another tenant's topics or join its groups, create topics or grant itself rights.
What it may do works: publish over `dwell.publish` and read the message on its own ready
topic in a group of its own, and each dwell component runs as its own principal.

Each refused attempt is printed with Kafka's error (`pytest -s` shows them)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from dwell import headers as hdr
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell_dev import devstack, kafka_acls, secure_stack
from dwell_dev.testkit import free_port

TIMEOUT_S = 20
# A publish over dwell.publish goes through admission's ingress and a transaction before
# a reader sees it: on a loaded machine, tens of seconds (the smoke hook allows 90).
DELIVERY_S = 90


@pytest.fixture(scope="module")
def secured() -> Iterator[devstack.Stack]:
    """The secured stack (tests/secure starts the same one, profile `secure`)."""
    s = devstack.Stack("secure")
    secure_stack.prepare(s, True)
    started = [n for n in s.available() if not s.pid(n)]
    s.up()
    yield s
    if os.environ.get("DWELL_TEST_KEEP_SERVERS") != "1":
        s.down(list(reversed(started)))


def broker_admin(s: devstack.Stack) -> AdminClient:
    return AdminClient(secure_stack.broker_librdkafka_config(s.pki, s.kafka_bootstrap))


def admin_cli(s: devstack.Stack, *args: str) -> str:
    env = dict(os.environ) | s.service_env()
    done = subprocess.run([str(Path(sys.executable).parent / "dwell-admin"), *args],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout.strip()


def kafka_token(s: devstack.Stack, token: str) -> str:
    """A short-lived Kafka token for ``token``'s role, from the stack's policy service
    over HTTPS (what a client sends on dwell.publish and dwell.acks: never ``token``)."""
    got = httpx.post(f"{s.scheme}://127.0.0.1:{s.ports['policy']}/admin/v2/kafka-tokens",
                     headers={"Authorization": f"Bearer {token}"}, timeout=30,
                     verify=ssl.create_default_context(cafile=str(s.pki / "ca.pem")))
    assert got.status_code == 200, got.text
    kafka: str = got.json()["token"]
    return kafka


class Tenant:
    """A tenant with a namespace, a topic whose ready topic exists, a role granted
    produce and consume (its token) and a Kafka user made with kafka_acls.user_rules."""

    def __init__(self, s: devstack.Stack) -> None:
        self.stack = s
        self.name = f"hacl{uuid.uuid4().hex[:8]}"
        self.principal = f"app-{self.name}"
        ns = f"{self.name}/ns"
        for args in (("tenants", "create", self.name), ("namespaces", "create", ns),
                     ("namespaces", "grant-permission", ns, "--role", self.principal,
                      "--actions", "produce,consume")):
            admin_cli(s, *args)
        self.token = admin_cli(s, "tokens", "create", "--secret-key",
                               f"file:{s.pki / 'token-secret.key'}",
                               "--subject", self.principal)
        self.topic = f"persistent://{ns}/t"
        self.ready = TopicName.parse(self.topic).kafka_topic
        admin = broker_admin(s)
        admin.create_topics([NewTopic(self.ready, 1, 1)])[self.ready].result(TIMEOUT_S)
        password = secure_stack.kafka_password(s.pki, self.principal)
        kafka_acls.grant_user(admin, self.principal, self.name, password)
        self.config = {"bootstrap.servers": s.kafka_bootstrap, "security.protocol": "SASL_SSL",
                       "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": self.principal,
                       "sasl.password": password, "ssl.ca.location": str(s.pki / "ca.pem")}

    def kafka_auth(self) -> dict[str, str]:
        """The `dwell-authorization` header of a record on dwell.publish or dwell.acks:
        a fresh Kafka token got with the tenant's token."""
        return {hdr.AUTHORIZATION: f"Bearer {kafka_token(self.stack, self.token)}"}


@pytest.fixture(scope="module")
def tenants(secured: devstack.Stack) -> tuple[Tenant, Tenant]:
    return Tenant(secured), Tenant(secured)


def refused(what: str, attempt: Callable[[], KafkaError | None]) -> KafkaError:
    err = attempt()
    assert err is not None, f"{what}: Kafka allowed it"
    # Kafka's text may carry a dump of the request: its start says enough.
    print(f"refused: {what}: {err.name()} ({err.str()[:100]})")
    return err


def produce(config: dict[str, str], topic: str, value: bytes, key: str | None = None,
            headers: dict[str, str] | None = None) -> KafkaError | None:
    """The delivery report's error, None once Kafka took the record."""
    p = Producer({**config, "message.timeout.ms": TIMEOUT_S * 1000, "linger.ms": 0})
    outcome: list[KafkaError | None] = []
    p.produce(topic, value, key, headers=headers,
              on_delivery=lambda err, _msg: outcome.append(err))
    p.flush(TIMEOUT_S + 5)
    assert outcome, f"no delivery report for {topic}"
    return outcome[0]


def consume(config: dict[str, str], group: str, topic: str,
            until: Callable[[Message], bool] | None = None,
            timeout_s: float = TIMEOUT_S) -> KafkaError | Message | None:
    """The first error Kafka answers a read of ``topic`` in ``group`` with, or the first
    record ``until`` accepts; None if neither came in time. The read subscribes: a
    partition assigned by hand of a topic the principal may not even describe is never
    fetched, and nothing says why."""
    c = Consumer({**config, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                return msg.error()
            if until is None or until(msg):
                return msg
        return None
    finally:
        c.close()


def admin_error(call: Callable[[], object]) -> KafkaError | None:
    try:
        call()
    except KafkaException as exc:
        return exc.args[0]
    return None


def test_a_user_principal_is_refused_what_its_tenant_does_not_need(
        tenants: tuple[Tenant, Tenant]) -> None:
    me, other = tenants
    mine = me.config
    admin = AdminClient(mine)
    policy = json.dumps({"adminRoles": [me.principal], "allowedClusters": []}).encode()
    errors = {
        "write dwell.policies (make itself the admin of a tenant)": refused(
            "write dwell.policies", lambda: produce(
                mine, names.POLICIES, policy, f"tenant:{other.name}")),
        "write dwell.delayed (a message for another tenant's topic)": refused(
            "write dwell.delayed", lambda: produce(
                mine, names.DELAYED, b"x", other.topic, {hdr.TOPIC: other.topic})),
        "write its own ready topic (past admission's checks)": refused(
            "write its own ready topic", lambda: produce(mine, me.ready, b"x")),
        "read dwell.publish (other clients' requests and tokens)": refused(
            "read dwell.publish", lambda: _error(consume(mine, f"{me.ready}-g",
                                                         names.PUBLISH))),
        "read dwell.acks (other clients' events and tokens)": refused(
            "read dwell.acks", lambda: _error(consume(mine, f"{me.ready}-g", names.ACKS))),
        "read dwell.publish.results (every tenant's results)": refused(
            "read dwell.publish.results", lambda: _error(consume(
                mine, f"{me.ready}-g", names.PUBLISH_RESULTS))),
        "read another tenant's publish results": refused(
            "read another tenant's results", lambda: _error(consume(
                mine, f"{me.ready}-g", names.tenant_results_topic(other.name)))),
        "read dwell.delayed": refused(
            "read dwell.delayed", lambda: _error(consume(mine, f"{me.ready}-g",
                                                         names.DELAYED))),
        "read another tenant's ready topic": refused(
            "read another tenant's ready topic",
            lambda: _error(consume(mine, f"{me.ready}-g", other.ready))),
        "join another tenant's consumer group": refused(
            "join another tenant's consumer group",
            lambda: _error(consume(mine, f"{other.ready}-g", me.ready))),
        "create a topic under its own tenant": refused(
            "create a topic", lambda: admin_error(lambda: admin.create_topics(
                [NewTopic(f"{me.ready}-new", 1, 1)])[f"{me.ready}-new"].result(TIMEOUT_S))),
        "grant itself rights": refused(
            "create an ACL", lambda: admin_error(lambda: kafka_acls.apply(
                admin, kafka_acls.user_rules(me.principal, other.name)))),
    }
    codes = {what: e.code() for what, e in errors.items()}
    topic_refusals = [w for w in codes if w.startswith(("write", "read", "create"))]
    assert all(codes[w] == KafkaError.TOPIC_AUTHORIZATION_FAILED for w in topic_refusals), codes
    assert codes["join another tenant's consumer group"] == (
        KafkaError.GROUP_AUTHORIZATION_FAILED), codes
    assert codes["grant itself rights"] == KafkaError.CLUSTER_AUTHORIZATION_FAILED, codes


def _error(got: KafkaError | Message | None) -> KafkaError | None:
    assert not isinstance(got, Message), f"read a record: {got.value()!r:.80}"
    return got


def test_a_user_publishes_over_dwell_publish_and_reads_its_own_ready_topic(
        tenants: tuple[Tenant, Tenant]) -> None:
    """What the user's principal may do, end to end through admission and back: write a
    publish request, read its result on its tenant's results topic and the message in a
    group of its own."""
    me, _ = tenants
    payload = f"over-kafka-{uuid.uuid4().hex[:6]}".encode()
    producer_name = f"{me.principal}-p"
    request = {"topic": me.topic, "producerName": producer_name,
               "messages": [{"payload": payload.decode(), "sequenceId": 1}]}
    err = produce(me.config, names.PUBLISH, json.dumps(request).encode(), me.topic,
                  me.kafka_auth())
    assert err is None, err
    got = consume(me.config, f"{me.ready}-reader", me.ready,
                  until=lambda m: m.value() == payload, timeout_s=DELIVERY_S)
    assert isinstance(got, Message), got
    result = consume(me.config, f"{me.ready}-results", names.tenant_results_topic(me.name),
                     until=lambda m: m.key() == producer_name.encode(), timeout_s=DELIVERY_S)
    assert isinstance(result, Message), result
    answer = json.loads(result.value())
    assert answer["errorCode"] == 0, answer
    assert answer["messageId"] == f"{me.ready}:{got.partition()}:{got.offset()}", answer
    ack = {"event": "ack", "topic": me.topic, "subscription": f"{me.ready}-reader",
           "messageId": answer["messageId"], "redeliveryCount": 0,
           "ts": int(time.time() * 1000)}
    err = produce(me.config, names.ACKS, json.dumps(ack).encode(),
                  f"{me.topic}/{me.ready}-reader", me.kafka_auth())
    assert err is None, err


def test_each_component_runs_as_its_own_principal(secured: devstack.Stack) -> None:
    """The ACLs the broker holds are the table's (`make acls` prints them), and every
    dwell process was started with its own Kafka login, none with the broker's."""
    held = set(kafka_acls.held(broker_admin(secured)))
    table = set(kafka_acls.table(secure_stack.KAFKA_USERS))
    principals = {r.principal for r in table}
    assert {r for r in held if r.principal in principals} == table
    assert not any(r.principal == f"User:{secure_stack.BROKER_USER}" for r in held)
    for name, principal in secure_stack.KAFKA_COMPONENTS.items():
        env = secured.proc(name).env
        assert env["DWELL_KAFKA_SASL_USERNAME"] == principal, (name, env)
    print(kafka_acls.render(sorted(table)))


def test_the_operators_table_in_the_docs_is_the_applied_one() -> None:
    """docs/kubernetes.md gives an operator the rules kafka_acls applies (for a user
    `app-acme` of tenant `acme`), one row per principal and resource."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text()
    rows = {}
    for r in kafka_acls.table({"app-acme": "acme"}):
        rows.setdefault((r.principal, r.resource, r.pattern, r.name), []).append(r.operation)
    missing = [row for (p, res, pat, name), ops in rows.items()
               if (row := f"| `{p}` | {res} | {pat} | `{name}` | {', '.join(sorted(ops))} |")
               not in docs]
    assert not missing, f"{len(missing)} rows not in docs/kubernetes.md: {missing[:3]}"


def test_a_tracker_that_may_not_keep_its_delay_log_refuses_to_start(
        secured: devstack.Stack) -> None:
    """Issue 29 on a locked Kafka: a delay log whose retention would drop pending messages
    (7 days, a stock broker's), and a tracker whose principal may see the log's settings
    but not change them. It refuses to start, naming the topic, the setting and the right
    it lacks, rather than index messages the broker will delete."""
    tag = uuid.uuid4().hex[:8]
    log = f"dwell.delayed.t{tag}"
    admin = broker_admin(secured)
    admin.create_topics([NewTopic(log, 4, 1, config={"retention.ms": "604800000"})]
                        )[log].result(TIMEOUT_S)
    principal = f"dwell-tracker-{tag}"
    kafka_acls.upsert_users(admin, {principal: secure_stack.kafka_password(secured.pki,
                                                                          principal)})
    kafka_acls.apply(admin, [kafka_acls.Rule(f"User:{principal}", "topic", name, "literal", op)
                             for name in (log, f"{log}.refiled", names.DELIVERED)
                             for op in ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS")])
    env = (dict(os.environ) | secured.service_env()
           | secure_stack.kafka_user_env(secured.pki, principal)
           | {"DWELL_DELAYED_TOPIC": log, "DWELL_TRACKER_GROUP_ID": f"dwell-trk-{tag}",
              "DWELL_HTTP_PORT": str(free_port())})
    done = subprocess.run([sys.executable, "-m", "dwell.tracker"], env=env, text=True,
                          capture_output=True, timeout=120)
    said = done.stdout + done.stderr
    refusal = next((line for line in said.splitlines()
                    if "dwell tracker refuses to start" in line), "")
    print(f"\n{refusal}")
    assert done.returncode != 0, said[-2000:]
    assert f"topic {log} has retention.ms=604800000" in refusal, said[-2000:]
    assert "TOPIC_AUTHORIZATION_FAILED" in refusal and "ALTER_CONFIGS" in refusal
    config = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, log)])
    entries = next(iter(config.values())).result(TIMEOUT_S)
    assert entries["retention.ms"].value == "604800000"  # left as the operator set it
