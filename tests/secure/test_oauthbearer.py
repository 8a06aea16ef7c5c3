"""OAUTHBEARER on the secured stack's SASL_SSL listener, as a managed Kafka with an OIDC
provider has it: dwell's clients (librdkafka) and Kafka's Java client (what Spark's Kafka
source and sink use, at Spark's own client version) fetch tokens from a client-credentials
token endpoint (tests/secure/oidc.py) with the properties dwell.security makes of the
DWELL_KAFKA_SASL_OAUTHBEARER_* settings, and the broker checks each token's signature,
issuer and audience against the stack's JWKS. A wrong client secret gets no token, and a
token signed by a key the broker does not know, or made for another audience, gets no
connection (Kafka 4.1 checks neither unless the broker names its JWT validator:
dwell_dev.secure_stack)."""

from __future__ import annotations

import secrets
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from dwell.adapters import kafka
from dwell.security import (
    KafkaSecurity,
    java_kafka_config,
    java_oauth_system_properties,
    librdkafka_config,
)
from dwell_dev import devinstall, devstack, kafka_acls, secure_stack
from secure.conftest import broker_admin
from secure.oidc import TokenEndpoint

CLIENT_ID = "dwell-oidc-client"
JAVA_SOURCE = Path(__file__).parent / "java" / "KafkaRoundTrip.java"


# The OIDC client's principal (its tokens' `sub`) is a user of this tenant: it reads the
# tenant's topics in the tenant's groups and creates nothing (dwell_dev.kafka_acls). The
# round trips below also write those topics, which a dwell user leaves to dwell.
TENANT = "oidc"


@pytest.fixture(scope="module")
def oidc(secured: devstack.Stack) -> Iterator[TokenEndpoint]:
    admin = broker_admin(secured)
    kafka_acls.grant_user(admin, CLIENT_ID, TENANT)
    kafka_acls.apply(admin, [kafka_acls.Rule(f"User:{CLIENT_ID}", "topic", f"{TENANT}.",
                                             "prefixed", "WRITE")])
    endpoint = TokenEndpoint(secured.pki, CLIENT_ID, secrets.token_urlsafe(16))
    yield endpoint
    endpoint.close()


def tenant_topic(secured: devstack.Stack) -> str:
    """A topic of the tenant, made as the broker's super-user (users make none)."""
    topic = f"{TENANT}.{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in secure_stack.broker_env(secured.pki).items():
            mp.setenv(k, v)
        assert kafka.ensure_topic(bootstrap(secured), topic, partitions=1)
    return topic


def oauth_env(secured: devstack.Stack, oidc: TokenEndpoint, secret: str) -> dict[str, str]:
    return {"DWELL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "DWELL_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            "DWELL_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": oidc.url,
            "DWELL_KAFKA_SASL_OAUTHBEARER_CLIENT_ID": CLIENT_ID,
            "DWELL_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": secret,
            "DWELL_KAFKA_SASL_OAUTHBEARER_SCOPE": "kafka",
            "DWELL_KAFKA_SSL_CA_LOCATION": str(secured.pki / "ca.pem")}


def bootstrap(secured: devstack.Stack) -> str:
    return f"127.0.0.1:{secured.ports['kafka']}"


