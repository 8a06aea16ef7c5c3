"""The SDK's Producer: publishes through the admission service's Pulsar REST endpoint and
turns each publish result (Pulsar's `ProducerAck`) into a message id or a typed error."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import httpx

from dwell import endpoints
from dwell.core.topics import TopicName
from dwell.security import http_verify

# Pulsar's ServerError.NotAllowedError: the publish checks (max delay, ...) refused it.
NOT_ALLOWED = 2


class PublishError(Exception):
    """A publish that failed: the admission service refused or could not be reached."""

    def __init__(self, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code


class NotAllowedError(PublishError):
    """errorCode 2: the message broke a publish rule; ``str(exc)`` is the result's
    errorMsg, Pulsar's text (``org.apache.pulsar.broker.service.BrokerServiceException$
    NotAllowedException: Exceeds max allowed delivery delay of 5000 milliseconds``)."""


def _millis(value: datetime | int) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


class Producer:
    """Publishes to one topic.

    ``Producer("persistent://t/ns/x").send(b"hi", deliver_after=5000)`` returns the id.
    """

    def __init__(self, topic: str, *, producer_name: str | None = None,
                 admission_url: str | None = None, timeout_s: float = 15.0,
                 transport: httpx.BaseTransport | None = None,
                 token: str | None = None) -> None:
        self.topic = TopicName.parse(topic)
        self.producer_name = producer_name or f"dwell-sdk-{os.getpid()}"
        base = endpoints.admission_url(admission_url)
        t = self.topic
        self._path = f"/topics/{t.domain}/{t.tenant}/{t.namespace}/{t.local}"
        # `token`: the JWT sent as `Authorization: Bearer` when authentication is on.
        self._http = httpx.Client(base_url=base.rstrip("/"), timeout=timeout_s,
                                  transport=transport, verify=http_verify(),
                                  headers={"Authorization": f"Bearer {token}"} if token else None)
        self._sequence = 0

    def send(self, payload: bytes | str, *, key: str | None = None,
             properties: Mapping[str, str] | None = None,
             deliver_at: datetime | int | None = None,
             deliver_after: timedelta | int | None = None,
             event_time: datetime | int | None = None) -> str:
        """Publish one message and return its message id.

        ``deliver_at`` is an absolute time (datetime or ms since epoch); ``deliver_after``
        a delay (timedelta or ms). Raises NotAllowedError for errorCode 2, PublishError
        for any other failure.
        """
        if deliver_at is not None and deliver_after is not None:
            raise ValueError("give deliver_at or deliver_after, not both")
        msg: dict[str, Any] = {"sequenceId": self._sequence}
        if isinstance(payload, bytes):
            msg["payload"] = base64.b64encode(payload).decode()
            msg["payloadEncoding"] = "base64"
        else:
            msg["payload"] = payload
        if key is not None:
            msg["key"] = key
        if properties:
            msg["properties"] = dict(properties)
        if deliver_at is not None:
            msg["deliverAt"] = _millis(deliver_at)
        if deliver_after is not None:
            msg["deliverAfterMs"] = (int(deliver_after.total_seconds() * 1000)
                                     if isinstance(deliver_after, timedelta)
                                     else int(deliver_after))
        if event_time is not None:
            msg["eventTime"] = _millis(event_time)
        self._sequence += 1
        body = {"producerName": self.producer_name, "messages": [msg]}
        try:
            resp = self._http.post(self._path, json=body)
        except httpx.HTTPError as exc:
            raise PublishError(f"admission unreachable: {exc}") from exc
        if resp.status_code != 200:
            try:
                reason = resp.json().get("reason", resp.text)
            except ValueError:
                reason = resp.text
            raise PublishError(f"HTTP {resp.status_code}: {reason}")
        result = resp.json()["messagePublishResults"][0]
        code = result.get("errorCode", 0)
        if code == 0:
            return str(result["messageId"])
        text = str(result.get("errorMsg", ""))
        if code == NOT_ALLOWED:
            raise NotAllowedError(text, code)
        raise PublishError(text, code)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
