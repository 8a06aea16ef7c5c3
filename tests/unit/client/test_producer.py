"""The SDK Producer's request shape and how it maps publish results to ids and errors
(the admission service is replaced by an httpx transport that answers like it)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from dwell.client import NotAllowedError, Producer, PublishError

TOPIC = "persistent://acme/orders/new"


def producer(answer: Any, status: int = 200) -> tuple[Producer, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def handle(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/topics/persistent/acme/orders/new"
        seen.append(json.loads(req.content))
        return httpx.Response(status, json=answer)

    return Producer(TOPIC, producer_name="p1", admission_url="http://adm",
                    transport=httpx.MockTransport(handle)), seen


def ok(message_id: str = "dwell.delayed:1:7") -> dict[str, Any]:
    return {"messagePublishResults": [{"errorCode": 0, "schemaVersion": 0, "deliverAt": None,
                                       "delayed": False, "messageId": message_id}],
            "schemaVersion": 0}


def failed(code: int, text: str) -> dict[str, Any]:
    """Pulsar's ProducerAck for a message not published, in Pulsar's ProducerAcks."""
    return {"messagePublishResults": [{"messageId": "-1", "errorCode": code,
                                       "errorMsg": text, "schemaVersion": 0}],
            "schemaVersion": 0}


def test_returns_the_message_id_and_sends_pulsar_fields() -> None:
    p, seen = producer(ok())
    assert p.send(b"\x00hi", key="k", properties={"a": "1"},
                  deliver_after=timedelta(seconds=5)) == "dwell.delayed:1:7"
    body = seen[0]
    assert body["producerName"] == "p1"
    msg = body["messages"][0]
    assert base64.b64decode(msg["payload"]) == b"\x00hi"
    assert msg["payloadEncoding"] == "base64"
    assert (msg["key"], msg["properties"], msg["deliverAfterMs"]) == ("k", {"a": "1"}, 5000)
    assert "deliverAt" not in msg


def test_deliver_at_accepts_datetime_and_millis_and_text_stays_text() -> None:
    p, seen = producer(ok())
    when = datetime(2030, 1, 1, tzinfo=UTC)
    p.send("plain", deliver_at=when)
    p.send("plain", deliver_at=1_900_000_000_000)
    assert seen[0]["messages"][0]["deliverAt"] == int(when.timestamp() * 1000)
    assert seen[1]["messages"][0]["deliverAt"] == 1_900_000_000_000
    assert seen[0]["messages"][0]["payload"] == "plain"
    assert "payloadEncoding" not in seen[0]["messages"][0]
    # Sequence ids count up per producer, as Pulsar's do.
    assert [b["messages"][0]["sequenceId"] for b in seen] == [0, 1]


def test_both_delays_refused_before_sending() -> None:
    p, seen = producer(ok())
    with pytest.raises(ValueError, match="not both"):
        p.send(b"x", deliver_at=1, deliver_after=1)
    assert seen == []


def test_error_code_2_is_not_allowed_with_server_text() -> None:
    text = ("org.apache.pulsar.broker.service.BrokerServiceException$NotAllowedException: "
            "Exceeds max allowed delivery delay of 5000 milliseconds")
    p, _ = producer(failed(2, text))
    with pytest.raises(NotAllowedError) as exc:
        p.send(b"x", deliver_after=60000)
    assert str(exc.value) == text and exc.value.error_code == 2


def test_other_error_codes_and_http_errors_are_publish_errors() -> None:
    p, _ = producer(failed(1, "boom"))
    with pytest.raises(PublishError) as exc:
        p.send(b"x")
    assert not isinstance(exc.value, NotAllowedError) and exc.value.error_code == 1
    assert str(exc.value) == "boom"
    p, _ = producer({"reason": "Namespace acme/orders does not exist"}, status=404)
    with pytest.raises(PublishError, match="404: Namespace acme/orders does not exist"):
        p.send(b"x")


def test_bad_topic_name_is_refused() -> None:
    with pytest.raises(ValueError, match="persistent://"):
        Producer("orders")
