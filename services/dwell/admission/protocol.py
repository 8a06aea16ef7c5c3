"""Admission's HTTP protocol: uvicorn's httptools protocol, with the publish requests
(`POST /topics/{domain}/{tenant}/{namespace}/{topic}`) served straight from the parser
instead of through ASGI.

On uvicorn's own path a request costs ~25 us of Python around the app: a receive/send
pair of coroutines and their event, the proxy-headers middleware, two ASGI messages
checked header by header. A publish needs none of it: the protocol collects the body,
runs the handler in one task and writes the answer in one call (~18 us). Every
other request (`/readyz`, `/metrics`, `/docs`, ...) goes through uvicorn to FastAPI as
before, and the FastAPI app keeps a route for the publish path too, for any other server.

What uvicorn does per request is kept: keep-alive and its timeout, `Expect:
100-continue`, pipelined requests answered in order (a publish holds the next request
back until its answer is written, as uvicorn's cycles do), `limit_concurrency`, the
server's default headers (`date`, `server`), graceful shutdown waiting for requests in
flight, and no write to a connection the client closed.

A publish body larger than `max_request_bytes` is refused with 413 before it is read
whole: at once when its Content-Length says so, else (chunked) as soon as the bytes
received pass the limit; the connection is then closed, since the rest of the body is
never read. `dwell.http.BodyLimit` holds every other request to the same limit.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from dwell.http import internal_error

log = logging.getLogger("dwell.admission")

# (domain, tenant, namespace, topic, body) -> (status, JSON body, extra headers)
Handler = Callable[[str, str, str, str, bytes],
                   Awaitable[tuple[int, bytes, dict[str, str] | None]]]

_PREFIX = "/topics/"
_CONTENT_TYPE = b"content-type: application/json\r\n"
_CLOSE = b"connection: close\r\n"


def publish_parts(method: str, path: str) -> list[str] | None:
    """The four path segments of a publish request, or None: the FastAPI route's match
    (four non-empty segments of the decoded path)."""
    if method != "POST" or not path.startswith(_PREFIX):
        return None
    parts = path[len(_PREFIX):].split("/")
    return parts if len(parts) == 4 and all(parts) else None


def publish_protocol(handle: Handler, max_request_bytes: int) -> type[HttpToolsProtocol]:
    """The protocol class to give uvicorn (`http=`) that serves publish requests with
    `handle`, refusing bodies over `max_request_bytes` with 413."""
    return type("PublishProtocol", (PublishProtocol,), {
        "handle": staticmethod(handle), "max_request_bytes": max_request_bytes})


def too_large(limit: int, size: int | None = None) -> bytes:
    """The 413 answer's JSON body; `size` when the request declared it."""
    got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return orjson.dumps({"reason": f"request body: {got}; the limit is {limit} bytes "
                                   f"(max_request_bytes)"})


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """A request's Content-Length (the parser has refused a malformed one), or None."""
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return None


class PublishProtocol(HttpToolsProtocol):
    """See the module docstring; made by `publish_protocol`, which sets `handle`."""

    handle: Handler
    max_request_bytes: int

    # uvicorn calls this for every request whose headers are in, at once or, for a
    # pipelined one, when the answer before it is complete.
    def _start_asgi_task(self, cycle: RequestResponseCycle, app: object) -> None:
        parts = None if app is service_unavailable else publish_parts(
            cycle.scope["method"], cycle.scope["path"])
        if parts is None:
            super()._start_asgi_task(cycle, app)  # type: ignore[arg-type]
            return
        limit = self.max_request_bytes
        size = content_length(cycle.scope["headers"])
        if (size is not None and size > limit) or len(cycle.body) > limit:
            self._refuse(cycle, too_large(limit, size))
            return
        cycle.publish_parts = parts  # type: ignore[attr-defined]
        if cycle.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if cycle.more_body:
            self.flow.resume_reading()  # the body is read whole: see on_body
        else:
            self._dispatch(cycle)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        # uvicorn pauses reading past 64 KiB until the app asks for more; a publish
        # wants its whole body (bounded by max_request_bytes), unless it is pipelined
        # behind another request, which keeps reading paused until its turn.
        cycle = self.cycle
        if self._is_started_publish(cycle) and not cycle.response_complete:
            if len(cycle.body) > self.max_request_bytes:
                self._refuse(cycle, too_large(self.max_request_bytes))
                return
            self.flow.resume_reading()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle = self.cycle
        if self._is_started_publish(cycle) and not cycle.response_complete:
            self._dispatch(cycle)

    @staticmethod
    def _is_started_publish(cycle: RequestResponseCycle | None) -> bool:
        # `_start_asgi_task` marks a publish once no earlier request of the connection
        # waits for its answer; until then it waits in uvicorn's pipeline, unmarked.
        return cycle is not None and hasattr(cycle, "publish_parts")

    def _dispatch(self, cycle: RequestResponseCycle) -> None:
        body = bytes(cycle.body)
        cycle.body = bytearray()
        task = self.loop.create_task(self._serve(cycle, body))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)  # uvicorn's shutdown waits for these

    def _refuse(self, cycle: RequestResponseCycle, content: bytes) -> None:
        """Answer 413 and close: the rest of the body is not read, so the connection
        cannot carry another request."""
        cycle.body = bytearray()
        cycle.keep_alive = False
        self._write(cycle, 413, content, None)

    async def _serve(self, cycle: RequestResponseCycle, body: bytes) -> None:
        domain, tenant, namespace, topic = cycle.publish_parts  # type: ignore[attr-defined]
        answer = self.handle(domain, tenant, namespace, topic, body)
        del body  # the handler lets it go once decoded: see Publisher.publish
        try:
            status, content, extra = await answer
        except Exception as exc:  # the app's 500 handler, which this path bypasses
            log.exception("unhandled error on POST %s", cycle.scope["path"])
            status, extra = 500, None
            content = orjson.dumps({"reason": internal_error(exc)})
        if self.flow.write_paused and not cycle.disconnected:
            await self.flow.drain()
        if cycle.disconnected or self.transport.is_closing():
            return
        self._write(cycle, status, content, extra)

    def _write(self, cycle: RequestResponseCycle, status: int, content: bytes,
               extra: dict[str, str] | None) -> None:
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += (name, b": ", value, b"\r\n")
        head += (_CONTENT_TYPE, b"content-length: %d\r\n" % len(content))
        if extra:
            for name, text in extra.items():
                head += (name.lower().encode(), b": ", text.encode(), b"\r\n")
        if not cycle.keep_alive:
            head.append(_CLOSE)
        head += (b"\r\n", content)
        self.transport.write(b"".join(head))
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()  # the next pipelined request, or the keep-alive timer
