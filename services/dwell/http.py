"""What every dwell HTTP service shares: `/healthz`, `/readyz`, `/metrics`, errors
as `{"reason": ...}` JSON (Pulsar's admin error shape) with a 4xx for bad input
and never a stack trace, and the uvicorn runner."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import pydantic
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dwell import memory
from dwell.security import uvicorn_ssl
from dwell.settings import CommonSettings

log = logging.getLogger("dwell")
# Every service's /metrics: what its allocator holds (dwell.memory).
REGISTRY.register(memory.ALLOCATOR)

ReadyCheck = Callable[[], Awaitable[dict[str, Any]]]


class ApiError(Exception):
    """An error with an HTTP status and a message for the caller."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers


def error(status: int, reason: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"reason": reason}, status_code=status, headers=headers)


def internal_error(exc: Exception) -> str:
    """The reason a 500 gives: the exception's type, never its text or a stack trace."""
    return f"internal error ({type(exc).__name__}); see the service log"


# What a 400 says for each kind of pydantic error; any other kind gives pydantic's text.
_ERROR_TEXTS: Final = {
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "extra_forbidden": "unknown field",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
    "json_invalid": "is not valid JSON",
    "json_type": "is not valid JSON",
    "missing": "is required",
}
# The first element of a FastAPI error's location: where in the request, not a field.
_REQUEST_PARTS: Final = ("body", "query", "path", "header", "cookie")


def _error_text(err: Any) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind == "too_long":
        return f"must have at most {ctx['max_length']} items, not {ctx['actual_length']}"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters"
    return _ERROR_TEXTS.get(kind, str(err.get("msg", "invalid")))


# How many bad fields a reason names; it counts the others, so that its length does not
# grow with the input.
MAX_REASON_FIELDS: Final = 5


def validation_reason(exc: pydantic.ValidationError | RequestValidationError) -> str:
    """The reason a 400 gives for a body or parameters that do not fit their model: one
    clause per bad field, e.g. `messages[2].deliverAt: must be an integer; tickTime: must
    be >= 1`, for the first MAX_REASON_FIELDS of them, then how many more there are.
    Every service and both admission entry paths word errors with it."""
    parts: list[str] = []
    errs = exc.errors()
    for err in errs:
        loc = list(err.get("loc", ()))
        if isinstance(exc, RequestValidationError) and loc and loc[0] in _REQUEST_PARTS:
            loc = loc[1:]
        where = ""
        if err["type"] in ("json_invalid", "json_type"):
            loc = []  # pydantic locates a JSON syntax error by character, not by field
        for p in loc:
            where += f"[{p}]" if isinstance(p, int) else (f".{p}" if where else str(p))
        parts.append(f"{where or 'body'}: {_error_text(err)}")
    named = list(dict.fromkeys(parts))
    if len(named) > MAX_REASON_FIELDS:
        more = len(named) - MAX_REASON_FIELDS
        named = [*named[:MAX_REASON_FIELDS], f"and {more} more bad field{'s' * (more > 1)}"]
    return "; ".join(named) or "invalid request"


def too_large(max_bytes: int, setting: str, size: int | None) -> str:
    """The reason of the 413 for a body over `max_bytes` (the setting named `setting`);
    `size` when the request declared it."""
    got = f"{size} bytes" if size is not None else f"more than {max_bytes} bytes"
    return f"request body: {got}; the limit is {max_bytes} bytes ({setting})"


def declared_size(scope: Scope) -> int | None:
    """A request's Content-Length, or None when it has none (chunked) or a malformed one."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 naming the limit,
    at once when its Content-Length says so, else when the bytes read pass it (the app
    reading the body then gets the 413 as an HTTPException, whatever reads it). Headers
    are bounded before the app sees them, by the HTTP protocol (`bounded_headers`)."""

    def __init__(self, app: ASGIApp, max_bytes: int, setting: str) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.setting = setting

    def reason(self, size: int | None) -> str:
        return too_large(self.max_bytes, self.setting, size)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = declared_size(scope)
        if size is not None and size > self.max_bytes:
            await error(413, self.reason(size), {"connection": "close"})(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise StarletteHTTPException(413, self.reason(None),
                                                 {"connection": "close"})
            return message

        await self.app(scope, counted, send)


class ErrorBody(pydantic.BaseModel):
    """Every error answer's body (Pulsar's admin error shape)."""

    reason: str


class CancelBody(pydantic.BaseModel):
    """The answer to a cancel of a delayed message: `result` is one of
    dwell.core.positions' answers (`cancelled`, `not_found`, `too_late`, `busy`),
    `delivered` says a `not_found` message was delivered already (rather than never
    existed), `reason` says it in words."""

    messageId: str
    result: str
    delivered: bool = False
    reason: str


# The most ids one request to the tracker's cancellations route may name: a cancel
# request on dwell.publish holds at most DWELL_MAX_MESSAGES_PER_REQUEST (1,000 by
# default) and is sent whole.
MAX_CANCELS_PER_REQUEST = 10_000


class CancelMany(pydantic.BaseModel):
    """The body of the tracker's `POST .../cancellations`."""

    messageIds: list[str] = pydantic.Field(max_length=MAX_CANCELS_PER_REQUEST)


class CancelAnswer(pydantic.BaseModel):
    """One id's answer in `CancelManyBody`, as `CancelBody`, plus `status`: what its own
    DELETE would have answered. `result` is missing when there was no answer (400, or 503
    when Kafka or Redis could not be asked)."""

    messageId: str
    status: int
    result: str | None = None
    delivered: bool = False
    reason: str


class CancelManyBody(pydantic.BaseModel):
    results: list[CancelAnswer]


# `responses=` of a cancel route, besides its 200.
CANCEL_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    404: {"model": CancelBody, "description": "not_found: never existed, or (delivered: "
                                              "true) delivered already"},
    409: {"model": CancelBody, "description": "too_late: the message is due and being "
                                              "delivered"},
    503: {"model": CancelBody, "description": "busy: the index has not reached the message, "
                                              "or re-files its bucket; retry"},
}


