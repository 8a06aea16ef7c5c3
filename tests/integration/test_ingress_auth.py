"""The token on the Kafka path, against real Kafka, Redis and the real policy and
admission services with authentication and authorization on: a dwell.publish request is
published only when the token in its `dwell-authorization` header is a Kafka token
(`POST /admin/v2/kafka-tokens`) whose role may produce on the namespace; any other gets
Pulsar's AuthenticationError (3) or AuthorizationError (4) on dwell.publish.results, and
nothing of it reaches a topic. A cancel request is checked the same way and handed to the
tracker with a delegated token of the sender's role, which opens nothing else. (Its own
module: an admission of another module with authentication off would answer the same
requests.)"""

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
from dwell.auth.tokens import (
    create_delegated_token,
    create_kafka_token,
    create_secret_key,
    create_token,
)
from dwell.core import topics as names
from dwell.tracker import recovery
from dwell_dev.testkit import read_results, read_until, wait_for

pytestmark = pytest.mark.integration


def test_the_ingress_checks_the_token_and_produce_before_it_writes(
        services: Any, kafka_bootstrap: str, unique: str) -> None:
    secret = create_secret_key()
    env = {"DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
           "DWELL_SUPER_USER_ROLES": "root",
           "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode()}
    policy = services.start("policy", env=env)
    tracker_group = f"dwell-tracker-{uuid.uuid4().hex[:8]}"
    # dwell.delayed is shared with every other test: this group starts at its end.
    recovery.start_group_at_end(kafka_bootstrap, tracker_group, [names.DELAYED, names.REFILED])
    tracker = services.start("tracker", env=env | {"DWELL_TRACKER_GROUP_ID": tracker_group,
                                                   "DWELL_RESTAGE_ENABLED": "false"})
    admission = services.start("admission", env=env | {
        "DWELL_TRACKER_URL": tracker.url,
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

        # Cancels on dwell.publish, each sender's own: the writer's is done in its name,
        # the reader's and an anonymous one are refused before the tracker is asked.
        published = httpx.post(f"{admission.url}/topics/persistent/{unique}/ns/secured",
                               headers=writer, json={"messages": [
                                   {"payload": "later", "deliverAfterMs": 600_000}]})
        later = published.json()["messagePublishResults"][0]["messageId"]
        canceller = f"cancel-{unique}"
        ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
        p = kafka.Producer(kafka_bootstrap, linger_ms=0)
        cancels = {}  # requestId -> the sender's role
        for role, value in (("reader", f"Bearer {kafka_token('reader')}"), ("anonymous", None),
                            ("writer", f"Bearer {kafka_token('writer')}")):
            part, off = p.send(names.PUBLISH, orjson.dumps({
                "topic": topic, "producerName": canceller, "cancel": [later]}), topic,
                {hdr.AUTHORIZATION: value} if value else None).result(15)
            cancels[f"{names.PUBLISH}:{part}:{off}"] = role
        p.close()
        answers = {cancels[res["requestId"]]: res
                   for res in read_results(kafka_bootstrap, ends, canceller, 3)}
        assert answers["writer"] | {"reason": ""} == {
            "messageId": later, "errorCode": 0, "result": "cancelled", "delivered": False,
            "reason": "", "topic": topic, "requestId": answers["writer"]["requestId"],
            "index": 0, "sequenceId": None}
        assert (answers["reader"]["errorCode"], answers["anonymous"]["errorCode"]) == (4, 3)
        # The delegated token opens the tracker's cancel route for its role only, and
        # nothing else; a Kafka token opens no HTTP route.
        cancel_path = f"/v1/topics/persistent/{unique}/ns/secured/messages/{later}"

        def bearer(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        delegated = create_delegated_token(secret, "writer")
        assert httpx.delete(tracker.url + cancel_path,
                            headers=bearer(delegated)).json()["result"] == "cancelled"
        assert httpx.delete(tracker.url + cancel_path, headers=bearer(
            create_delegated_token(secret, "reader"))).status_code == 403
        for url, token in ((tracker.url + cancel_path, kafka_token("writer")),
                           (f"{admission.url}/topics/persistent/{unique}/ns/secured/"
                            f"messages/{later}", delegated),
                           (f"{policy.url}/admin/v2/tenants/{unique}", delegated)):
            refused = httpx.request("DELETE" if "messages" in url else "GET", url,
                                    headers=bearer(token))
            assert refused.status_code == 401, (url, refused.text)
    finally:
        admission.stop()
        tracker.stop()
        policy.stop()
