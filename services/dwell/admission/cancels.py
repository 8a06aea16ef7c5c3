"""Cancels through admission: `DELETE /topics/.../messages/{messageId}` over HTTP, and a
cancel request on `dwell.publish`. Both hand the cancel to the tracker, which holds the
index and decides (dwell.tracker.cancel).

A cancel request on `dwell.publish` is a record whose value is
`{"topic", "producerName", "cancel": ["<messageId>", ...]}` (at most
`max_messages_per_request` ids; `topic` may be left to the record's key, as for a
publish). It is authenticated and authorized as a publish is (`produce` on the
namespace), and gets one result per id on `dwell.publish.results`, in the request's
order: `{"messageId", "errorCode": 0, "result", "delivered", "reason", "topic",
"requestId", "index", "sequenceId": null}`, `result` being the tracker's answer
(`cancelled`, `not_found`, `too_late`), or, when there is none, `errorCode` 2 (an id
that is not one) or 1 (retriable: the tracker was busy, unreachable, or not answering
in time) with `errorMsg`. A request with both `messages` and `cancel` is refused whole.

The ingress asks the tracker in the name of the role the request's Kafka token
authenticated, with a delegated token (dwell.auth.tokens) it signs for that role. A
batch re-read after an aborted transaction asks again: the tracker answers a cancelled
message `cancelled` every time."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final
from urllib.parse import quote

import httpx
import msgspec

from dwell.auth.tokens import DELEGATED_TOKEN_TTL_S, create_delegated_token
from dwell.core.positions import MAX_MESSAGE_ID_CHARS, parse_message_id
from dwell.core.topics import TopicName
from dwell.security import http_verify

from .plan import AUTHENTICATION_ERROR, AUTHORIZATION_ERROR, INVALID_MESSAGE
from .schema import PublishError
from .settings import AdmissionSettings

log = logging.getLogger("dwell.admission.cancels")

# Pulsar's REST producer's ProducerAck errorCode for a retriable failure (2,
# INVALID_MESSAGE, is the non-retriable one).
RETRIABLE: Final = 1
# Requests to the tracker at once, per ingress.
WORKERS: Final = 16
# What a chunk of ids sent to the tracker in one request holds at most, in characters
# (its body limit is 64 KiB by default).
CHUNK_CHARS: Final = 48_000
# The bytes a cancel request's value must hold; read first, so that a publish pays one
# byte search.
_MARK: Final = b'"cancel"'


def _topic_path(name: TopicName) -> str:
    return (f"/v1/topics/{name.domain}/{quote(name.tenant, safe='')}/"
            f"{quote(name.namespace, safe='')}/{quote(name.local, safe='')}")


def cancel_path(name: TopicName, message_id: str) -> str:
    """The tracker's route that cancels ``message_id`` of ``name``."""
    return f"{_topic_path(name)}/messages/{quote(message_id, safe=':')}"


def cancellations_path(name: TopicName) -> str:
    """The tracker's route that cancels several messages of ``name``."""
    return f"{_topic_path(name)}/cancellations"


class CancelRequest(msgspec.Struct):
    """A cancel request on `dwell.publish`, its fields typed by `cancel_request`."""

    topic: Any = None
    producerName: Any = None
    cancel: Any = None
    messages: msgspec.Raw = msgspec.Raw(b"null")


_DECODER: Final = msgspec.json.Decoder(CancelRequest)


def cancel_request(value: bytes, max_ids: int) -> CancelRequest | None:
    """The cancel request ``value`` holds; None when it is not one (a publish request, or
    what the publish path refuses in its own words); PublishError 400 for a cancel request
    that does not fit."""
    if _MARK not in value:
        return None
    try:
        req = _DECODER.decode(value)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if req.cancel is None:
        return None
    if bytes(req.messages) != b"null":
        raise PublishError(400, "a request either publishes (messages) or cancels "
                                "(cancel), not both")
    if not isinstance(req.cancel, list) or not all(isinstance(i, str) for i in req.cancel):
        raise PublishError(400, "cancel: must be a list of messageIds (strings)")
    if len(req.cancel) > max_ids:
        raise PublishError(400, f"cancel: {len(req.cancel)} messageIds; the limit per "
                                f"request is {max_ids}")
    for name in ("topic", "producerName"):
        if getattr(req, name) is not None and not isinstance(getattr(req, name), str):
            raise PublishError(400, f"{name}: must be a string")
    return req


def _failed(message_id: str, error_code: int, reason: str) -> dict[str, Any]:
    return {"messageId": message_id, "errorCode": error_code, "errorMsg": reason}