_ERROR_DESCRIPTIONS: Final = {
    400: "A parameter or the body does not fit (the reason names each bad field)",
    401: "Authentication is on and the request has no valid token",
    403: "The token's role may not do this on this tenant or namespace",
    404: "The tenant, namespace, topic or subscription does not exist",
    406: "Pulsar's answer for a partition count it does not accept",
    409: "It exists already, or is in use",
    412: "A name that is not valid, or a request Pulsar refuses as a failed precondition",
    413: "The body is bigger than the service's limit",
    422: "Pulsar's answer for a partition count it cannot apply to the topic",
    431: "The request's headers are bigger than the service's limit",
    503: "Redis, Kafka or a service this one asks is unavailable; retry",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a route: the error statuses it answers, each with ErrorBody. Every
    route also gets 400 when it reads parameters or a body, and 503 (create_app)."""
    return {code: {"model": ErrorBody, "description": _ERROR_DESCRIPTIONS[code]}
            for code in codes}


def _error_response(code: int) -> dict[str, Any]:
    return {"description": _ERROR_DESCRIPTIONS[code], "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ErrorBody"}}}}


# How a guarded route authenticates (dwell.auth.guard), in the OpenAPI document.
BEARER_SCHEME: Final = "bearerAuth"
BEARER: Final = {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                 "description": "A token of the role (Pulsar's AuthenticationToken), when "
                                "the service runs with authentication on "
                                "(DWELL_AUTHENTICATION_ENABLED)."}


# How FastAPI describes the 422 it documents for a request that does not validate.
FASTAPI_VALIDATION_ERROR: Final = "Validation Error"


def all_routes(app: FastAPI) -> list[BaseRoute]:
    """Every route of the app, those of the routers it includes too (FastAPI keeps an
    included router as one entry of `app.routes`)."""
    out: list[BaseRoute] = []
    pending = list(app.routes)
    while pending:
        route = pending.pop(0)
        included = getattr(route, "original_router", None)
        if included is not None:
            pending[:0] = included.routes
        else:
            out.append(route)
    return out


def _with_errors(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document as the service answers: FastAPI's 422 for a request that
    does not validate is dwell's 400 (create_app's handler; a route's own 422, Pulsar's
    answer to a partition count, stays), a route with a guard
    (dwell.auth) takes a bearer token and may answer 401 and 403, and any route 503 when
    what it needs is down."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    guarded = {(method.lower(), route.path) for route in all_routes(app)
               if isinstance(route, APIRoute) and route.dependencies
               for method in route.methods}
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            answers = op.setdefault("responses", {})
            if (method, path) in guarded:
                op["security"] = [{BEARER_SCHEME: []}]
                answers.setdefault("401", _error_response(401))
                answers.setdefault("403", _error_response(403))
            if "422" in answers:  # FastAPI's, for a route with parameters, or a route's own
                answers.setdefault("400", _error_response(400))
                if answers["422"].get("description") == FASTAPI_VALIDATION_ERROR:
                    del answers["422"]
            if "requestBody" in op:  # BodyLimit's
                answers.setdefault("413", _error_response(413))
            answers.setdefault("503", _error_response(503))
            # A body schema given as a model's JSON schema (openapi_extra) keeps its
            # nested models under `$defs`, which OpenAPI tools do not resolve there.
            for media in op.get("requestBody", {}).get("content", {}).values():
                body = media.get("schema", {})
                components.update(body.pop("$defs", {}))
    schema = json.loads(json.dumps(schema).replace('"#/$defs/', '"#/components/schemas/'))
    if guarded:
        schema["components"]["securitySchemes"] = {BEARER_SCHEME: BEARER}
    components = schema["components"]["schemas"]
    components["ErrorBody"] = ErrorBody.model_json_schema()
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    app.openapi_schema = schema
    return schema


def create_app(title: str, description: str, ready: ReadyCheck,
               stalled: Callable[[], list[str]] | None = None,
               metrics_access: Callable[[str | None], None] | None = None) -> FastAPI:
    """A dwell service's app with its error handlers, `/readyz` (from ``ready``),
    `/healthz` and `/metrics`. ``stalled`` names the process's loops that are stuck
    (dwell.liveness); while it names any, `/healthz` answers 503 with them.
    ``metrics_access`` checks a /metrics caller's Authorization header (ApiError when
    refused; dwell.auth.guard.Guard.check_metrics)."""
    app = FastAPI(title=title, description=description, version="0.1.0")
    app.openapi = lambda: _with_errors(app)  # type: ignore[method-assign]

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error(exc.status, exc.reason, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, validation_reason(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    # Only parsing a body nested past the parser's depth recurses that far: the sender's
    # input, so a 400, never a 500.
    @app.exception_handler(RecursionError)
    async def _too_deep(_: Request, exc: RecursionError) -> JSONResponse:
        return error(400, "body: nested too deeply")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error(500, internal_error(exc))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> Response:
        stuck = stalled() if stalled is not None else []
        if stuck:
            return Response(json.dumps({"status": "stalled", "stalled": stuck}),
                            status_code=503, media_type="application/json")
        return Response(b'{"status": "ok"}', media_type="application/json")

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Response:
        try:
            checks = await ready()
        except Exception as exc:  # a readiness probe reports, it does not raise
            checks = {"ready": False, "error": str(exc)}
        ok = bool(checks.get("ready"))
        return Response(json.dumps(checks), status_code=200 if ok else 503,
                        media_type="application/json")

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        if metrics_access is not None:
            metrics_access(request.headers.get("authorization"))
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


# How long a connection refused for its headers is kept open, discarding what the client
# still sends, so that the client reads the 431 rather than a reset.
_REFUSED_LINGER_S: Final = 1.0


class _Refused(Exception):
    """Stops httptools' parse of a request refused for its headers."""


