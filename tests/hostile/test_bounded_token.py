"""The token on dwell.publish is checked before the record's value is parsed, against real
Kafka and a real admission with authentication on: an unauthenticated record costs one
token check, whatever it holds (issue 28, finding 2). Its own module: an admission of
another module with authentication off would answer the same records."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import httpx
import orjson
import pytest

from dwell.adapters import kafka
from dwell.auth.tokens import create_secret_key
from dwell.core import topics as names
from dwell_dev.testkit import read_until, wait_for

pytestmark = pytest.mark.integration


def poison(items: int) -> bytes:
    return orjson.dumps({"topic": "persistent://hostile/ns/x", "messages": [1] * items})


def test_the_ingress_checks_the_token_before_it_parses(services: Any,
                                                       kafka_bootstrap: str) -> None:
    secret = create_secret_key()
    env = {"DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_SUPER_USER_ROLES": "root",
           "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode(),
           "DWELL_INGRESS_GROUP": f"dwell-admission-bounds-auth-{uuid.uuid4().hex[:8]}",
           "DWELL_INGRESS_OFFSET_RESET": "latest"}
    admission = services.start("admission", env=env, ready=False)
    try:
        wait_for(lambda: httpx.get(f"{admission.url}/readyz").json().get("ingressAssigned"),
                 45, "the ingress to get partitions")
        results_from = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
        p = kafka.Producer(kafka_bootstrap, linger_ms=0)
        try:
            sent = [p.send(names.PUBLISH, poison(3)).result(15),
                    p.send(names.PUBLISH, b"not json at all").result(15)]
        finally:
            p.close()
        ids = {f"{names.PUBLISH}:{part}:{off}" for part, off in sent}
        got = read_until(kafka_bootstrap, names.PUBLISH_RESULTS, results_from,
                         lambda rs: ids <= {orjson.loads(r.value).get("requestId") for r in rs},
                         timeout=45)
        mine = [res for res in map(lambda r: orjson.loads(r.value), got)
                if res.get("requestId") in ids]
        # Refused for the missing token, not for what the body holds: it was never read.
        assert len(mine) == 2, mine
        assert all(res["errorCode"] == 3 and "dwell-authorization" in res["errorMsg"]
                   for res in mine), mine
    finally:
        admission.stop()
