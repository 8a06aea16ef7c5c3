"""The SDK's producers: publish through the admission service's Pulsar REST endpoint and
turn each publish result (Pulsar's `ProducerAck`) into a message id or a typed error.
`Producer` blocks; `AsyncProducer` is its asyncio twin, for an event loop (a FastAPI
handler, say) that must not wait on a publish."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import Enum
from typing import Any
from urllib.parse import quote

import httpx

from dwell import endpoints
from dwell.core.positions import CANCEL_STATUS, CANCELLED, NOT_FOUND, TOO_LATE
from dwell.core.topics import TopicName
from dwell.security import http_verify

# Pulsar's ServerError.NotAllowedError: the publish checks (max delay, ...) refused it.
NOT_ALLOWED = 2


class PublishError(Exception):
    """A publish that failed: the admission service refused or could not be reached.

    ``error_code`` is the publish result's errorCode when admission refused the message,
    None when the request failed as a whole; ``str(exc)`` is then ``HTTP <status>:
    <reason>`` or ``admission unreachable: <cause>``. ``retryable`` says whether the
    same send may succeed later: admission unreachable, busy (429) or without Kafka
    (503, or another 5xx), not a refusal of the request or the message."""

    def __init__(self, message: str, error_code: int | None = None,
                 retryable: bool = False) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.retryable = retryable


class ProducerQueueIsFullError(PublishError):
    """Pulsar's ProducerQueueIsFullError: an AsyncProducer already had
    ``max_pending_messages`` sends waiting for admission's answer, so this one was refused
    at once, before it took a sequence id or reached admission. ``retryable`` is true:
    the same send may go through once earlier ones are answered."""

    def __init__(self, max_pending_messages: int) -> None:
        super().__init__(f"Producer send queue is full: {max_pending_messages} sends pending "
                         "(max_pending_messages)", retryable=True)


class NotAllowedError(PublishError):
    """errorCode 2: the message broke a publish rule; ``str(exc)`` is the result's
    errorMsg, Pulsar's text (``org.apache.pulsar.broker.service.BrokerServiceException$
    NotAllowedException: Exceeds max allowed delivery delay of 5000 milliseconds``)."""


def _millis(value: datetime | int) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def _publish_path(topic: TopicName) -> str:
    """The topic's path under admission's Pulsar REST producer API."""
    return f"/topics/{topic.domain}/{topic.tenant}/{topic.namespace}/{topic.local}"


def _auth_headers(token: str | None) -> dict[str, str] | None:
    """`token`: the JWT sent as `Authorization: Bearer` when authentication is on."""
    return {"Authorization": f"Bearer {token}"} if token else None


def _request_body(producer_name: str, sequence_id: int, payload: bytes | str, *,
                  key: str | None = None, properties: Mapping[str, str] | None = None,
                  deliver_at: datetime | int | None = None,
                  deliver_after: timedelta | int | None = None,
                  event_time: datetime | int | None = None,
                  schedule_key: str | None = None) -> dict[str, Any]:
    """A publish request of one message, in Pulsar's REST fields; refuses both delays
    (ValueError) before anything is sent."""
    if deliver_at is not None and deliver_after is not None:
        raise ValueError("give deliver_at or deliver_after, not both")
    msg: dict[str, Any] = {"sequenceId": sequence_id}
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
    if schedule_key is not None:
        msg["scheduleKey"] = schedule_key
    return {"producerName": producer_name, "messages": [msg]}


# Answers to a request as a whole that a later try may not get: busy, or admission
# (or the Kafka behind it) not answering.
_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

def _message_id(resp: httpx.Response) -> str:
    """The id of the one message published by the request ``resp`` answers; PublishError
    for an HTTP error, NotAllowedError for errorCode 2, PublishError for another code."""
    if resp.status_code != 200:
        try:
            reason = resp.json().get("reason", resp.text)
        except ValueError:
            reason = resp.text
        raise PublishError(f"HTTP {resp.status_code}: {reason}",
                           retryable=resp.status_code in _RETRYABLE_STATUS)
    result = resp.json()["messagePublishResults"][0]
    code = result.get("errorCode", 0)
    if code == 0:
        return str(result["messageId"])
    text = str(result.get("errorMsg", ""))
    if code == NOT_ALLOWED:
        raise NotAllowedError(text, code)
    raise PublishError(text, code)


def cancel_path(topic: TopicName, message_id: str) -> str:
    return (f"/topics/{topic.domain}/{quote(topic.tenant, safe='')}/"
            f"{quote(topic.namespace, safe='')}/{quote(topic.local, safe='')}/messages/"
            f"{quote(message_id, safe=':')}")


class CancelResult(str, Enum):
    """What ``Producer.cancel`` answers; each compares equal to its value, a ``str``."""

    CANCELLED = CANCELLED
    """It will never be delivered, to any subscription; cancelling again answers the
    same."""
    NOT_FOUND = NOT_FOUND
    """No pending message of the topic has this id: it never existed, or it was
    delivered already."""
    TOO_LATE = TOO_LATE
    """It is due (within about two seconds) or being delivered now: it may still
    arrive."""


def cancel_result(resp: httpx.Response) -> CancelResult:
    """The answer to a cancel; PublishError when it could not be decided (retryable when
    busy: 503)."""
    try:
        body = resp.json()
    except ValueError:
        body = {}
    result = body.get("result") if isinstance(body, dict) else None
    if result in (CANCELLED, NOT_FOUND, TOO_LATE) and resp.status_code == CANCEL_STATUS[result]:
        return CancelResult(result)
    reason = body.get("reason", resp.text) if isinstance(body, dict) else resp.text
    raise PublishError(f"HTTP {resp.status_code}: {reason}",
                       retryable=resp.status_code in _RETRYABLE_STATUS)


def _unreachable(exc: httpx.HTTPError) -> PublishError:
    # A timeout's text can be empty: its kind says what happened.
    return PublishError(f"admission unreachable: {str(exc) or type(exc).__name__}",
                        retryable=True)


class _Publisher:
    """What both producers share: the topic, the producer name, admission's address and
    the sequence ids (taken under a lock: a Producer may be shared by threads, as a
    Pulsar producer may)."""

    def __init__(self, topic: str, producer_name: str | None, admission_url: str | None,
                 token: str | None) -> None:
        self.topic = TopicName.parse(topic)
        self.producer_name = producer_name or f"dwell-sdk-{os.getpid()}"
        self._base = endpoints.admission_url(admission_url).rstrip("/")
        self._path = _publish_path(self.topic)
        self._headers = _auth_headers(token)
        self._sequence = 0
        self._sequence_lock = threading.Lock()

    def _next_body(self, payload: bytes | str, **fields: Any) -> dict[str, Any]:
        """The request of the next message; its sequence id is taken before any wait, so
        concurrent sends get distinct ids that increase in the order they were made."""
        with self._sequence_lock:
            body = _request_body(self.producer_name, self._sequence, payload, **fields)
            self._sequence += 1
        return body


# HTTP connections to admission per producer: httpx's default pool size.
MAX_CONNECTIONS = 100

# AsyncProducer's max_pending_messages unless given (its docstring says why this one).
MAX_PENDING_MESSAGES = 1000


def _timeout(timeout_s: float) -> httpx.Timeout:
    """Each request's connect, write and read within ``timeout_s``; no limit on waiting for
    a pooled connection, which only the requests before it hold (each of them bounded):
    a burst of sends larger than the pool queues instead of failing."""
    return httpx.Timeout(timeout_s, pool=None)


def _client_options(base_url: str, timeout_s: float,
                    headers: dict[str, str] | None) -> dict[str, Any]:
    """The keyword arguments of both producers' httpx clients, all but the transport (a
    sync one for Producer, an async one for AsyncProducer)."""
    return {"base_url": base_url, "timeout": _timeout(timeout_s), "verify": http_verify(),
            "headers": headers}


class Producer(_Publisher):
    """Publishes to one topic.

    ``Producer("persistent://t/ns/x").send(b"hi", deliver_after=5000)`` returns the id.

    ``topic`` is a Pulsar topic name (``persistent://tenant/namespace/topic``); a name dwell
    cannot accept raises ``InvalidTopicName`` (a ValueError). ``producer_name`` is sent
    with each message (default ``dwell-sdk-<pid>``). ``admission_url`` is the admission
    service's address, else DWELL_ADMISSION_URL, else ``http://127.0.0.1:8082``.
    ``timeout_s`` bounds each request once it has a connection (of httpx's 100; a send
    beyond them waits for one, as long as the sends before it take). ``token`` is the
    JWT sent as ``Authorization: Bearer`` when authentication is on. ``transport`` replaces httpx's
    network transport (an ``httpx.MockTransport`` in tests). One producer may be shared
    by threads.
    """

    def __init__(self, topic: str, *, producer_name: str | None = None,
                 admission_url: str | None = None, timeout_s: float = 15.0,
                 transport: httpx.BaseTransport | None = None,
                 token: str | None = None) -> None:
        super().__init__(topic, producer_name, admission_url, token)
        self._http = httpx.Client(transport=transport,
                                  **_client_options(self._base, timeout_s, self._headers))

    def send(self, payload: bytes | str, *, key: str | None = None,
             properties: Mapping[str, str] | None = None,
             deliver_at: datetime | int | None = None,
             deliver_after: timedelta | int | None = None,
             event_time: datetime | int | None = None,
             schedule_key: str | None = None) -> str:
        """Publish one message and return its message id.

        ``payload`` is bytes, or a str sent as text. ``key`` is the message's key and
        ``properties`` its Pulsar properties (record headers to a Kafka reader).
        ``deliver_at`` is an absolute time (datetime or ms since epoch; a naive datetime
        is local time); ``deliver_after`` a delay (timedelta or ms); giving both raises
        ValueError before anything is sent. ``event_time`` (datetime or ms since epoch)
        is the application's own time, kept in the ``dwell-event-time`` header.
        ``schedule_key`` (1 to 256 bytes of UTF-8) replaces the topic's pending message
        with the same key: that one is cancelled and this one is scheduled, or delivered
        at once without a delay. Raises NotAllowedError for errorCode 2, PublishError for
        any other failure.
        """
        body = self._next_body(payload, key=key, properties=properties, deliver_at=deliver_at,
                               deliver_after=deliver_after, event_time=event_time,
                               schedule_key=schedule_key)
        try:
            resp = self._http.post(self._path, json=body)
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from exc
        return _message_id(resp)

    def cancel(self, message_id: str) -> CancelResult:
        """Cancel a pending delayed message of this topic by the id ``send`` returned.

        Returns ``CancelResult.CANCELLED`` (``"cancelled"``: it will never be delivered, to
        any subscription; a repeated cancel answers the same), ``NOT_FOUND``
        (``"not_found"``: no pending message of this topic has the id; it never existed,
        or was delivered already, or sent without a delay) or ``TOO_LATE``
        (``"too_late"``: due, and being delivered). Raises PublishError when it could not
        be decided: ``retryable`` when trying again may (busy, admission or the tracker
        unreachable)."""
        try:
            resp = self._http.delete(cancel_path(self.topic, message_id))
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from exc
        return cancel_result(resp)

    def close(self) -> None:
        """Close the producer's HTTP connections."""
        self._http.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncProducer(_Publisher):
    """Publishes to one topic from an event loop, with Producer's arguments, results and
    errors; many ``send`` calls may be in flight at once (MAX_CONNECTIONS requests at a
    time, the rest waiting their turn, unbounded by ``timeout_s``).

    ``await AsyncProducer("persistent://t/ns/x").send(b"hi", deliver_after=5000)``
    returns the id. ``transport`` is an ``httpx.AsyncBaseTransport``.

    ``max_pending_messages`` is Pulsar's maxPendingMessages: the sends waiting for
    admission's answer, in flight or waiting for a connection, at most. A send beyond
    them fails at once with ``ProducerQueueIsFullError``, as a Pulsar producer's does
    with blockIfQueueFull off (its default). 0 is no limit, Pulsar's default since it
    bounds its client's memory in bytes instead; dwell's default is 1000 (Pulsar's own
    default before that), so that a burst larger than admission can take is refused
    instead of holding every payload in memory.
    """

    def __init__(self, topic: str, *, producer_name: str | None = None,
                 admission_url: str | None = None, timeout_s: float = 15.0,
                 transport: httpx.AsyncBaseTransport | None = None,
                 token: str | None = None,
                 max_pending_messages: int = MAX_PENDING_MESSAGES) -> None:
        if max_pending_messages < 0:
            raise ValueError("max_pending_messages must be 0 (no limit) or more, "
                             f"not {max_pending_messages}")
        super().__init__(topic, producer_name, admission_url, token)
        self._max_pending = max_pending_messages
        self._pending = 0
        self._http = httpx.AsyncClient(transport=transport,
                                       **_client_options(self._base, timeout_s, self._headers))
        # Sends beyond the pool's connections wait here, in the order they were made:
        # httpx's own queue costs time in proportion to its length on every answer. Made
        # by the first send, in the loop that runs it.
        self._slots: asyncio.Semaphore | None = None

    async def send(self, payload: bytes | str, *, key: str | None = None,
                   properties: Mapping[str, str] | None = None,
                   deliver_at: datetime | int | None = None,
                   deliver_after: timedelta | int | None = None,
                   event_time: datetime | int | None = None,
                   schedule_key: str | None = None) -> str:
        """Publish one message and return its message id (as ``Producer.send``); raises
        ProducerQueueIsFullError at once when ``max_pending_messages`` sends are pending."""
        if self._max_pending and self._pending >= self._max_pending:
            raise ProducerQueueIsFullError(self._max_pending)
        body = self._next_body(payload, key=key, properties=properties, deliver_at=deliver_at,
                               deliver_after=deliver_after, event_time=event_time,
                               schedule_key=schedule_key)
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._pending += 1
        try:
            async with self._slots:
                try:
                    resp = await self._http.post(self._path, json=body)
                except httpx.HTTPError as exc:
                    raise _unreachable(exc) from exc
        finally:
            self._pending -= 1
        return _message_id(resp)

    async def cancel(self, message_id: str) -> CancelResult:
        """Cancel a pending delayed message of this topic (as ``Producer.cancel``)."""
        try:
            resp = await self._http.delete(cancel_path(self.topic, message_id))
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from exc
        return cancel_result(resp)

    async def close(self) -> None:
        """Close the producer's HTTP connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
