"""End to end on the secured stack, auth on: a delayed message published over HTTPS with
a token of a role granted `produce` arrives on time at a SASL_SSL consumer, a nack comes
back through the retry topic, plain-text clients are refused by Kafka, Redis and the
HTTPS ports, a missing or foreign token by the services, and no test secret shows in the
logs, metrics, OpenAPI documents or error answers."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import kafka as kafka_python
import pytest
import redis as redislib
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from dwell.client import Consumer, ExponentialRedeliveryBackoff, Producer
from dwell.core.topics import TopicName
from dwell.security import KafkaSecurity, kafka_python_config
from dwell_dev import devstack, secure_stack
from dwell_dev.testkit import now_ms
from secure.conftest import tenant_user

TICK_MS = 1000
# A delivery may be late by a tick (Pulsar's bound) plus a drain trigger and round; the
# rest is headroom for a loaded 2-core machine, as in tests/e2e.
LATE_MS = TICK_MS + 4000
DELAY_MS = 4000
NACK_MIN_MS = 1000
# The first nack of a fresh app waits for the backoff query's first real micro-batch
# (Python workers, state store): 16 s on a 2-core machine at load 40. This suite checks
# the secured path; tests/e2e holds redelivery timing to its bounds.
REDELIVERY_WAIT_MS = 60_000


def secrets_of(s: devstack.Stack) -> dict[str, str]:
    out = {name: (s.pki / name).read_text()
           for name in ("kafka-broker-password", "redis-password", "admin.token")}
    out |= {f.name: f.read_text() for f in s.pki.glob("kafka-*-password")}
    key = (s.pki / "token-secret.key").read_bytes()
    out["token secret key (base64)"] = base64.b64encode(key).decode()
    out["token secret key (base64url)"] = base64.urlsafe_b64encode(key).decode().rstrip("=")
    out["token secret key (hex)"] = key.hex()
    return out


def ca(s: devstack.Stack) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(s.pki / "ca.pem"))


def url(s: devstack.Stack, name: str) -> str:
    return f"https://127.0.0.1:{s.ports[name]}"


def admin_cli(s: devstack.Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ) | s.service_env() | {"COLUMNS": "120"}
    return subprocess.run([str(Path(sys.executable).parent / "dwell-admin"), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def token(s: devstack.Stack, role: str) -> str:
    done = admin_cli(s, "tokens", "create", "--secret-key",
                     f"file:{s.pki / 'token-secret.key'}", "--subject", role)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def namespace(secured: devstack.Stack) -> str:
    """A tenant and namespace made with dwell-admin over HTTPS as the super-user (the
    stack's DWELL_AUTH_PARAMS), delayed delivery on, role `app` granted produce and
    consume."""
    ns = f"sec{uuid.uuid4().hex[:8]}/app"
    tenant = ns.split("/")[0]
    for args in (("tenants", "create", tenant), ("namespaces", "create", ns),
                 ("namespaces", "set-delayed-delivery", ns, "--time", f"{TICK_MS}ms",
                  "--enable"),
                 ("namespaces", "grant-permission", ns, "--role", "app",
                  "--actions", "produce,consume")):
        done = admin_cli(secured, *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return ns


@pytest.fixture(scope="module")
def app_token(secured: devstack.Stack) -> str:
    return token(secured, "app")


def test_delayed_message_and_nack_redelivery_over_sasl_ssl(
        secured: devstack.Stack, namespace: str, app_token: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As the tenant's own Kafka principal, which may read its ready and retry topics in
    its own groups and create nothing: the tracker makes both topics on registration."""
    tenant = namespace.split("/")[0]
    for k, v in tenant_user(secured, f"app-{tenant}", tenant).items():
        monkeypatch.setenv(k, v)
    topic = f"persistent://{namespace}/orders-{uuid.uuid4().hex[:6]}"
    backoff = ExponentialRedeliveryBackoff.builder().min_delay_ms(NACK_MIN_MS).max_delay_ms(
        NACK_MIN_MS).multiplier(2).build()
    # Named under the tenant's Kafka prefix, as the tenant's consumer groups are.
    with Consumer(topic, f"{tenant}.secure-app", negative_ack_redelivery_backoff=backoff,
                  initial_position="earliest", token=app_token) as consumer, \
            Producer(topic, token=app_token) as producer:
        sent = now_ms()
        mid = producer.send(b"later", deliver_after=DELAY_MS)
        due = sent + DELAY_MS
        msg = None
        while now_ms() < due + LATE_MS + 10_000:
            msg = consumer.receive(timeout=0.2)
            if msg is not None:
                break
        got = now_ms()
        assert msg is not None, "the delayed message did not arrive"
        assert msg.message_id == mid and msg.data() == b"later"
        assert msg.deliver_at is not None and msg.deliver_at >= due
        # Not strict (Pulsar's default): a message may come up to one tick early.
        assert got >= msg.deliver_at - TICK_MS, f"{msg.deliver_at - got} ms early"
        assert got - msg.deliver_at <= LATE_MS, f"{got - msg.deliver_at} ms late"

        consumer.negative_acknowledge(msg)
        nacked = now_ms()
        again = None
        while now_ms() < nacked + REDELIVERY_WAIT_MS:
            again = consumer.receive(timeout=0.2)
            if again is not None:
                break
        back = now_ms()
        assert again is not None, "the nacked message was not redelivered"
        assert again.message_id == mid and again.redelivery_count == 1
        assert back - nacked >= NACK_MIN_MS, f"redelivered {back - nacked} ms after the nack"
        consumer.acknowledge(again)

    # Any Kafka client reads the ready topic over SASL_SSL with the same settings.
    reader = kafka_python.KafkaConsumer(
        TopicName.parse(topic).kafka_topic, bootstrap_servers=secured.kafka_bootstrap,
        auto_offset_reset="earliest", consumer_timeout_ms=15000,
        **kafka_python_config(KafkaSecurity()))
    try:
        values = [r.value for r in reader]
    finally:
        reader.close()
    assert b"later" in values


def test_policy_reads_stats_from_the_tracker_over_https(
        secured: devstack.Stack, namespace: str, app_token: str) -> None:
    topic = f"persistent://{namespace}/stats-{uuid.uuid4().hex[:6]}"
    with Producer(topic, token=app_token) as producer:
        producer.send(b"x", deliver_after=30_000)
    t = TopicName.parse(topic)
    with httpx.Client(base_url=url(secured, "policy"), verify=ca(secured),
                      headers={"Authorization": f"Bearer {app_token}"}) as http:
        # Admission makes the ready topic with 4 partitions: a partitioned topic's
        # partition has the stats.
        r = http.get(f"/admin/v2/persistent/{t.tenant}/{t.namespace}/{t.local}"
                     "-partition-0/stats")
    assert r.status_code == 200, r.text
    assert r.json()["delayedMessageIndexSizeInBytes"] >= 0


def test_publishing_needs_a_token_of_a_granted_role(secured: devstack.Stack,
                                                    namespace: str) -> None:
    body = {"messages": [{"payload": "eA==", "deliverAfterMs": 1000}]}
    path = f"/topics/persistent/{namespace}/auth-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=url(secured, "admission"), verify=ca(secured)) as http:
        assert http.post(path, json=body).status_code == 401
        other = {"Authorization": f"Bearer {token(secured, 'stranger')}"}
        assert http.post(path, json=body, headers=other).status_code == 403


def test_plain_text_kafka_client_is_refused(secured: devstack.Stack) -> None:
    plain = AdminClient({"bootstrap.servers": secured.kafka_bootstrap,
                         "socket.connection.setup.timeout.ms": 3000})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)
    wrong = AdminClient({"bootstrap.servers": secured.kafka_bootstrap,
                         "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": "dwell-admission",
                         "sasl.password": "not-the-password",
                         "ssl.ca.location": str(secured.pki / "ca.pem")})
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=5)


