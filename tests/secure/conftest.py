"""The secured stack for tests/secure, started once for the package: Kafka with only
SASL_SSL listeners, the StandardAuthorizer and one principal per dwell component
(dwell_dev.kafka_acls), Redis on a TLS port with an ACL user (default user off), and
policy, admission, tracker and the Spark app serving HTTPS, all with certificates and
passwords made at start (devstack `--secure`, profile `secure`).

While the package runs, this process has the stack's DWELL_* client settings in its
environment, so the SDK and dwell's adapters connect as any user of the stack would: as
the example user `app-demo` unless a test logs in as a user of its own tenant
(`tenant_user`)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from dwell_dev import devstack, kafka_acls, secure_stack


@pytest.fixture(scope="package")
def secured() -> Iterator[devstack.Stack]:
    s = devstack.Stack("secure")
    secure_stack.prepare(s, True)
    started = [n for n in s.available() if not s.pid(n)]
    s.up()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s.service_env().items():
            mp.setenv(k, v)
        yield s
    if os.environ.get("DWELL_TEST_KEEP_SERVERS") != "1":
        s.down(list(reversed(started)))


def broker_admin(s: devstack.Stack) -> AdminClient:
    """An admin client logged in as the broker's super-user (what an operator grants with)."""
    return AdminClient(secure_stack.broker_librdkafka_config(s.pki, s.kafka_bootstrap))


def tenant_user(s: devstack.Stack, principal: str, tenant: str) -> dict[str, str]:
    """A SCRAM user of ``tenant`` made on the stack with its ACLs (kafka_acls.user_rules);
    the DWELL_KAFKA_* settings it logs in with."""
    kafka_acls.grant_user(broker_admin(s), principal, tenant,
                          secure_stack.kafka_password(s.pki, principal))
    return secure_stack.kafka_user_env(s.pki, principal)
