"""The token on the Kafka path, against real Kafka, Redis and the real policy and
admission services with authentication and authorization on: a dwell.publish request is
published only when the token in its `dwell-authorization` header is a Kafka token
(`POST /admin/v2/kafka-tokens`) whose role may produce on the namespace; any other gets
Pulsar's AuthenticationError (3) or AuthorizationError (4) on dwell.publish.results, and
nothing of it reaches a topic. (Its own module: an admission of another module with
authentication off would answer the same requests.)"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import httpx
import orjson
import pytest

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.auth.tokens import create_kafka_token, create_secret_key, create_token
from dwell.core import topics as names
from dwell_dev.testkit import read_until, wait_for

pytestmark = pytest.mark.integration


def test_the_ingress_checks_the_token_and_produce_before_it_writes(
        services: Any, kafka_bootstrap: str, unique: str) -> None:
    secret = create_secret_key()
    env = {"DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
           "DWELL_SUPER_USER_ROLES": "root",
           "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode()}
    policy = services.start("policy", env=env)
    admission = services.start("admission", env=env | {
        "DWELL_INGRESS_GROUP": f"dwell-admission-auth-{uuid.uuid4().hex[:8]}",
        "DWELL_INGRESS_OFFSET_RESET": "latest"})
    try:
        def token(role: str, **kw: float) -> str:
            return create_token(secret, "HS256", role, **kw)

        def kafka_token(role: str) -> str:
            got = httpx.post(f"{policy.url}/admin/v2/kafka-tokens",
                             headers={"Authorization": f"Bearer {token(role)}"})
            assert got.status_code == 200, got.text
            return str(got.json()["token"])

        root = {"Authorization": f"Bearer {token('root')}"}
        assert httpx.put(f"{policy.url}/admin/v2/tenants/{unique}", json={},
                         headers=root).status_code == 204
        assert httpx.put(f"{policy.url}/admin/v2/namespaces/{unique}/ns",
                         headers=root).status_code == 204
        assert httpx.post(f"{policy.url}/admin/v2/namespaces/{unique}/ns/permissions/writer",
                          json=["produce"], headers=root).status_code == 204
        assert httpx.post(f"{policy.url}/admin/v2/namespaces/{unique}/ns/permissions/reader",
                          json=["consume"], headers=root).status_code == 204
        topic = f"persistent://{unique}/ns/secured"
        writer = {"Authorization": f"Bearer {token('writer')}"}
        wait_for(lambda: httpx.post(f"{admission.url}/topics/persistent/{unique}/ns/secured",
                                    headers=writer, json={"messages": []}).status_code == 200,
                 30, "admission to see the grant")
        wait_for(lambda: httpx.get(f"{admission.url}/readyz").json().get("ingressAssigned"),
                 30, "the ingress to get partitions")

        cases = {  # sequenceId: (header value or None, errorCode expected)
            1: (f"Bearer {kafka_token('writer')}", 0),
            2: (f"Bearer {kafka_token('root')}", 0),
            3: (None, 3),
            4: (f"Bearer {create_kafka_token(secret, 'writer', 60_000, time.time() - 600)[0]}",
                3),
            5: (f"Bearer {create_kafka_token(create_secret_key(), 'root', 60_000)[0]}", 3),
            6: (f"Bearer {kafka_token('reader')}", 4),
            7: (f"Bearer {kafka_token('stranger')}", 4),
            8: (f"Bearer {token('writer')}", 3),  # long-lived: never on Kafka
        }
        producer_name = f"prod-{unique}"
        ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
        p = kafka.Producer(kafka_bootstrap, linger_ms=0)
        for seq, (value, _) in cases.items():
            p.send(names.PUBLISH, orjson.dumps({
                "topic": topic, "producerName": producer_name,
                "messages": [{"payload": f"m{seq}", "sequenceId": seq}]}), topic,
                {hdr.AUTHORIZATION: value} if value else None).result(15)
        p.close()

        def by_seq(recs: list[kafka.Record]) -> dict[int, dict[str, Any]]:
            return {res["sequenceId"]: res for res in (
                orjson.loads(r.value) for r in recs if r.key == producer_name.encode())}

        got = by_seq(read_until(kafka_bootstrap, names.PUBLISH_RESULTS, ends,
                                lambda recs: len(by_seq(recs)) >= len(cases)))
        assert set(got) == set(cases), got
        for seq, (_, code) in cases.items():
            assert got[seq]["errorCode"] == code, (seq, got[seq])
        assert "Authentication required" in got[3]["errorMsg"]
        assert "expired" in got[4]["errorMsg"].lower(), got[4]
        assert "may not produce" in got[6]["errorMsg"], got[6]
        assert "POST /admin/v2/kafka-tokens" in got[8]["errorMsg"], got[8]
        assert all(got[s]["messageId"] == "-1" for s in (3, 4, 5, 6, 7, 8))
        # Only the allowed messages are on the ready topic.
        ready = kafka.read_all(kafka_bootstrap, f"{unique}.ns.secured")
        assert sorted(r.value for r in ready) == [b"m1", b"m2"]
    finally:
        admission.stop()
        policy.stop()
