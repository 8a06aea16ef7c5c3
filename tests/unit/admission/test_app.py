"""Admission's publish front (`PublishFront`) under uvicorn, against real sockets: requests
to the publish routes (matched by the routes the app declares) reach the handler straight
from ASGI and answer as FastAPI answers them, everything else reaches FastAPI, what
uvicorn does per request holds for both (pipelining in order, Expect: 100-continue,
large bodies, keep-alive and Connection: close, a client that leaves mid-request), an
unexpected error is a 500 without a trace, and a body over the limit is refused with 413
on both paths, before it is read whole."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dwell.admission.app import PublishFront, add_publish_routes
from dwell.http import BodyLimit, create_app
from dwell_dev.testkit import read_answers

SLOW_S = 0.3
LIMIT = 2 * 1024 * 1024


async def handle(domain: str, tenant: str, namespace: str, topic: str,
                 body: bytes) -> tuple[int, bytes, dict[str, str] | None]:
    if topic == "boom":
        raise KeyError("secret detail")
    if topic == "slow":
        await asyncio.sleep(SLOW_S)
    if topic == "busy":
        return 503, b'{"reason":"busy"}', {"Retry-After": "1"}
    return 200, orjson.dumps({"parts": [domain, tenant, namespace, topic], "size": len(body),
                              "sha": hashlib.sha256(body).hexdigest()}), None


class Marked:
    """ASGI middleware: every answer FastAPI gives carries `x-through: fastapi`, so a test
    sees which path served a request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message["headers"], (b"x-through", b"fastapi")]
            await send(message)

        await self.app(scope, receive, marked)


def build() -> tuple[FastAPI, PublishFront]:
    """The app under test (the publish routes, /ping, /echo) and the front over it."""

    async def ready() -> dict[str, bool]:
        return {"ready": True}

    app = create_app("test", "admission's publish front under test", ready)

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"pong": True}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    routes = add_publish_routes(app, handle)
    app.add_middleware(BodyLimit, max_bytes=LIMIT, setting="max_request_bytes")
    app.add_middleware(Marked)
    return app, PublishFront(app, routes, handle, LIMIT)


