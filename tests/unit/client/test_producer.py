"""The SDK producers' request shape and how they map publish results to ids and errors
(the admission service is replaced by an httpx transport that answers like it); the
asyncio producer's cases are the sync one's, run with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from dwell.client import (
    AsyncProducer,
    CancelResult,
    NotAllowedError,
    Producer,
    ProducerQueueIsFullError,
    PublishError,
)
from dwell.client.producer import MAX_CONNECTIONS

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


def test_a_schedule_key_is_sent_only_when_given() -> None:
    p, seen = producer(ok())
    p.send(b"x", deliver_after=1000, schedule_key="order-7")
    p.send(b"x")
    assert seen[0]["messages"][0]["scheduleKey"] == "order-7"
    assert "scheduleKey" not in seen[1]["messages"][0]


def test_deliver_at_accepts_datetime_and_millis_and_text_stays_text() -> None:
    p, seen = producer(ok())
    when = datetime(2030, 1, 1, tzinfo=timezone.utc)
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


def test_unreachable_admission_is_a_publish_error() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    p = Producer(TOPIC, admission_url="http://adm", transport=httpx.MockTransport(refuse))
    with pytest.raises(PublishError, match="admission unreachable: connection refused") as exc:
        p.send(b"x")
    assert exc.value.error_code is None
    assert exc.value.retryable


@pytest.mark.parametrize(("status", "retryable"), [
    (503, True), (429, True), (502, True), (504, True), (500, True),
    (400, False), (401, False), (403, False), (404, False), (409, False), (413, False)])
def test_a_failed_request_says_whether_a_retry_may_succeed(status: int,
                                                           retryable: bool) -> None:
    p, _ = producer({"reason": "why"}, status=status)
    with pytest.raises(PublishError) as exc:
        p.send(b"x")
    assert (str(exc.value), exc.value.retryable) == (f"HTTP {status}: why", retryable)


def test_a_refused_message_is_not_retryable() -> None:
    for code in (1, 2):
        p, _ = producer(failed(code, "no"))
        with pytest.raises(PublishError) as exc:
            p.send(b"x")
        assert exc.value.error_code == code and not exc.value.retryable


# ---------------------------------------------------------------- AsyncProducer


def async_producer(answer: Any, status: int = 200) -> tuple[AsyncProducer, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    async def handle(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/topics/persistent/acme/orders/new"
        seen.append(json.loads(req.content))
        return httpx.Response(status, json=answer)

    return AsyncProducer(TOPIC, producer_name="p1", admission_url="http://adm",
                         transport=httpx.MockTransport(handle)), seen


def test_threads_sharing_a_producer_get_distinct_sequence_ids() -> None:
    """One Producer used by 8 threads at once: every request carries its own sequence
    id, 0 to n-1, as one Pulsar producer shared by threads numbers its messages."""
    seen: list[int] = []
    lock = threading.Lock()

    def handle(req: httpx.Request) -> httpx.Response:
        with lock:
            seen.append(json.loads(req.content)["messages"][0]["sequenceId"])
        return httpx.Response(200, json=ok())

    p = Producer(TOPIC, producer_name="p1", admission_url="http://adm",
                 transport=httpx.MockTransport(handle))
    start = threading.Barrier(8)

    def send_many() -> None:
        start.wait()
        for _ in range(200):
            p.send(b"x")

    threads = [threading.Thread(target=send_many) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often enough to race for the id
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert sorted(seen) == list(range(1600))


def test_async_returns_the_message_id_and_sends_pulsar_fields() -> None:
    async def run() -> tuple[str, list[dict[str, Any]]]:
        p, seen = async_producer(ok())
        async with p:
            return await p.send(b"\x00hi", key="k", properties={"a": "1"},
                                deliver_after=timedelta(seconds=5)), seen

    mid, seen = asyncio.run(run())
    assert mid == "dwell.delayed:1:7"
    assert seen[0]["producerName"] == "p1"
    msg = seen[0]["messages"][0]
    assert base64.b64decode(msg["payload"]) == b"\x00hi"
    assert msg["payloadEncoding"] == "base64"
    assert (msg["key"], msg["properties"], msg["deliverAfterMs"]) == ("k", {"a": "1"}, 5000)
    assert "deliverAt" not in msg


def test_async_deliver_at_and_event_time_and_sequence_ids() -> None:
    when = datetime(2030, 1, 1, tzinfo=timezone.utc)

    async def run() -> list[dict[str, Any]]:
        p, seen = async_producer(ok())
        async with p:
            await p.send("plain", deliver_at=when, event_time=when)
            await p.send("plain", deliver_at=1_900_000_000_000)
        return seen

    seen = asyncio.run(run())
    first = seen[0]["messages"][0]
    assert first["deliverAt"] == first["eventTime"] == int(when.timestamp() * 1000)
    assert seen[1]["messages"][0]["deliverAt"] == 1_900_000_000_000
    assert first["payload"] == "plain" and "payloadEncoding" not in first
    assert [b["messages"][0]["sequenceId"] for b in seen] == [0, 1]


def test_async_both_delays_refused_before_sending() -> None:
    async def run() -> list[dict[str, Any]]:
        p, seen = async_producer(ok())
        async with p:
            with pytest.raises(ValueError, match="not both"):
                await p.send(b"x", deliver_at=1, deliver_after=1)
            # The refused message took no sequence id.
            await p.send(b"y")
        return seen

    seen = asyncio.run(run())
    assert [b["messages"][0]["sequenceId"] for b in seen] == [0]


def test_async_error_code_2_is_not_allowed_with_server_text() -> None:
    text = ("org.apache.pulsar.broker.service.BrokerServiceException$NotAllowedException: "
            "Exceeds max allowed delivery delay of 5000 milliseconds")

    async def run() -> None:
        p, _ = async_producer(failed(2, text))
        async with p:
            with pytest.raises(NotAllowedError) as exc:
                await p.send(b"x", deliver_after=60000)
        assert str(exc.value) == text and exc.value.error_code == 2

    asyncio.run(run())


def test_async_other_error_codes_http_errors_and_unreachable_are_publish_errors() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    async def run() -> None:
        p, _ = async_producer(failed(1, "boom"))
        async with p:
            with pytest.raises(PublishError) as exc:
                await p.send(b"x")
        assert not isinstance(exc.value, NotAllowedError) and exc.value.error_code == 1
        assert str(exc.value) == "boom"
        p, _ = async_producer({"reason": "Namespace acme/orders does not exist"}, status=404)
        async with p:
            with pytest.raises(PublishError,
                               match="404: Namespace acme/orders does not exist"):
                await p.send(b"x")
        async with AsyncProducer(TOPIC, admission_url="http://adm",
                                 transport=httpx.MockTransport(refuse)) as p:
            with pytest.raises(PublishError,
                               match="admission unreachable: connection refused") as exc:
                await p.send(b"x")
        assert exc.value.error_code is None

    asyncio.run(run())


def test_async_bad_topic_name_is_refused() -> None:
    with pytest.raises(ValueError, match="persistent://"):
        AsyncProducer("orders")


def test_concurrent_async_sends_take_increasing_ids_and_leave_the_loop_free() -> None:
    """100 sends from one loop: admission answers each after a pause, and all 100 wait
    for it at once (none waits for another), while a task on the same loop keeps running.
    Send i carries sequence id i: ids are taken in the order the sends were made."""
    in_flight = most = 0
    seqs: list[int] = []

    async def handle(req: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        seq = json.loads(req.content)["messages"][0]["sequenceId"]
        seqs.append(seq)
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return httpx.Response(200, json=ok(f"dwell.delayed:0:{seq}"))

    async def run() -> tuple[list[str], int]:
        ticks = 0
        done = asyncio.Event()

        async def heartbeat() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.005)

        beat = asyncio.create_task(heartbeat())
        async with AsyncProducer(TOPIC, admission_url="http://adm",
                                 transport=httpx.MockTransport(handle)) as p:
            ids = await asyncio.gather(*(p.send(f"m{i}") for i in range(100)))
        done.set()
        await beat
        return ids, ticks

    ids, ticks = asyncio.run(run())
    assert ids == [f"dwell.delayed:0:{i}" for i in range(100)]
    assert sorted(seqs) == list(range(100))
    assert most == 100
    assert ticks > 1  # the heartbeat ran while the sends waited


# A busy admission service in its own process (so that its threads do not share this
# process's interpreter lock): every publish answered after argv[1] seconds with the body
# argv[2]; it prints its port.
SLOW_ADMISSION = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(float(sys.argv[1]))
        body = sys.argv[2].encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Server(ThreadingHTTPServer):
    request_queue_size = 128  # the pool's 100 connections open at once
    daemon_threads = True

server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_sends_beyond_the_connection_pool_wait_for_a_connection() -> None:
    """600 sends of one AsyncProducer at once, over its 100 connections, to a server that
    answers each in 0.3 s, with a 1.5 s request timeout: the last ones wait at least
    1.5 s for their turn, and none fails for that wait (each request, once sent, is
    answered in time). Producer takes its timeouts from the same place (``_timeout``)."""
    server = subprocess.Popen(
        [sys.executable, "-c", SLOW_ADMISSION, "0.3", json.dumps(ok("dwell.delayed:0:1"))],
        stdout=subprocess.PIPE, text=True)
    n = 600
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"

        async def run() -> list[str]:
            async with AsyncProducer(TOPIC, admission_url=url, timeout_s=1.5) as p:
                return await asyncio.gather(*(p.send(b"m") for _ in range(n)))

        started = time.monotonic()
        ids = asyncio.run(run())
        took = time.monotonic() - started
    finally:
        server.kill()
        server.wait(10)
    assert ids == ["dwell.delayed:0:1"] * n
    assert took > 1.5, took  # the last sends waited longer than the request timeout


def held_sends(n: int, **options: Any) -> tuple[list[str | BaseException], list[int],
                                                list[int]]:
    """``n`` sends of one AsyncProducer at once to an admission that answers none until the
    pool's connections all carry a request: each send's id or error, the sends that had
    ended by then, and the sequence ids admission saw (the last one a send made after
    the answers)."""
    seqs: list[int] = []

    async def run() -> tuple[list[str | BaseException], list[int]]:
        # Made in the running loop: on Python 3.9 an asyncio.Event binds to the loop
        # current when it is made.
        full, answer = asyncio.Event(), asyncio.Event()

        async def handle(req: httpx.Request) -> httpx.Response:
            seq = json.loads(req.content)["messages"][0]["sequenceId"]
            seqs.append(seq)
            if len(seqs) == min(n, MAX_CONNECTIONS):
                full.set()
            await answer.wait()
            return httpx.Response(200, json=ok(f"dwell.delayed:0:{seq}"))

        async with AsyncProducer(TOPIC, admission_url="http://adm",
                                 transport=httpx.MockTransport(handle), **options) as p:
            sends = [asyncio.ensure_future(p.send(f"m{i}")) for i in range(n)]
            await asyncio.wait_for(full.wait(), 10)
            ended = [i for i, t in enumerate(sends) if t.done()]
            answer.set()
            results = await asyncio.gather(*sends, return_exceptions=True)
            await p.send("after")
        return results, ended

    results, ended = asyncio.run(run())
    return results, ended, seqs


@pytest.mark.parametrize(("options", "sends", "accepted"), [
    ({"max_pending_messages": 150}, 200, 150),
    ({}, 1200, 1000),
    ({"max_pending_messages": 0}, 1500, 1500),
])
def test_async_sends_beyond_max_pending_messages_fail_at_once(
        options: dict[str, int], sends: int, accepted: int) -> None:
    """Pulsar's maxPendingMessages with blockIfQueueFull off: while ``accepted`` sends wait
    for admission's answer, the next ones fail at once with ProducerQueueIsFullError
    (retryable) and take no sequence id; the answered sends free their places. 1000
    by default; 0 is no limit."""
    results, ended, seqs = held_sends(sends, **options)
    assert ended == list(range(accepted, sends))  # refused without waiting for an answer
    assert results[:accepted] == [f"dwell.delayed:0:{i}" for i in range(accepted)]
    refused = results[accepted:]
    assert len(refused) == sends - accepted
    for exc in refused:
        assert isinstance(exc, ProducerQueueIsFullError) and isinstance(exc, PublishError)
        assert exc.retryable and exc.error_code is None
        assert str(exc).startswith("Producer send queue is full")
    assert sorted(seqs) == list(range(accepted + 1)) and seqs[-1] == accepted


def test_async_max_pending_messages_below_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="max_pending_messages"):
        AsyncProducer(TOPIC, max_pending_messages=-1)


def test_sends_beyond_max_pending_messages_fail_before_admission_answers() -> None:
    """Over real connections to a server that answers each publish in 0.3 s: with
    max_pending_messages=150, 200 sends at once give 150 ids, and the other 50 fail
    before the first answer comes."""
    server = subprocess.Popen(
        [sys.executable, "-c", SLOW_ADMISSION, "0.3", json.dumps(ok("dwell.delayed:0:1"))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"

        async def run() -> tuple[list[str | BaseException], list[float]]:
            failed_after: list[float] = []
            started = time.monotonic()

            async def send(p: AsyncProducer) -> str:
                try:
                    return await p.send(b"m")
                except ProducerQueueIsFullError:
                    failed_after.append(time.monotonic() - started)
                    raise

            async with AsyncProducer(TOPIC, admission_url=url,
                                     max_pending_messages=150) as p:
                results = await asyncio.gather(*(send(p) for _ in range(200)),
                                               return_exceptions=True)
            return results, failed_after

        results, failed_after = asyncio.run(run())
    finally:
        server.kill()
        server.wait(10)
    assert results[:150] == ["dwell.delayed:0:1"] * 150
    assert all(isinstance(r, ProducerQueueIsFullError) for r in results[150:])
    assert len(failed_after) == 50 and max(failed_after) < 0.3, failed_after


def canceller(status: int, body: Any, paths: list[str]) -> Producer:
    def handle(req: httpx.Request) -> httpx.Response:
        assert req.method == "DELETE"
        paths.append(req.url.raw_path.decode())
        return httpx.Response(status, json=body)

    return Producer(TOPIC, admission_url="http://adm", transport=httpx.MockTransport(handle))


@pytest.mark.parametrize(("status", "result"), [(200, "cancelled"), (404, "not_found"),
                                                (409, "too_late")])
def test_cancel_returns_each_answer(status: int, result: str) -> None:
    paths: list[str] = []
    mid = "dwell.delayed:1:7"
    with canceller(status, {"messageId": mid, "result": result, "reason": "r"}, paths) as p:
        answer = p.cancel(mid)
        assert answer == result and answer is CancelResult(result)
        assert isinstance(answer, str)

    async def run() -> str:
        async with AsyncProducer(TOPIC, admission_url="http://adm",
                                 transport=httpx.MockTransport(lambda req: httpx.Response(
                                     status, json={"result": result}))) as ap:
            return await ap.cancel(mid)

    assert asyncio.run(run()) == result
    assert paths == ["/topics/persistent/acme/orders/new/messages/dwell.delayed:1:7"]


@pytest.mark.parametrize(("status", "body", "retryable"), [
    (503, {"messageId": "x", "result": "busy", "reason": "the index has not reached it"}, True),
    (503, {"reason": "tracker unreachable: boom"}, True),
    (400, {"reason": "messageId: invalid message id 'x'"}, False),
    (403, {"reason": "Unauthorized"}, False),
    # An answer that does not fit its status is not taken for a result.
    (200, {"result": "too_late"}, False),
    (500, ["not", "an", "object"], True),
])
def test_cancel_raises_when_it_could_not_be_decided(status: int, body: Any,
                                                    retryable: bool) -> None:
    with canceller(status, body, []) as p, pytest.raises(PublishError) as err:
        p.cancel("x")
    assert str(err.value).startswith(f"HTTP {status}: ")
    assert err.value.retryable is retryable


def test_a_message_id_is_sent_as_one_path_segment() -> None:
    paths: list[str] = []
    with canceller(404, {"result": "not_found"}, paths) as p:
        assert p.cancel("a/b?c#d:1:2") == "not_found"
    assert paths == ["/topics/persistent/acme/orders/new/messages/a%2Fb%3Fc%23d:1:2"]
