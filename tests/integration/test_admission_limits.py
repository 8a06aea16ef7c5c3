"""Admission's request limits on a real admission process, over real sockets: a body over
`max_request_bytes` is refused with 413 naming the limit before it is read whole (by its
Content-Length, or counted as a chunked body arrives), a body at the limit is served,
and a `dwell.publish` record over the limit is refused as a request. The per-message
limits (`max_payload_bytes`, `max_messages_per_request`) are table-tested in
tests/unit/admission/test_publish.py and over HTTP in test_admission.py."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from dwell.adapters import kafka
from dwell.core import topics as names
from dwell_dev.testkit import read_answers

pytestmark = pytest.mark.integration

LIMIT = 4096


@pytest.fixture(scope="module")
def admission(services: Any) -> Iterator[tuple[str, int]]:
    svc = services.start("admission", {"DWELL_MAX_REQUEST_BYTES": str(LIMIT)})
    yield "127.0.0.1", svc.port
    svc.stop()




def head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: admission", "content-type: application/json",
             *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def body_of(size: int) -> bytes:
    """A publish body of exactly `size` bytes."""
    shell = b'{"messages":[{"payload":""}]}'
    return shell.replace(b'""', b'"' + b"a" * (size - len(shell)) + b'"')


def test_a_declared_body_over_the_limit_is_413_before_any_of_it_is_sent(
        admission: tuple[str, int], unique: str) -> None:
    with socket.create_connection(admission) as sock:
        # Only the head: the answer must not wait for the 10 MB it announces.
        sock.sendall(head(f"/topics/persistent/{unique}/ns/x",
                          f"content-length: {10 * 1024 * 1024}"))
        status, headers, content = read_answers(sock, 1)[0]
    assert status == 413, content
    assert orjson.loads(content)["reason"] == (
        f"request body: {10 * 1024 * 1024} bytes; the limit is {LIMIT} bytes "
        "(max_request_bytes)")
    assert headers.get("connection") == "close"


def test_a_chunked_body_is_refused_once_it_passes_the_limit(
        admission: tuple[str, int], unique: str) -> None:
    with socket.create_connection(admission) as sock:
        sock.sendall(head(f"/topics/persistent/{unique}/ns/x", "transfer-encoding: chunked"))
        chunk = b"a" * 1024
        # Never the terminating chunk: the answer must come from counting alone.
        for _ in range(LIMIT // len(chunk) + 1):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _, content = read_answers(sock, 1)[0]
    assert status == 413, content
    assert orjson.loads(content)["reason"] == (
        f"request body: more than {LIMIT} bytes; the limit is {LIMIT} bytes "
        "(max_request_bytes)")


def test_a_body_at_the_limit_is_served(admission: tuple[str, int], unique: str) -> None:
    for framing in ("length", "chunked"):
        body = body_of(LIMIT)
        with socket.create_connection(admission) as sock:
            if framing == "length":
                sock.sendall(head(f"/topics/persistent/{unique}/ns/x",
                                  f"content-length: {len(body)}") + body)
            else:
                sock.sendall(head(f"/topics/persistent/{unique}/ns/x",
                                  "transfer-encoding: chunked")
                             + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            status, _, content = read_answers(sock, 1)[0]
        # Past the limit check: the namespace does not exist.
        assert status == 404, (framing, content)


def test_the_other_routes_are_held_to_the_limit_too(admission: tuple[str, int]) -> None:
    with socket.create_connection(admission) as sock:
        sock.sendall(head("/readyz", f"content-length: {LIMIT + 1}"))
        status, _, content = read_answers(sock, 1)[0]
    assert status == 413, content
    assert "(max_request_bytes)" in orjson.loads(content)["reason"]


def test_a_kafka_ingress_request_over_the_limit_is_refused(
        admission: tuple[str, int], kafka_bootstrap: str, unique: str) -> None:
    ends = kafka.end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    producer_name = f"big-{uuid.uuid4().hex[:6]}"
    body = orjson.loads(body_of(LIMIT + 1))
    body |= {"producerName": producer_name, "topic": f"persistent://{unique}/ns/x"}
    p = kafka.Producer(kafka_bootstrap, linger_ms=0)
    try:
        p.send(names.PUBLISH, orjson.dumps(body), key=body["topic"]).result(10)
    finally:
        p.close()
    c = kafka.Consumer(kafka_bootstrap, f"test-{uuid.uuid4().hex}")
    c.assign([(names.PUBLISH_RESULTS, part, off) for part, off in ends.items()])
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    try:
        while not got and time.monotonic() < deadline:
            got += [orjson.loads(r.value) for r in c.poll(500, 0.5)
                    if r.key == producer_name.encode()]
    finally:
        c.close()
    assert len(got) == 1, got
    assert got[0]["errorCode"] == 2
    assert got[0]["errorMsg"].endswith(f"the limit is {LIMIT} bytes (max_request_bytes)")