def run(asgi: ASGIApp) -> Iterator[tuple[str, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(asgi, host="127.0.0.1", port=port,
                            lifespan="off", log_level="warning", access_log=False)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield "127.0.0.1", port
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    yield from run(build()[1])


@pytest.fixture(scope="module")
def plain() -> Iterator[tuple[str, int]]:
    """The same app served by FastAPI alone, as any ASGI server would serve it."""
    yield from run(build()[0])


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: admission", f"content-length: {len(body)}",
             "content-type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def request(method: str, path: str) -> dict[str, str]:
    return {"type": "http", "method": method, "path": path}


@pytest.mark.parametrize(("method", "path", "fast"), [
    ("POST", "/topics/persistent/a/b/c", True),
    ("POST", "/topics/persistent/a/b/x%20y", True),
    # Pulsar's route to one partition.
    ("POST", "/topics/persistent/a/b/c/partitions/02", True),
    ("POST", "/topics/persistent/a/b/c-partition-0/partitions/1", True),  # 400
    ("POST", "/topics/persistent/a/b/c/partitions/x", False),  # FastAPI's 422
    ("POST", "/topics/persistent/a/b/c/partitions/-1", False),
    ("POST", "/topics/persistent/a/b/c/partitions/", False),
    ("POST", "/topics/persistent/a/b/c/partition/1", False),
    ("POST", "/topics/persistent/a/b/c/partitions/1/2", False),
    ("POST", "/topics/persistent/a/b", False),
    ("POST", "/topics/persistent/a//c", False),
    ("POST", "/topics/persistent/a/b/c/d", False),
    ("GET", "/topics/persistent/a/b/c", False),
])
def test_the_front_answers_the_publish_routes_as_fastapi_does(
        server: tuple[str, int], plain: tuple[str, int], method: str, path: str,
        fast: bool) -> None:
    """The front serves exactly what the declared routes match, with FastAPI's answer."""
    got = [httpx.request(method, f"http://{host}:{port}{path}", content=b'{"messages": []}')
           for host, port in (server, plain)]
    assert (got[0].status_code, got[0].content) == (got[1].status_code, got[1].content)
    assert got[1].headers["x-through"] == "fastapi"
    assert ("x-through" not in got[0].headers) == fast
    topics = {"/partitions/02": "c-partition-2", "/partitions/-1": "c"}
    for end, topic in topics.items():
        if path.endswith(end):
            assert orjson.loads(got[0].content)["parts"] == ["persistent", "a", "b", topic]


def test_publish_reaches_the_handler_and_the_rest_reaches_fastapi(
        server: tuple[str, int]) -> None:
    host, port = server
    with httpx.Client(base_url=f"http://{host}:{port}") as c:
        got = c.post("/topics/persistent/t/ns/x%20y", content=b'{"messages": []}')
        assert got.status_code == 200
        assert got.headers["content-type"] == "application/json"
        assert "date" in got.headers
        assert orjson.loads(got.content)["parts"] == ["persistent", "t", "ns", "x y"]
        assert c.get("/ping").json() == {"pong": True}
        assert c.post("/topics/persistent/t/ns", content=b"{}").status_code in (404, 405)
        busy = c.post("/topics/persistent/t/ns/busy", content=b"{}")
        assert (busy.status_code, busy.headers["retry-after"]) == (503, "1")


def test_an_unexpected_error_is_a_500_without_a_trace(server: tuple[str, int]) -> None:
    host, port = server
    got = httpx.post(f"http://{host}:{port}/topics/persistent/t/ns/boom", content=b"{}")
    assert got.status_code == 500
    assert orjson.loads(got.content) == {
        "reason": "internal error (KeyError); see the service log"}
    assert b"secret" not in got.content


def test_pipelined_requests_are_answered_in_order(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(post("/topics/persistent/t/ns/slow", b"1")
                     + post("/topics/persistent/t/ns/fast", b"22")
                     + b"GET /ping HTTP/1.1\r\nhost: admission\r\n\r\n"
                     + post("/topics/persistent/t/ns/last", b"333"))
        answers = read_answers(sock, 4)
    assert [status for status, _, _ in answers] == [200] * 4
    sizes = [orjson.loads(body).get("size") for _, _, body in answers]
    assert sizes == [1, 2, None, 3]


def test_expect_100_continue_and_a_large_body(server: tuple[str, int]) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB: past uvicorn's 64 KiB read-ahead
    with socket.create_connection(server) as sock:
        request = post("/topics/persistent/t/ns/big", body, "expect: 100-continue")
        head = request[:-len(body)]
        sock.sendall(head)
        sock.settimeout(5)
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        [(status, _, answer)] = read_answers(sock, 1)
    assert status == 200
    assert orjson.loads(answer) == {"parts": ["persistent", "t", "ns", "big"],
                                    "size": len(body), "sha": hashlib.sha256(body).hexdigest()}


def test_keep_alive_and_connection_close(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(post("/topics/persistent/t/ns/a", b"x"))
        [(_, headers, _)] = read_answers(sock, 1)
        assert "connection" not in headers  # kept alive
        sock.sendall(post("/topics/persistent/t/ns/b", b"y", "connection: close"))
        [(status, headers, _)] = read_answers(sock, 1)
        assert (status, headers["connection"]) == (200, "close")
        assert sock.recv(1) == b""  # the server closed it


def test_a_client_gone_mid_request_leaves_the_server_serving(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(post("/topics/persistent/t/ns/slow", b"z"))
    time.sleep(SLOW_S + 0.1)  # the answer finds the connection gone
    got = httpx.post(f"http://{server[0]}:{server[1]}/topics/persistent/t/ns/after",
                     content=b"ok")
    assert got.status_code == 200 and orjson.loads(got.content)["size"] == 2


def chunked(path: str, chunk: bytes, count: int) -> bytes:
    """A chunked POST of `count` chunks, without its terminating chunk."""
    head = f"POST {path} HTTP/1.1\r\nhost: admission\r\ntransfer-encoding: chunked\r\n\r\n"
    return head.encode() + b"%x\r\n%s\r\n" % (len(chunk), chunk) * count


def test_a_body_over_the_limit_is_413_before_it_is_read(server: tuple[str, int]) -> None:
    reason = (f"request body: {LIMIT + 1} bytes; the limit is {LIMIT} bytes "
              "(max_request_bytes)")
    for path in ("/topics/persistent/t/ns/big", "/echo"):
        with socket.create_connection(server) as sock:
            # No 100 Continue: the client need not send what would be refused.
            sock.sendall(post(path, b"", "expect: 100-continue").replace(
                b"content-length: 0", b"content-length: %d" % (LIMIT + 1)))
            [(status, headers, answer)] = read_answers(sock, 1)
            assert (status, orjson.loads(answer)) == (413, {"reason": reason}), path
            assert headers["connection"] == "close"
            assert sock.recv(1) == b""


def test_a_chunked_body_is_refused_once_past_the_limit(server: tuple[str, int]) -> None:
    reason = (f"request body: more than {LIMIT} bytes; the limit is {LIMIT} bytes "
              "(max_request_bytes)")
    chunk = b"x" * 65536
    for path in ("/topics/persistent/t/ns/big", "/echo"):
        with socket.create_connection(server) as sock:
            sock.sendall(chunked(path, chunk, LIMIT // len(chunk) + 1))
            [(status, _, answer)] = read_answers(sock, 1)
            assert (status, orjson.loads(answer)) == (413, {"reason": reason}), path
        # At the limit, served.
        with socket.create_connection(server) as sock:
            sock.sendall(chunked(path, chunk, LIMIT // len(chunk)) + b"0\r\n\r\n")
            [(status, _, answer)] = read_answers(sock, 1)
            assert (status, orjson.loads(answer)["size"]) == (200, LIMIT), path


def test_a_pipelined_body_over_the_limit_is_refused_in_its_turn(
        server: tuple[str, int]) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(post("/topics/persistent/t/ns/slow", b"1")
                     + chunked("/topics/persistent/t/ns/big", b"y" * 65536,
                               LIMIT // 65536 + 1))
        answers = read_answers(sock, 2)
    assert [status for status, _, _ in answers] == [200, 413]