class TrackerCancels:
    """Hands the cancels of `dwell.publish` requests to the tracker: a request's ids in
    one call to its `POST .../cancellations` (in chunks that fit its body limit), WORKERS
    calls at once. ``key``: the Kafka token key delegated tokens are signed with (None
    with authentication off)."""

    def __init__(self, settings: AdmissionSettings, key: bytes | None) -> None:
        # The batch's transaction must commit within its timeout: a cancel not answered
        # by then is answered retriable (the tracker itself waits up to its
        # DWELL_CANCEL_WAIT_MS for a message it has not indexed yet).
        self.timeout_s = settings.ingress_transaction_timeout_ms * 0.6 / 1000
        self._http = httpx.Client(base_url=settings.tracker_url.rstrip("/"),
                                  timeout=self.timeout_s, verify=http_verify(settings))
        self._key = key
        self._tokens: dict[str, tuple[str, float]] = {}  # role -> (token, renew after)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, topic: TopicName, message_ids: list[str],
               role: str | None) -> list[Future[list[dict[str, Any]]]]:
        """Futures of the results of ``message_ids``, chunk by chunk (without the fields
        of where they belong)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="ingress-cancel")
        headers = ({"Authorization": f"Bearer {self._token(role)}"}
                   if self._key is not None and role is not None else None)
        return [self._pool.submit(self._ask, topic, chunk, headers)
                for chunk in _chunks(message_ids)]

    def results(self, futures: list[Future[list[dict[str, Any]]]], message_ids: list[str],
                deadline: float) -> list[dict[str, Any]]:
        """The results of ``message_ids`` (one each, in order) from the futures `submit`
        gave, waiting until ``deadline`` (monotonic) at most."""
        out: list[dict[str, Any]] = []
        for f, chunk in zip(futures, _chunks(message_ids), strict=True):
            try:
                out += f.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                f.cancel()
                out += [_failed(m, RETRIABLE, "the tracker did not answer in time; send "
                                              "the cancel again") for m in chunk]
            except Exception as exc:
                # A failure no check foresaw must not stop the ingress.
                log.exception("asking the tracker to cancel failed")
                out += [_failed(m, RETRIABLE, f"{type(exc).__name__} while asking the "
                                              "tracker") for m in chunk]
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def _token(self, role: str) -> str:
        now = time.time()
        with self._lock:
            hit = self._tokens.get(role)
            if hit is None or now >= hit[1]:
                if len(self._tokens) >= 10_000:
                    self._tokens.clear()
                assert self._key is not None
                hit = (create_delegated_token(self._key, role, now),
                       now + DELEGATED_TOKEN_TTL_S / 2)
                self._tokens[role] = hit
            return hit[0]

    def _ask(self, topic: TopicName, message_ids: list[str],
             headers: dict[str, str] | None) -> list[dict[str, Any]]:
        """The results of one chunk: ids that cannot be ones answered here, the others by
        the tracker."""
        out: dict[int, dict[str, Any]] = {}
        asked: list[int] = []
        for i, message_id in enumerate(message_ids):
            try:
                if len(message_id) > MAX_MESSAGE_ID_CHARS:
                    raise ValueError(f"{len(message_id)} characters; a message id has at "
                                     f"most {MAX_MESSAGE_ID_CHARS}")
                parse_message_id(message_id)
                asked.append(i)
            except ValueError as exc:
                out[i] = _failed(message_id, INVALID_MESSAGE, f"messageId: {exc}")
        if asked:
            answers = self._post(topic, [message_ids[i] for i in asked], headers)
            for i, res in zip(asked, answers, strict=True):
                out[i] = res
        return [out[i] for i in range(len(message_ids))]

    def _post(self, topic: TopicName, message_ids: list[str],
              headers: dict[str, str] | None) -> list[dict[str, Any]]:
        def every(code: int, reason: str) -> list[dict[str, Any]]:
            return [_failed(m, code, reason) for m in message_ids]

        try:
            resp = self._http.post(cancellations_path(topic), headers=headers,
                                   json={"messageIds": message_ids})
        except httpx.HTTPError as exc:
            return every(RETRIABLE, f"tracker unreachable: {str(exc) or type(exc).__name__}")
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200:
            reason = (str(body.get("reason")) if isinstance(body, dict) and body.get("reason")
                      else f"tracker answered HTTP {resp.status_code}")
            code = {401: AUTHENTICATION_ERROR, 403: AUTHORIZATION_ERROR}.get(
                resp.status_code, RETRIABLE)
            return every(code, reason)
        answers = body.get("results") if isinstance(body, dict) else None
        if not isinstance(answers, list) or len(answers) != len(message_ids):
            return every(RETRIABLE, "tracker answered HTTP 200 without the results")
        return [_result(m, a) for m, a in zip(message_ids, answers, strict=True)]


def _result(message_id: str, answer: Any) -> dict[str, Any]:
    """One id's result from its answer in the tracker's `CancelManyBody`."""
    if not isinstance(answer, dict):
        return _failed(message_id, RETRIABLE, "tracker answered without a result")
    reason = str(answer.get("reason", ""))
    if answer.get("result") is None:
        code = INVALID_MESSAGE if answer.get("status") == 400 else RETRIABLE
        return _failed(message_id, code, reason)
    out = {"messageId": message_id, "errorCode": 0, "result": answer["result"],
           "delivered": bool(answer.get("delivered")), "reason": reason}
    if answer.get("status") == 503:  # busy: no answer yet
        out |= {"errorCode": RETRIABLE, "errorMsg": reason}
    return out


def _chunks(message_ids: list[str]) -> list[list[str]]:
    """``message_ids`` in runs whose JSON fits the tracker's request body limit (64 KiB
    by default); an id too long to be one is sent nowhere (`_ask`)."""
    out: list[list[str]] = [[]]
    size = 0
    for message_id in message_ids:
        n = min(len(message_id), MAX_MESSAGE_ID_CHARS + 1) + 4
        if out[-1] and size + n > CHUNK_CHARS:
            out.append([])
            size = 0
        out[-1].append(message_id)
        size += n
    return out if out[-1] else []
