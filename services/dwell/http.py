"""What every dwell HTTP service shares: `/healthz`, `/readyz`, `/metrics`, errors
as `{"reason": ...}` JSON (Pulsar's admin error shape) with a 4xx for bad input
and never a stack trace, and the uvicorn runner."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dwell import memory
from dwell.settings import CommonSettings

log = logging.getLogger("dwell")
# Every service's /metrics: what its allocator holds (dwell.memory).
REGISTRY.register(memory.AllocatorCollector())

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


def describe_validation(exc: RequestValidationError) -> str:
    """One line naming each bad field, e.g. `messages[0].deliverAt: Input should be...`."""
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        field = ""
        for p in loc:
            field += f"[{p}]" if p.isdigit() else (f".{p}" if field else p)
        msg = err.get("msg", "invalid")
        if err.get("type") == "json_invalid":
            return f"invalid JSON: {err.get('ctx', {}).get('error', msg)}"
        parts.append(f"{field or 'body'}: {msg}")
    return "; ".join(parts) or "invalid request"


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 naming the limit,
    at once when its Content-Length says so, else when the bytes read pass it (the app
    reading the body then gets the 413 as an HTTPException, whatever reads it)."""

    def __init__(self, app: ASGIApp, max_bytes: int, setting: str) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.setting = setting

    def reason(self, size: int | None) -> str:
        got = f"{size} bytes" if size is not None else f"more than {self.max_bytes} bytes"
        return f"request body: {got}; the limit is {self.max_bytes} bytes ({self.setting})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await error(413, self.reason(int(value)), {"connection": "close"})(
                    scope, receive, send)
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


def create_app(title: str, description: str, ready: ReadyCheck) -> FastAPI:
    app = FastAPI(title=title, description=description, version="0.1.0")

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error(exc.status, exc.reason, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error(500, internal_error(exc))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

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
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


def serve(app: ASGIApp | str, settings: CommonSettings) -> None:
    """Run `app` under uvicorn, with uvicorn's own HTTP implementation."""
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    memory.configure()
    memory.Releaser().start()
    uvicorn.run(app, host=settings.http_host, port=settings.http_port,
                log_level=settings.log_level, access_log=False)
