"""The chart's own Kafka locked down (kafka.auth.enabled, issue 28): SASL on both
listeners, KRaft's StandardAuthorizer with no rule for anyone else, the broker's own
login its only super-user, and the ACLs of files/kafka-acls.txt, which
dwell_dev.kafka_acls writes from its table (their one owner). Checked as rendered, then
for real: the rendered server.properties, start script, ACL file and acls container run
against Apache Kafka's own jars on this machine, and a user principal is refused what its
tenant does not need while dwell's components do their jobs."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import astuple
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from tests.chart.test_chart import CHART, by_kind, render
from tests.hostile.test_kafka_acls import admin_error, consume, produce, refused

from dwell.adapters.kafka import acls
from dwell.core import topics as names
from dwell.core.topics import TopicName
from dwell_dev import devinstall, kafka_acls
from dwell_dev.procs import Child

KAFKA = "rel-dwell-kafka"
USERS_SECRET = "rel-dwell-kafka-users"
# (container name in the rendered pods, the principal it must log in as)
LOGINS = {"policy": "dwell-policy", "admission": "dwell-admission",
          "tracker": "dwell-tracker", "driver": "dwell-spark", "smoke": "app-dwell-smoke"}


def kafka_config(docs: list[dict[str, Any]]) -> dict[str, str]:
    return by_kind(docs, "ConfigMap")[KAFKA]["data"]


def properties(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every container of the rendered pods, the executors' template's included."""
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            out |= {c["name"]: c for c in d["spec"]["template"]["spec"]["containers"]}
        elif d["kind"] == "Pod":
            out |= {c["name"]: c for c in d["spec"]["containers"]}
        elif d["kind"] == "ConfigMap" and "executor.yaml" in d.get("data", {}):
            pod = yaml.safe_load(d["data"]["executor.yaml"])
            out |= {c["name"]: c for c in pod["spec"]["containers"]}
    return out


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_the_charts_acl_file_is_what_kafka_acls_writes() -> None:
    """One owner: the committed file is `dwell_dev.kafka_acls chart`'s output, and its component
    rules are component_rules() exactly."""
    assert kafka_acls.CHART_FILE.read_text() == kafka_acls.chart_file(), \
        "stale: run .venv/bin/python -m dwell_dev.kafka_acls chart"
    rows = acls.parse(kafka_acls.CHART_FILE.read_text())
    component_rows = [r for r in rows if r[0] in {f"User:{c}" for c in kafka_acls.COMPONENTS}]
    assert sorted(component_rows) == sorted(astuple(r) for r in kafka_acls.component_rules())
    assert sorted(rows) == sorted(astuple(r) for r in kafka_acls.table(kafka_acls.CHART_USERS))


def test_a_malformed_rules_line_is_refused_by_its_number() -> None:
    assert acls.parse("# c\n\nUser:a topic t literal READ  # why\n") == [
        ("User:a", "topic", "t", "literal", "READ")]
    for bad in ("User:a topic t literal", "User:a table t literal READ",
                "User:a topic t literal RAED"):
        with pytest.raises(ValueError, match="line 2:"):
            acls.parse(f"# c\n{bad}\n")