def bounded_headers(max_bytes: int) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, answering 431 and closing the connection when a
    request's target and headers pass `max_bytes` (max_header_bytes).

    httptools keeps every byte of a request's target and headers until they end, with no
    bound of its own, so a second bound is kept on the bytes the connection receives
    before they end: a request is refused once they pass twice the limit, and at most
    that and one read are held."""

    class BoundedHeaders(HttpToolsProtocol):
        # Bytes received since the last request's headers were complete; None while a
        # request's body is read.
        _header_bytes: int | None = 0
        _refused = False

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._header_bytes is not None:
                self._header_bytes += len(data)
            super().data_received(data)
            if (not self._refused and self._header_bytes is not None
                    and self._header_bytes > 2 * max_bytes):
                self._refuse(f"more than {2 * max_bytes} bytes received before their end")

        def on_headers_complete(self) -> None:
            size = len(self.url) + sum(len(name) + len(value) for name, value in self.headers)
            if size > max_bytes:
                self._refuse(f"{size} bytes")
                raise _Refused
            self._header_bytes = None
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._header_bytes = 0

        def send_400_response(self, msg: str) -> None:
            if not self._refused:  # a refusal stops the parse with an error: answered
                super().send_400_response(msg)

        def _refuse(self, size: str) -> None:
            self._refused = True
            body = json.dumps({"reason": f"request target and headers: {size}; the limit "
                                         f"is {max_bytes} bytes (max_header_bytes)"}).encode()
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: application/json\r\ncontent-length: "
                + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            asyncio.get_running_loop().call_later(_REFUSED_LINGER_S, self.transport.close)

    return BoundedHeaders


def serve(app: ASGIApp | str, settings: CommonSettings) -> None:
    """Run `app` under uvicorn, with uvicorn's own HTTP implementation (its httptools
    protocol, with request headers bounded by `bounded_headers`), over TLS when
    DWELL_TLS_ENABLED (certificate and key from settings). No dwell service
    looks at a client's address, so uvicorn's proxy-headers middleware (which rewrites it
    from X-Forwarded-For on every request from a trusted host) is left out."""
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    memory.configure()
    memory.Releaser().start()
    uvicorn.run(app, host=settings.http_host, port=settings.http_port,
                log_level=settings.log_level, access_log=False, proxy_headers=False,
                http=bounded_headers(settings.max_header_bytes), **uvicorn_ssl(settings))