def test_plain_text_and_unauthenticated_redis_clients_are_refused(
        secured: devstack.Stack) -> None:
    port = secured.ports["redis"]
    with pytest.raises(redislib.ConnectionError):
        redislib.Redis(port=port, socket_timeout=3).ping()
    tls = {"ssl": True, "ssl_ca_certs": str(secured.pki / "ca.pem"), "socket_timeout": 3}
    with pytest.raises(redislib.AuthenticationError):  # the default user is off
        redislib.Redis(port=port, **tls).ping()
    with pytest.raises(redislib.AuthenticationError):
        redislib.Redis(port=port, username="dwell", password="not-the-password", **tls).ping()
    ok = redislib.Redis(port=port, username="dwell",
                        password=secrets_of(secured)["redis-password"], **tls)
    assert ok.acl_whoami() in ("dwell", b"dwell")


@pytest.mark.parametrize("name", ["policy", "admission", "tracker", "spark"])
def test_http_ports_speak_only_tls(secured: devstack.Stack, name: str) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{secured.ports[name]}/healthz", timeout=5)
    r = httpx.get(f"{url(secured, name)}/healthz", verify=ca(secured), timeout=5)
    assert r.status_code == 200


def _leaks(text: str, secrets: dict[str, str]) -> list[str]:
    return [name for name, value in secrets.items() if value in text]