def test_locked_kafka_renders_sasl_the_authorizer_the_acls_and_one_login_each(
        helm: str) -> None:
    docs = render(helm)
    data = kafka_config(docs)
    props = properties(data["server.properties"])
    assert props["authorizer.class.name"] == \
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:broker"
    assert props["listener.security.protocol.map"] == \
        "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"
    assert props["listeners"] == "SASL_PLAINTEXT://:9092,CONTROLLER://:9093"
    assert "SCRAM-SHA-512" in props["sasl.enabled.mechanisms"].split(",")
    # The ACLs the acls container applies are kafka_acls.py's table, nothing more.
    applied = acls.parse(data["kafka-acls.txt"])
    assert sorted(applied) == sorted(astuple(r)
                                     for r in kafka_acls.table(kafka_acls.CHART_USERS))
    print(f"rendered ACLs: {len(applied)} rules; first: {applied[:3]}")

    # One generated password per user, none in values or in any other manifest.
    secret = by_kind(docs, "Secret")[USERS_SECRET]
    users = {"broker", *kafka_acls.COMPONENTS, *kafka_acls.CHART_USERS}
    assert set(secret["data"]) == users
    passwords = [base64.b64decode(v).decode() for v in secret["data"].values()]
    assert all(len(p) >= 32 for p in passwords)
    others = [d for d in docs if d is not secret]
    assert not any(p in repr(others) for p in passwords)
    assert not any(p in (CHART / "values.yaml").read_text() for p in passwords)

    # Each dwell process logs in as its own principal, its password from the Secret.
    found = containers(docs)
    logins = {**LOGINS, "executor": "dwell-spark"}
    for name, principal in logins.items():
        env = env_of(found[name])
        assert env["DWELL_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT", name
        assert env["DWELL_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", name
        assert env["DWELL_KAFKA_SASL_USERNAME"] == principal, name
        assert env["DWELL_KAFKA_SASL_PASSWORD"] == {
            "secretKeyRef": {"name": USERS_SECRET, "key": principal}}, name
    # The broker's container sees its own password only; the acls container all of them.
    sts = by_kind(docs, "StatefulSet")[KAFKA]["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in sts["volumes"]}
    assert vols["broker-secret"]["secret"]["items"] == [{"key": "broker", "path": "broker"}]


def test_an_existing_secret_replaces_the_generated_one(helm: str) -> None:
    docs = render(helm, "--set", "kafka.auth.existingSecret=my-kafka-users")
    assert USERS_SECRET not in by_kind(docs, "Secret")
    env = env_of(containers(docs)["admission"])
    assert env["DWELL_KAFKA_SASL_PASSWORD"] == {
        "secretKeyRef": {"name": "my-kafka-users", "key": "dwell-admission"}}


def test_kafka_auth_off_keeps_the_plaintext_kafka(helm: str) -> None:
    docs = render(helm, "--set", "kafka.auth.enabled=false")
    props = properties(kafka_config(docs)["server.properties"])
    assert "authorizer.class.name" not in props
    assert props["listeners"] == "PLAINTEXT://:9092,CONTROLLER://:9093"
    assert USERS_SECRET not in by_kind(docs, "Secret")
    assert env_of(containers(docs)["policy"])["DWELL_KAFKA_SECURITY_PROTOCOL"] == "PLAINTEXT"
    assert "acls" not in containers(docs)


# ----------------------------------------------------------------- the rendered Kafka, run

PORT = 9092 + int(os.environ.get("DWELL_TEST_PORT_OFFSET", "10000")) + 300
CONTROLLER_PORT = PORT + 1
START_S = 90


@pytest.fixture(scope="module")
def locked_kafka(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        dict[str, Any]]:
    """The chart's Kafka as rendered, on this machine: its server.properties with only
    the addresses and the log dir changed, run by its start.sh through stand-ins for the
    image's kafka-storage.sh and kafka-server-start.sh (Kafka's own classes), then its
    acls container's command. Yields the users' passwords and a bootstrap address."""
    docs = render(helm)
    data = kafka_config(docs)
    work = tmp_path_factory.mktemp("kchart")
    props = data["server.properties"]
    local = {"listeners": f"SASL_PLAINTEXT://127.0.0.1:{PORT},"
                          f"CONTROLLER://127.0.0.1:{CONTROLLER_PORT}",
             "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{PORT}",
             "controller.quorum.voters": f"1@127.0.0.1:{CONTROLLER_PORT}",
             "log.dirs": str(work / "data")}
    for key, value in local.items():
        props, n = re.subn(rf"(?m)^{re.escape(key)}=.*$", f"{key}={value}", props)
        assert n == 1, key
    (work / "server.properties").write_text(props)
    (work / "start.sh").write_text(data["start.sh"])
    (work / "kafka-acls.txt").write_text(data["kafka-acls.txt"])
    secret = by_kind(docs, "Secret")[USERS_SECRET]["data"]
    passwords = {u: base64.b64decode(v).decode() for u, v in secret.items()}
    (work / "users").mkdir()
    for user, pw in passwords.items():
        (work / "users" / user).write_text(pw)

    libs = devinstall.kafka_libs()
    log4j = devinstall.KAFKA_DIR / "log4j2.properties"
    (work / "bin").mkdir()
    for script, main in (("kafka-storage.sh", "kafka.tools.StorageTool"),
                         ("kafka-server-start.sh", "kafka.Kafka")):
        (work / "bin" / script).write_text(
            f'#!/bin/bash\nexec java -Xms128m -Xmx512m -Dlog4j2.configurationFile={log4j} '
            f'-cp "{libs}/*" {main} "$@"\n')
        (work / "bin" / script).chmod(0o755)

    sts = by_kind(docs, "StatefulSet")[KAFKA]["spec"]["template"]["spec"]
    broker = next(c for c in sts["containers"] if c["name"] == "kafka")
    env = {e["name"]: e["value"] for e in broker["env"]}
    assert broker["command"] == ["bash", "/etc/dwell/kafka/start.sh"]
    assert env["KAFKA_PROPERTIES"] == "/etc/dwell/kafka/server.properties"
    env |= {"KAFKA_PROPERTIES": str(work / "server.properties"),
            "KAFKA_BROKER_SECRET_FILE": str(work / "users" / "broker"),
            "KAFKA_HOME": str(work), "KAFKA_WORK_DIR": str(work / "run")}
    proc = Child.spawn("kafka", ["nice", "-n", "10", "bash", str(work / "start.sh")],
                       work / "kafka.log", env)
    bootstrap = f"127.0.0.1:{PORT}"
    try:
        broker_conf = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                       "sasl.mechanism": "PLAIN", "sasl.username": "broker",
                       "sasl.password": passwords["broker"]}
        deadline = time.monotonic() + START_S
        while True:
            assert proc.running(), proc.tail()
            try:
                # Quiet: librdkafka logs each refused connection until the broker listens.
                if AdminClient({**broker_conf, "log_level": 0}).list_topics(
                        timeout=2).brokers:
                    break
            except KafkaException:
                pass
            assert time.monotonic() < deadline, (work / "kafka.log").read_text()[-3000:]
            time.sleep(1)

        # The acls container's command and environment, its paths made local.
        side = next(c for c in sts["containers"] if c["name"] == "acls")
        cmd = list(side["command"])
        assert cmd[:3] == ["python", "-m", "dwell.adapters.kafka.acls"]
        swap = {"--rules": str(work / "kafka-acls.txt"), "--secrets": str(work / "users"),
                "--bootstrap": bootstrap, "--ready-file": str(work / "applied")}
        for flag, value in swap.items():
            cmd[cmd.index(flag) + 1] = value
        side_env = {e["name"]: e["value"] for e in side["env"]}
        assert side_env["DWELL_KAFKA_SASL_PASSWORD"] == "file:/etc/dwell/kafka-users/broker"
        side_env["DWELL_KAFKA_SASL_PASSWORD"] = f"file:{work / 'users' / 'broker'}"
        done = subprocess.run([sys.executable, *cmd[1:], "--once", "--deadline-s", "60"],
                              env=dict(os.environ) | side_env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert (work / "applied").exists()
        print(done.stderr.strip().splitlines()[-1])
        yield {"bootstrap": bootstrap, "passwords": passwords, "broker": broker_conf}
    finally:
        proc.stop(timeout=30)
        shutil.rmtree(work / "data", ignore_errors=True)


def login(kafka: dict[str, Any], user: str, password: str | None = None) -> dict[str, str]:
    return {"bootstrap.servers": kafka["bootstrap"], "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": password or kafka["passwords"][user]}


def test_the_rendered_kafka_refuses_users_what_their_tenant_does_not_need(
        locked_kafka: dict[str, Any]) -> None:
    """On the chart's Kafka as rendered: a user principal of tenant `acme` (made as an
    operator makes one, kafka_acls.grant_user) may not write dwell.policies (make itself a
    tenant's admin) nor read tenant `other`'s ready topic; it may publish on
    dwell.publish. Admission writes a ready topic, the policy service its change feed.
    Refused attempts are printed (`pytest -s`)."""
    admin = AdminClient(locked_kafka["broker"])
    mine = TopicName.parse("persistent://acme/ns/orders").kafka_topic
    theirs = TopicName.parse("persistent://other/ns/secrets").kafka_topic
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (
            mine, theirs, names.POLICIES, names.PUBLISH)]).values():
        f.result(30)
    kafka_acls.grant_user(admin, "app-acme", "acme", "acme-password-0123456789")
    user = login(locked_kafka, "app-acme", "acme-password-0123456789")

    err = refused("app-acme writes dwell.policies",
                  lambda: produce(user, names.POLICIES, b'{"adminRoles":["app-acme"]}',
                                  "tenant:other"))
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    got = consume(user, "acme.ns.orders.s", theirs)
    assert isinstance(got, KafkaError), got
    refused("app-acme reads tenant other's ready topic", lambda: got)
    assert got.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                          KafkaError.GROUP_AUTHORIZATION_FAILED), got
    # librdkafka reports the failed login to error_cb; the call itself sees a transport error.
    seen: list[KafkaError] = []
    wrong = {**login(locked_kafka, "dwell-policy", "not-its-password"), "log_level": 0,
             "error_cb": seen.append}
    client = AdminClient(wrong)
    refused("dwell-policy with a wrong password",
            lambda: admin_error(lambda: client.list_topics(timeout=5)))
    client.poll(1)
    assert KafkaError._AUTHENTICATION in [e.code() for e in seen], seen
    anonymous = {"bootstrap.servers": locked_kafka["bootstrap"], "log_level": 0}
    refused("a client without SASL", lambda: admin_error(
        lambda: AdminClient(anonymous).list_topics(timeout=3)))

    assert produce(user, names.PUBLISH, b"{}", mine) is None
    assert produce(login(locked_kafka, "dwell-admission"), mine, b"ready") is None
    assert produce(login(locked_kafka, "dwell-policy"), names.POLICIES, b"{}",
                   "tenant:acme") is None
    # What the broker holds for dwell's principals is the chart's file.
    held = [r for r in acls.held(admin) if r[0] != "User:app-acme"]
    assert sorted(held) == sorted(acls.parse(kafka_acls.CHART_FILE.read_text()))
