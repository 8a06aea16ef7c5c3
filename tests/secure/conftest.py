"""The secured stack for tests/secure, started once for the package: Kafka with only a
SASL_SSL listener (SCRAM-SHA-512), Redis on a TLS port with an ACL user (default user
off), and policy, admission, tracker and the Spark app serving HTTPS, all with
certificates and passwords made at start (devstack `--secure`, profile `secure`).

While the package runs, this process has the stack's DWELL_* client settings in its
environment, so the SDK and dwell's adapters connect as any user of the stack would."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import devstack
import secure_stack


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