def test_no_secret_in_logs_metrics_openapi_or_errors(
        secured: devstack.Stack, namespace: str, app_token: str) -> None:
    secrets = secrets_of(secured)
    assert all(len(v) >= 16 for v in secrets.values())
    secrets["app token"] = app_token
    seen: dict[str, str] = {}
    with httpx.Client(verify=ca(secured), timeout=10) as http:
        for name in ("policy", "admission", "tracker", "spark"):
            seen[f"{name} /metrics"] = http.get(f"{url(secured, name)}/metrics").text
        for name in ("policy", "admission", "tracker"):
            for path in ("/openapi.json", "/docs", "/readyz"):
                seen[f"{name} {path}"] = http.get(f"{url(secured, name)}{path}").text
        # Error answers: a bad body, no token, an unknown route.
        r = http.post(f"{url(secured, 'admission')}/topics/persistent/{namespace}/x",
                      content=b"{not json", headers={"Authorization": f"Bearer {app_token}"})
        assert r.status_code == 400
        seen["admission 400"] = r.text
        seen["policy 401"] = http.get(f"{url(secured, 'policy')}/admin/v2/tenants").text
        seen["policy 404"] = http.get(f"{url(secured, 'policy')}/nope").text
    for log in sorted(secured.log_dir.glob("*.log")):
        seen[f"log {log.name}"] = log.read_text(errors="replace")
    # The settings' own repr, as a crash report or a debug print would show it.
    code = "from dwell.admission.settings import AdmissionSettings as S; print(repr(S()))"
    env = dict(os.environ) | secured.service_env() | devstack.secure_stack.server_env(
        secured.pki)
    seen["settings repr"] = subprocess.run([sys.executable, "-c", code], env=env,
                                           capture_output=True, text=True,
                                           check=True).stdout
    assert "SecretStr('**********')" in seen["settings repr"]
    leaks = {where: _leaks(text, secrets) for where, text in seen.items()}
    assert not {k: v for k, v in leaks.items() if v}, leaks
    assert len(seen) >= 16 and any(n.startswith("log kafka") for n in seen)


def test_certificates_and_passwords_are_private_state(secured: devstack.Stack) -> None:
    assert secured.pki.is_relative_to(devstack.STATE_ROOT)
    assert (secured.pki.stat().st_mode & 0o077) == 0
    assert all((f.stat().st_mode & 0o077) == 0 for f in secured.pki.iterdir()
               if f.name != "enabled")


def test_smoke_hook_authenticates_with_the_super_users_token(secured: devstack.Stack) -> None:
    """`python -m dwell.smoke` (the chart's `helm test` hook) over HTTPS and SASL_SSL with
    the token DWELL_AUTH_PARAMS names, as the chart's auth.testToken gives it; without
    one it fails and says what to set; with the services' HS256 key instead (the chart's
    auth.generateKeys) it signs a token of its own for the role it is given."""
    env = dict(os.environ) | secured.service_env() | secure_stack.kafka_user_env(
        secured.pki, "app-dwell-smoke")
    assert env["DWELL_AUTH_PARAMS"].startswith("file:")
    smoke = [sys.executable, "-m", "dwell.smoke", "--delay-ms", "2000", "--timeout-s", "90"]
    got = subprocess.run(smoke, env=env, capture_output=True, text=True, timeout=150)
    print(got.stdout, got.stderr)
    assert got.returncode == 0, got.stderr
    assert "smoke: ok:" in got.stdout

    del env["DWELL_AUTH_PARAMS"]
    got = subprocess.run(smoke, env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 1
    assert "answered 401" in got.stderr and "auth.testToken.existingSecret" in got.stderr, (
        got.stderr)

    # auth.generateKeys: the hook signs its own token with the key the services verify.
    env["DWELL_SMOKE_SIGNING_KEY"] = f"file:{secured.pki / 'token-secret.key'}"
    env["DWELL_SMOKE_ROLE"] = secure_stack.SUPER_USER
    got = subprocess.run(smoke, env=env, capture_output=True, text=True, timeout=150)
    print(got.stdout, got.stderr)
    assert got.returncode == 0, got.stderr
    assert "smoke: ok:" in got.stdout
    # A token signed for a role that is not a super-user cannot create the tenant.
    got = subprocess.run([*smoke, "--role", "nobody"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 1
    assert "must be a super-user" in got.stderr, got.stderr