def test_dwell_clients_produce_and_consume_with_oidc_tokens(
        secured: devstack.Stack, oidc: TokenEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in oauth_env(secured, oidc, oidc.client_secret).items():
        monkeypatch.setenv(k, v)
    before = len(oidc.issued)
    topic = tenant_topic(secured)
    p = kafka.Producer(bootstrap(secured), linger_ms=0)
    try:
        for i in range(5):
            p.send(topic, b"v%d" % i, key=b"k").result(30)
    finally:
        p.close()
    c = kafka.Consumer(bootstrap(secured), f"{topic}-{uuid.uuid4().hex[:6]}", [topic])
    try:
        got: list[bytes | None] = []
        for _ in range(60):
            got += [r.value for r in c.poll(10, 0.5)]
            if len(got) >= 5:
                break
    finally:
        c.close()
    assert got == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    issued = oidc.issued[before:]
    assert issued, "the clients connected without fetching a token"
    assert {t["sub"] for t in issued} == {CLIENT_ID}
    assert {t["scope"] for t in issued} == {"kafka"}


def security(secured: devstack.Stack, oidc: TokenEndpoint, secret: str) -> KafkaSecurity:
    return KafkaSecurity(**{k.removeprefix("DWELL_").lower(): v
                            for k, v in oauth_env(secured, oidc, secret).items()})


def admin_fails(secured: devstack.Stack, sec: KafkaSecurity) -> str:
    client = AdminClient({"bootstrap.servers": bootstrap(secured), **librdkafka_config(sec)})
    with pytest.raises(KafkaException) as exc:
        client.list_topics(timeout=8)
    return str(exc.value)


def test_a_wrong_client_secret_gets_no_token_and_no_connection(
        secured: devstack.Stack, oidc: TokenEndpoint) -> None:
    refused = oidc.refused
    sec = security(secured, oidc, "not-the-secret")
    admin_fails(secured, sec)
    assert oidc.refused > refused


@pytest.mark.parametrize("bad", ["signed by an unknown key", "for another audience"])
def test_the_broker_refuses_a_token_it_should_not_trust(
        secured: devstack.Stack, oidc: TokenEndpoint, bad: str) -> None:
    sec = security(secured, oidc, oidc.client_secret)
    issued = len(oidc.issued)
    if bad == "signed by an unknown key":
        oidc.forge = True
    else:
        oidc.audience = "another-service"
    try:
        admin_fails(secured, sec)
    finally:
        oidc.forge = False
        oidc.audience = secure_stack.OIDC_AUDIENCE
    assert len(oidc.issued) > issued  # a token was issued, and the broker refused it


def java_classpath(client: str) -> str:
    """Kafka's Java client: at the version Spark's Kafka connector runs, beside Spark's own
    jars (the classpath the Spark app's drivers and executors have), or at the broker's
    version (4.x, its libs)."""
    if client == "kafka-4":
        return f"{devinstall.kafka_libs()}/*"
    import pyspark
    clients = [j for j in devinstall.spark_kafka_jars() if j.name.startswith("kafka-clients-")]
    assert clients, "Spark's Kafka connector jars are not resolved"
    return ":".join([*(str(j) for j in clients), f"{Path(pyspark.__file__).parent}/jars/*"])


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """KafkaRoundTrip.java compiled (against the Kafka client API both versions share)."""
    out = tmp_path_factory.mktemp("java")
    subprocess.run(["javac", "-d", str(out), "-cp", java_classpath("kafka-4"),
                    str(JAVA_SOURCE)], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("client", ["spark", "kafka-4"])
def test_kafka_java_client_authenticates_with_dwells_properties(
        secured: devstack.Stack, oidc: TokenEndpoint, round_trip: Path, tmp_path: Path,
        client: str) -> None:
    """What Spark's Kafka source and sink get (dwell.security.spark_kafka_options, less
    the `kafka.` prefix, and the JVM options of java_oauth_system_properties), run by
    Kafka's Java client outside Spark."""
    sec = security(secured, oidc, oidc.client_secret)
    props = tmp_path / "client.properties"
    conf = {"bootstrap.servers": bootstrap(secured), **java_kafka_config(sec)}
    props.write_text("".join(f"{k}={v}\n".replace("\\", "\\\\") for k, v in conf.items()))
    topic = tenant_topic(secured)

    def run(*jvm: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["java", "-cp", f"{round_trip}:{java_classpath(client)}", *jvm,
                               "KafkaRoundTrip", str(props), topic, "5"],
                              capture_output=True, text=True, timeout=120)

    if client == "kafka-4":
        # Kafka 4's client fetches no token from an endpoint the JVM does not allow.
        refused = run()
        assert refused.returncode != 0
        assert "allowed.urls" in refused.stdout + refused.stderr
    before = len(oidc.issued)
    out = run(*java_oauth_system_properties(sec))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "round trip: 5 of 5" in out.stdout
    assert len(oidc.issued) > before
