"""Cancelling a pending delayed message through the tracker's API, on real Redis and
Kafka: each answer, the race with a drain's claim (a claim frozen as the crash tests
freeze one), a retried request, a forged or foreign messageId, and the cancel surviving
a rebuild of the index from the delay log.

Replacing one by its schedule key: the tracker's ingest applies each record with a key
in log order (a newer message cancels the pending one, a release cancels it and
schedules nothing), waits out a re-filing round that holds the old message's bucket,
leaves a due one to be delivered, records each replacement as a cancel mark, and gets
the same index back after Redis lost it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from dwell import keys
from dwell.adapters.kafka import (
    Columns,
    KafkaUnavailable,
    Producer,
    end_offsets,
    ensure_topic,
    read_all,
)
from dwell.adapters.redis import connect
from dwell.client import AsyncProducer, CancelResult, PublishError
from dwell.client import Producer as SdkProducer
from dwell.core import topics as names
from dwell.core.positions import format_message_id
from dwell.core.topics import TopicName
from dwell.index.roaring import decode
from dwell.index.topic import Replaced, TopicIndex
from dwell.tracker import recovery
from dwell.tracker.ingest import Ingest
from dwell_dev.testkit import (
    configure_topic,
    read_results,
    topic_config,
    wait_for,
    wait_ingress,
)

pytestmark = pytest.mark.integration
TICK = 1000
DWELL_ADMIN = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "dwell-admin"


def _env(delayed_topic: str, group: str | None = None) -> dict[str, str]:
    return {"DWELL_DELAYED_TOPIC": delayed_topic, "DWELL_RESTAGE_ENABLED": "false",
            "DWELL_TRACKER_GROUP_ID": group or "dwell-tracker-" + uuid.uuid4().hex[:8],
            "DWELL_CANCEL_WAIT_MS": "1000"}


def _send(p: Producer, delayed_topic: str, topic: str, deliver_at: int) -> str:
    part, off = p.send(delayed_topic, b"x", topic, {
        "dwell-deliver-at": str(deliver_at), "dwell-tick-time": str(TICK),
        "dwell-topic": topic}).result(10)
    return format_message_id(delayed_topic, part, off)


@pytest.fixture()
def delayed_topic(kafka_bootstrap: str, unique: str) -> str:
    name = f"test.delayed.{unique}"
    ensure_topic(kafka_bootstrap, name, 4)
    return name


def _pending(r, topic: str) -> int:
    idx = TopicIndex(r, topic)
    return sum(len(bm) for b in idx.buckets() for bm in idx.read_bucket(b).values())


def test_each_answer_of_a_cancel(services, redis_url, kafka_bootstrap, unique, delayed_topic):
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    other = f"persistent://{unique}/ns/y"
    now = int(time.time() * 1000)
    p = Producer(kafka_bootstrap, linger_ms=0)
    later, later2, claimed, past = (_send(p, delayed_topic, topic, now + d)
                                    for d in (600_000, 600_000, 300_000, -5000))
    foreign = _send(p, delayed_topic, other, now + 600_000)
    p.close()
    svc = services.start("tracker", env=_env(delayed_topic))
    base = f"/v1/topics/persistent/{unique}/ns/x/messages"
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        wait_for(lambda: _pending(r, topic) == 4, 60, "the topic's four messages indexed",
                 interval=0.1)

        def cancel(mid: str) -> tuple[int, str]:
            resp = http.delete(f"{base}/{mid}")
            body = resp.json()
            result = body.get("result", body.get("reason"))
            return resp.status_code, "delivered" if body.get("delivered") else result

        assert cancel(later) == (200, "cancelled")
        assert cancel(later) == (200, "cancelled")  # a retried request
        # Due (nothing drains in this test, so the bucket is still held): being delivered.
        assert cancel(past) == (409, "too_late")
        # Another topic's message, an offset with no record, an immediate message's id.
        assert cancel(foreign) == (404, "not_found")
        part = int(later.rsplit(":", 2)[1])
        assert cancel(format_message_id(delayed_topic, part, 10**9)) == (404, "not_found")
        assert cancel(format_message_id("x.ns.nope", 0, 1)) == (404, "not_found")
        # A partition the delay log does not have, an offset past any Kafka keeps.
        assert cancel(format_message_id(delayed_topic, 99, 0)) == (404, "not_found")
        assert cancel(format_message_id(delayed_topic, 0, 2**63 - 1)) == (404, "not_found")
        assert cancel(format_message_id(delayed_topic, 0, 2**64)) == (404, "not_found")
        ready = TopicName.parse(topic).kafka_topic
        assert cancel(format_message_id(ready, 0, 3)) == (404, "delivered")
        for bad in ("nope", "a:b:c", f"{delayed_topic}:-1:2", f"{delayed_topic}:0: 2"):
            resp = http.delete(f"{base}/{bad}")
            assert resp.status_code == 400, bad
            assert resp.json()["reason"].startswith("messageId: "), resp.json()
        # A drain round frozen at its claim of a bucket that is due: too late. The same
        # claim while the bucket is not due (a re-filing round): busy, retry.
        idx = TopicIndex(r, topic)
        bucket = [b for b in idx.buckets() if now + 200_000 < b < now + 400_000][0]
        held = idx.claim_between(bucket, bucket, int(time.time() * 1000), 10, 60_000)
        assert [c.bucket_start for c in held] == [bucket]
        resp = http.delete(f"{base}/{claimed}")
        assert (resp.status_code, resp.json()["result"]) == (503, "busy")
        assert resp.headers["retry-after"] == "1"
        # A re-filing round completes its claim once the copies are written: the message
        # is pending as a copy, and the cancel goes to the copy (matched by origin).
        assert idx.complete(bucket, held[0].lease_id)
        assert cancel(claimed) == (200, "cancelled")
        assert idx.cancellations() == 2
        due = [b for b in idx.buckets() if b < now][0]
        held = idx.claim_between(due, due, int(time.time() * 1000), 10, 60_000)
        assert cancel(past) == (409, "too_late")
        assert idx.complete(due, held[0].lease_id)
        assert cancel(past) == (404, "delivered")
        assert cancel(later2) == (200, "cancelled")
        metrics = http.get("/metrics").text
        assert 'dwell_tracker_cancel_requests_total{answer="cancelled"} 4.0' in metrics
    svc.stop()


def test_a_cancel_survives_the_loss_of_the_index(services, redis_url, kafka_bootstrap, unique,
                                                 delayed_topic):
    """The cancel is marked on dwell.delivered: a tracker that rebuilds the topic's index
    after Redis lost it (its keys and how far the ingest got) does not index the
    message again, and puts the cancellation back before it indexes anything (a
    re-filed copy would be at another position)."""
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    now = int(time.time() * 1000)
    p = Producer(kafka_bootstrap, linger_ms=0)
    ids = [_send(p, delayed_topic, topic, now + 600_000 + i * TICK) for i in range(3)]
    p.close()
    env = _env(delayed_topic)
    svc = services.start("tracker", env=env)
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        wait_for(lambda: _pending(r, topic) == 3, 60, "indexed", interval=0.1)
        resp = http.delete(f"/v1/topics/persistent/{unique}/ns/x/messages/{ids[1]}")
        assert resp.status_code == 200, resp.text
    svc.stop()
    marks = [json.loads(m.value) for m in read_all(kafka_bootstrap, names.DELIVERED)
             if m.key == topic.encode()]
    part, off = (int(x) for x in ids[1].split(":")[1:])
    assert [(m["cancelled"], m["log"], m["bucket"]) for m in marks] == [
        (True, delayed_topic, (now + 600_000 + TICK) // TICK * TICK)]
    assert decode(base64.b64decode(marks[0]["fields"][str(part)])).to_array().tolist() == [off]
    idx = TopicIndex(r, topic)
    member = f"{part}:{off}".encode()
    assert r.zrange(idx.keys.cancelled, 0, -1) == [member]
    for k in list(r.scan_iter(match=f"dwell:*{{{topic}}}*")):
        r.delete(k)
    r.hdel(keys.INGESTED, *[str(q) for q in range(4)])
    svc = services.start("tracker", env=env)
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        wait_for(lambda: _pending(r, topic) == 2 and idx.cancellations() == 1, 60,
                 "the index rebuilt without the message, its cancellation back",
                 interval=0.1)
        assert r.zrange(idx.keys.cancelled, 0, -1) == [member]
        restored = [row for row in http.get("/metrics").text.splitlines()
                    if row.startswith("dwell_tracker_cancels_restored_total ")]
        assert restored and float(restored[0].split()[1]) >= 1
    svc.stop()


def test_a_cancel_while_redis_is_down_and_after_it_came_back_empty(
        services, own_redis, kafka_bootstrap, unique, delayed_topic):
    """Redis unreachable: a cancel answers 503 (retry), nothing is decided. Redis back
    with nothing in it: the tracker rebuilds the index from Kafka, the message cancelled
    before stays cancelled (its mark), and the one refused meanwhile can be cancelled."""
    topic = f"persistent://{unique}/ns/x"
    now = int(time.time() * 1000)
    p = Producer(kafka_bootstrap, linger_ms=0)
    first, second = (_send(p, delayed_topic, topic, now + 600_000 + i * TICK)
                     for i in range(2))
    p.close()
    svc = services.start("tracker", env=_env(delayed_topic) | {
        "DWELL_REDIS_URL": own_redis.url})
    r = connect(own_redis.url)
    base = f"/v1/topics/persistent/{unique}/ns/x/messages"
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        wait_for(lambda: _pending(r, topic) == 2, 60, "indexed", interval=0.1)
        assert http.delete(f"{base}/{first}").json()["result"] == "cancelled"
        own_redis.kill()
        for message_id in (first, second):
            down = http.delete(f"{base}/{message_id}")
            assert down.status_code == 503 and down.headers["retry-after"], down.text
            assert down.json()["reason"].startswith("Redis: "), down.text
        own_redis.start()  # empty
        answers: dict[str, str] = {}

        def decided() -> bool:
            for message_id in (first, second):
                resp = http.delete(f"{base}/{message_id}")
                if resp.status_code != 503:
                    answers[message_id] = resp.json()["result"]
            return len(answers) == 2

        wait_for(decided, 90, "the index rebuilt and both answered", interval=0.5)
        assert answers == {first: "cancelled", second: "cancelled"}
        idx = TopicIndex(r, topic)
        assert sorted(r.zrange(idx.keys.cancelled, 0, -1)) == [_member(first),
                                                              _member(second)]
        # The first was not indexed again (its mark); the second keeps its position,
        # among the cancelled ones, until the drain passes its bucket.
        assert _pending(r, topic) == 1
    svc.stop()


def test_cancel_marks_kafka_refuses(services, redis_url, kafka_bootstrap, unique,
                                    delayed_topic):
    """Kafka refuses the cancel marks (dwell.delivered's max.message.bytes set below their
    size, as an operator might): a cancel request is answered 503, retry, and is cancelled
    once Kafka takes its mark; a replacement by schedule key holds its batch back (the
    ingest cancels nothing and records no progress past it) until then."""
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    idx = TopicIndex(r, topic)
    now = int(time.time() * 1000)
    p = Producer(kafka_bootstrap, linger_ms=0)
    plain = _send(p, delayed_topic, topic, now + 600_000)
    older = _send_keyed(p, delayed_topic, topic, now + 600_000, "k")
    svc = services.start("tracker", env=_env(delayed_topic))
    wait_for(lambda: _pending(r, topic) == 2, 60, "indexed", interval=0.1)
    limit = topic_config(kafka_bootstrap, names.DELIVERED)["max.message.bytes"]
    url = f"/v1/topics/persistent/{unique}/ns/x/messages/{plain}"
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        configure_topic(kafka_bootstrap, names.DELIVERED, {"max.message.bytes": "16"})
        try:
            refused = http.delete(url)
            assert refused.status_code == 503 and refused.headers["retry-after"], \
                refused.text
            assert "did not take the cancel mark" in refused.json()["reason"], refused.text
            newer = _send_keyed(p, delayed_topic, topic, now + 700_000, "k")
            part, offset = (int(x) for x in _member(newer).split(b":"))
            time.sleep(3.0)  # the ingest has read the record, and tried its mark
            assert _member(older) not in r.zrange(idx.keys.cancelled, 0, -1)
            assert r.hget(idx.keys.scheduled, b"k") == b"%d %s" % (
                (now + 600_000) // TICK * TICK, _member(older))
            assert int(r.hget(keys.INGESTED, str(part)) or 0) <= offset
        finally:
            configure_topic(kafka_bootstrap, names.DELIVERED, {"max.message.bytes": limit})
        wait_for(lambda: r.hget(idx.keys.scheduled, b"k") == b"%d %s" % (
            (now + 700_000) // TICK * TICK, _member(newer)), 60,
            "the replacement applied once Kafka took its mark", interval=0.2)
        assert int(r.hget(keys.INGESTED, str(part))) > offset
        again = http.delete(url)
        assert again.status_code == 200 and again.json()["result"] == "cancelled", \
            again.text
    svc.stop()
    p.close()
    assert sorted(r.zrange(idx.keys.cancelled, 0, -1)) == sorted(
        [_member(plain), _member(older)])
    marked = {member for m in read_all(kafka_bootstrap, names.DELIVERED)
              if m.key == topic.encode() and json.loads(m.value).get("cancelled")
              for member in (f"{f}:{o}" for f, o in _offsets(json.loads(m.value)))}
    assert marked == {_member(plain).decode(), _member(older).decode()}


def _tracker_and_admission(services, kafka_bootstrap: str, tenant: str):  # type: ignore[no-untyped-def]
    """A policy service with namespace ``<tenant>/ns``, a tracker on `dwell.delayed` and an
    admission that hands cancels to it, its Kafka ingress in a group of its own that
    starts at the end of `dwell.publish`."""
    policy = services.start("policy")
    with httpx.Client(base_url=policy.url, timeout=10) as http:
        assert http.put(f"/admin/v2/tenants/{tenant}", json={}).status_code in (200, 204)
        assert http.put(f"/admin/v2/namespaces/{tenant}/ns", json={}).status_code in (200, 204)
    env = _env(names.DELAYED)
    # dwell.delayed is shared with every other test: this group starts at its end.
    recovery.start_group_at_end(kafka_bootstrap, env["DWELL_TRACKER_GROUP_ID"],
                                [names.DELAYED, names.REFILED])
    tracker = services.start("tracker", env=env)
    return tracker, services.start("admission", env=_own_ingress(tracker.url))


def _own_ingress(tracker_url: str) -> dict[str, str]:
    return {"DWELL_TRACKER_URL": tracker_url,
            "DWELL_INGRESS_GROUP": f"dwell-admission-{uuid.uuid4().hex[:8]}",
            "DWELL_INGRESS_OFFSET_RESET": "latest"}


def test_the_sdk_and_dwell_admin_cancel_through_admission(services, redis_url,
                                                           kafka_bootstrap, unique):
    """Producer.cancel, AsyncProducer.cancel and `dwell-admin messages cancel` go to
    admission, which hands the cancel to the tracker; nothing of it is delivered."""
    r = connect(redis_url)
    tracker, admission = _tracker_and_admission(services, kafka_bootstrap, unique)
    topic = f"persistent://{unique}/ns/x"
    with SdkProducer(topic, admission_url=admission.url) as producer:
        ids = [producer.send(f"m{i}", deliver_after=600_000) for i in range(3)]
        now_id = producer.send("now")
        assert producer.cancel(ids[0]) is CancelResult.CANCELLED
        assert producer.cancel(ids[0]) == "cancelled"
        assert producer.cancel(now_id) is CancelResult.NOT_FOUND
        assert producer.cancel(f"{names.DELAYED}:0:{2**62}") == "not_found"
        with pytest.raises(PublishError, match="HTTP 400: messageId: invalid message id"):
            producer.cancel("nope")

    async def cancel_async() -> str:
        async with AsyncProducer(topic, admission_url=admission.url) as p:
            return await p.cancel(ids[1])

    assert asyncio.run(cancel_async()) == "cancelled"
    env_cli = dict(os.environ) | {"DWELL_ADMISSION_URL": admission.url}
    done = subprocess.run([str(DWELL_ADMIN), "-o", "json", "messages", "cancel", topic, ids[2]],
                          env=env_cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"messageId": ids[2], "result": "cancelled",
                                       "delivered": False}
    again = subprocess.run([str(DWELL_ADMIN), "messages", "cancel", topic, now_id],
                           env=env_cli, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1
    assert " ".join(again.stdout.split()) == (
        f"not_found: message {now_id} was published without a delay and delivered at once")
    idx = TopicIndex(r, topic)
    assert idx.cancellations() == 3
    with httpx.Client(base_url=tracker.url, timeout=30) as http:
        stats = http.get(f"/v1/topics/persistent/{unique}/ns/x/stats").json()
    assert (stats["delayedMessages"], stats["cancelledMessages"]) == (0, 3)
    # Admission with no tracker to ask: 503, retryable.
    admission.stop()
    lonely = services.start("admission", env=_own_ingress("http://127.0.0.1:9"))
    with SdkProducer(topic, admission_url=lonely.url) as producer, \
            pytest.raises(PublishError, match="HTTP 503: tracker unreachable") as err:
        producer.cancel(ids[0])
    assert err.value.retryable


def test_a_cancel_request_on_dwell_publish(services, redis_url, kafka_bootstrap, unique):
    """`{"topic", "producerName", "cancel": [...]}` on dwell.publish: one result per id on
    dwell.publish.results, in order, each the tracker's answer (or why there is none); a
    request that both publishes and cancels is refused whole; with no tracker to ask, each
    id is answered retriable."""
    tracker, admission = _tracker_and_admission(services, kafka_bootstrap, unique)
    wait_ingress(admission.url)
    topic = f"persistent://{unique}/ns/x"
    with SdkProducer(topic, admission_url=admission.url) as producer:
        a, b = (producer.send(f"m{i}", deliver_after=600_000) for i in range(2))
        now_id = producer.send("now")
    never = f"{names.DELAYED}:0:{2**62}"
    name = f"prod-{unique}"
    requests = [  # (value, its results' errorCode and answer, or errorMsg)
        {"topic": topic, "producerName": name,
         "cancel": [a, a, now_id, "nope", never, "x" * 1000 + ":0:0"]},
        {"topic": topic, "producerName": name, "cancel": [b], "messages": []},
        {"producerName": name, "cancel": [b]},  # the topic from the record's key
    ]
    ends = end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    p = Producer(kafka_bootstrap, linger_ms=0)
    sent = [p.send(names.PUBLISH, json.dumps(v).encode(), topic).result(15) for v in requests]
    p.close()
    got = read_results(kafka_bootstrap, ends, name, 8)
    by_request: dict[str, list[dict]] = {}
    for res in got:
        by_request.setdefault(res["requestId"], []).append(res)
    first, whole, third = (by_request[f"{names.PUBLISH}:{part}:{off}"] for part, off in sent)
    assert [(r["index"], r["messageId"], r["errorCode"], r.get("result"))
            for r in first] == [(0, a, 0, "cancelled"), (1, a, 0, "cancelled"),
                                (2, now_id, 0, "not_found"), (3, "nope", 2, None),
                                (4, never, 0, "not_found"), (5, "x" * 1000 + ":0:0", 2, None)]
    assert first[2]["delivered"] and "without a delay" in first[2]["reason"]
    assert "invalid message id" in first[3]["errorMsg"]
    assert first[5]["errorMsg"] == "messageId: 1004 characters; a message id has at most 280"
    assert all(r["topic"] == topic and r["sequenceId"] is None for r in first)
    assert [(r["errorCode"], r["index"])
            for r in whole] == [(2, None)], whole
    assert "either publishes (messages) or cancels" in whole[0]["errorMsg"]
    assert [(r["messageId"], r["result"]) for r in third] == [(b, "cancelled")]
    with httpx.Client(base_url=tracker.url, timeout=30) as http:
        stats = http.get(f"/v1/topics/persistent/{unique}/ns/x/stats").json()
    assert (stats["delayedMessages"], stats["cancelledMessages"]) == (0, 2)
    # No tracker to ask: answered retriable, and the ingress goes on.
    admission.stop()
    lonely = services.start("admission", env=_own_ingress("http://127.0.0.1:9"))
    wait_ingress(lonely.url)
    ends = end_offsets(kafka_bootstrap, names.PUBLISH_RESULTS)
    p = Producer(kafka_bootstrap, linger_ms=0)
    p.send(names.PUBLISH, json.dumps({"topic": topic, "producerName": name,
                                      "cancel": [a]}).encode(), topic).result(15)
    p.close()
    (res,) = read_results(kafka_bootstrap, ends, name, 1)
    assert (res["messageId"], res["errorCode"]) == (a, 1), res
    assert res["errorMsg"].startswith("tracker unreachable"), res


def test_the_sweep_drops_only_cancellations_of_buckets_long_gone(redis_url, unique):
    """A rebuild puts back every cancellation it finds, delivered ones too: the sweep
    drops those whose bucket is past its cutoff and holds nothing, live or claimed."""
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    idx = TopicIndex(r, topic)
    idx.add([(0, 1, 5_000, TICK), (0, 2, 7_000, TICK)])  # buckets 5000 and 7000 live
    held = idx.claim_between(7_000, 7_000, int(time.time() * 1000), 10, 60_000)
    assert [c.bucket_start for c in held] == [7_000]
    r.zadd(idx.keys.cancelled, {b"0:1": 5_000, b"0:2": 7_000, b"0:3": 6_000,
                                b"0:4": 9_000})
    assert idx.sweep_cancelled(8_000) == 1  # 6000: nothing there any more
    assert sorted(r.zrange(idx.keys.cancelled, 0, -1)) == [b"0:1", b"0:2", b"0:4"]
    assert idx.complete(7_000, held[0].lease_id)
    assert idx.sweep_cancelled(10_000) == 2  # 7000 completed, 9000 empty
    assert r.zrange(idx.keys.cancelled, 0, -1) == [b"0:1"]


def _send_keyed(p: Producer, delayed_topic: str, topic: str, deliver_at: int | None,
          key: str) -> str:
    """A delay-log record with schedule key ``key``; a release when ``deliver_at`` is
    None."""
    headers = {"dwell-topic": topic, "dwell-schedule-key": key}
    if deliver_at is not None:
        headers |= {"dwell-deliver-at": str(deliver_at), "dwell-tick-time": str(TICK)}
    part, off = p.send(delayed_topic, b"x" if deliver_at else b"", topic,
                       headers).result(10)
    return format_message_id(delayed_topic, part, off)


def _member(message_id: str) -> bytes:
    return ":".join(message_id.rsplit(":", 2)[1:]).encode()


def test_a_schedule_key_replaces_the_pending_message(services, redis_url, kafka_bootstrap,
                                                      unique, delayed_topic):
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    idx = TopicIndex(r, topic)
    now = int(time.time() * 1000)
    p = Producer(kafka_bootstrap, linger_ms=0)
    first = _send_keyed(p, delayed_topic, topic, now + 600_000, "k")
    due = _send_keyed(p, delayed_topic, topic, now - 5_000, "late")
    held = _send_keyed(p, delayed_topic, topic, now + 300_000, "busy")
    # A key admission would refuse, written to the delay log directly: not a key.
    _send_keyed(p, delayed_topic, topic, now + 600_000, "x" * 257)
    env = _env(delayed_topic)
    svc = services.start("tracker", env=env)
    wait_for(lambda: _pending(r, topic) == 4, 60, "four messages indexed", interval=0.1)
    second = _send_keyed(p, delayed_topic, topic, now + 400_000, "k")
    # A key with no pending message simply schedules; a release of it cancels it.
    lone = _send_keyed(p, delayed_topic, topic, now + 500_000, "j")
    release = _send_keyed(p, delayed_topic, topic, None, "j")
    # The due message is being delivered: its replacement is scheduled as well.
    after_due = _send_keyed(p, delayed_topic, topic, now + 600_000, "late")
    wait_for(lambda: _pending(r, topic) == 7, 60, "the new messages indexed", interval=0.1)
    assert sorted(r.zrange(idx.keys.cancelled, 0, -1)) == sorted([_member(first),
                                                                 _member(lone)])
    assert r.hgetall(idx.keys.scheduled) == {
        b"k": b"%d %s" % ((now + 400_000) // TICK * TICK, _member(second)),
        b"late": b"%d %s" % ((now + 600_000) // TICK * TICK, _member(after_due)),
        b"busy": b"%d %s" % ((now + 300_000) // TICK * TICK, _member(held))}
    assert _member(release) not in r.zrange(idx.keys.cancelled, 0, -1)
    assert _member(due) not in r.zrange(idx.keys.cancelled, 0, -1)
    # A re-filing round holds the old message's bucket: the replacement waits for it.
    bucket = (now + 300_000) // TICK * TICK
    claim = idx.claim_between(bucket, bucket, int(time.time() * 1000), 10, 60_000)
    assert [c.bucket_start for c in claim] == [bucket]
    newer = _send_keyed(p, delayed_topic, topic, now + 700_000, "busy")
    time.sleep(1.0)
    assert _member(held) not in r.zrange(idx.keys.cancelled, 0, -1)
    assert idx.complete(bucket, claim[0].lease_id)
    wait_for(lambda: _member(held) in r.zrange(idx.keys.cancelled, 0, -1), 30,
             "the replacement applied once the round let go", interval=0.1)
    p.close()
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        wait_for(lambda: http.get(f"/v1/topics/persistent/{unique}/ns/x/stats").json()
                 ["replacedMessages"] == 3, 30, "the stats refreshed", interval=0.2)
        stats = http.get(f"/v1/topics/persistent/{unique}/ns/x/stats").json()
        assert (stats["cancelledMessages"], stats["scheduleKeys"]) == (3, 3)
        metrics = http.get("/metrics").text
        assert (f'dwell_tracker_replaced_messages_total{{topic="{topic}"}} 3.0'
                in metrics), [m for m in metrics.splitlines() if "replaced" in m]
    svc.stop()
    marks = [json.loads(m.value) for m in read_all(kafka_bootstrap, names.DELIVERED)
             if m.key == topic.encode()]
    marked = {(m["bucket"], f"{f}:{o}") for m in marks if m.get("cancelled")
              for f, o in _offsets(m)}
    assert {member for _, member in marked} >= {_member(x).decode()
                                                for x in (first, lone, held)}
    # Redis loses the topic's index and how far the ingest got: the rebuild puts the
    # cancellations back from the marks and applies the keys again, to the same end.
    for k in list(r.scan_iter(match=f"dwell:*{{{topic}}}*")):
        r.delete(k)
    r.hdel(keys.INGESTED, *[str(q) for q in range(4)])
    svc = services.start("tracker", env=env)
    wait_for(lambda: r.hlen(idx.keys.scheduled) == 3 and idx.cancellations() == 3, 60,
             "the keys and cancellations back", interval=0.1)
    wait_for(lambda: _pending(r, topic) == 5, 60, "the index rebuilt", interval=0.1)
    assert sorted(r.zrange(idx.keys.cancelled, 0, -1)) == sorted(
        _member(x) for x in (first, lone, held))
    assert r.hget(idx.keys.scheduled, b"busy") == b"%d %s" % (
        (now + 700_000) // TICK * TICK, _member(newer))
    svc.stop()


def test_many_keyed_records_in_one_batch(services, redis_url, kafka_bootstrap, unique,
                                         delayed_topic):
    """More keyed records of a topic in one batch than one script applies: they go in
    runs, in log order, to the same end."""
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    idx = TopicIndex(r, topic)
    now = int(time.time() * 1000)
    p = Producer(kafka_bootstrap, linger_ms=20)
    keys_n = 1500
    sent = [p.send(delayed_topic, b"x", topic, {
        "dwell-topic": topic, "dwell-schedule-key": f"k{i % keys_n}",
        "dwell-deliver-at": str(now + 600_000 + i * 1000), "dwell-tick-time": str(TICK)})
        for i in range(2 * keys_n)]
    ids = [format_message_id(delayed_topic, *f.result(30)) for f in sent]
    p.close()
    svc = services.start("tracker", env=_env(delayed_topic))
    wait_for(lambda: _pending(r, topic) == 2 * keys_n, 60, "every record indexed",
             interval=0.2)
    assert sorted(r.zrange(idx.keys.cancelled, 0, -1)) == sorted(
        _member(m) for m in ids[:keys_n])
    assert r.hlen(idx.keys.scheduled) == keys_n
    assert r.hget(idx.keys.scheduled, b"k0").endswith(b" " + _member(ids[keys_n]))
    svc.stop()


def test_a_replacement_is_marked_in_kafka_before_it_cancels(redis_url, unique):
    """The ingest asks what a run of keyed records would cancel (a dry run that changes
    nothing), records those cancel marks, and only then applies the run: when the marks
    are not taken, or the process dies right after they were, nothing is cancelled yet;
    the batch read again cancels, and every cancellation has its mark."""
    r = connect(redis_url)
    topic = f"persistent://{unique}/ns/x"
    idx = TopicIndex(r, topic)
    now = int(time.time() * 1000)
    older = (now + 600_000) // TICK * TICK
    newer = (now + 700_000) // TICK * TICK

    def batch(offsets: list[int], due: list[int]) -> Columns:
        return Columns([0] * len(offsets), offsets, [topic.encode()] * len(offsets),
                       [[b"%d" % t for t in due], [b"%d" % TICK] * len(offsets),
                        [b"k"] * len(offsets)])

    marked: list[list[bytes]] = []

    def refused(marks: list) -> None:
        raise KafkaUnavailable("the marks were not taken")

    def dies_after_writing(marks: list) -> None:
        marked.append([m[1] for m in marks])
        raise KafkaUnavailable("the process died after the marks were written")

    Ingest(r, "test.delayed", record_marks=refused).index_batch(batch([10], [older]))
    assert r.hget(idx.keys.scheduled, b"k") == b"%d 0:10" % older
    before = r.hgetall(idx.keys.scheduled)
    assert idx.replace([(b"k", newer, 0, 11)], now, dry_run=True) == [
        Replaced(1, b"%d" % older, b"0:10")]
    assert r.hgetall(idx.keys.scheduled) == before and idx.replaced() == 0
    for record_marks in (refused, dies_after_writing):
        with pytest.raises(KafkaUnavailable):
            Ingest(r, "test.delayed", record_marks=record_marks).index_batch(
                batch([11], [newer]))
        assert idx.cancellations() == 0 and r.hgetall(idx.keys.scheduled) == before
    assert len(marked) == 1 and json.loads(marked[0][0])["cancelled"]

    def takes(marks: list) -> None:
        marked.append([m[1] for m in marks])

    Ingest(r, "test.delayed", record_marks=takes).index_batch(batch([11], [newer]))
    assert r.zrange(idx.keys.cancelled, 0, -1) == [b"0:10"] and idx.replaced() == 1
    assert r.hget(idx.keys.scheduled, b"k") == b"%d 0:11" % newer
    assert marked[1] == marked[0]
    # Read once more (a crash before the batch's progress): nothing new to mark.
    Ingest(r, "test.delayed", record_marks=takes).index_batch(batch([11], [newer]))
    assert len(marked) == 2 and idx.replaced() == 1


def _offsets(mark: dict) -> list[tuple[str, int]]:
    return [(f, o) for f, blob in mark["fields"].items()
            for o in decode(base64.b64decode(blob)).to_array().tolist()]


def test_a_replayed_record_changes_nothing_and_an_older_one_is_the_cancelled_one(
        redis_url, unique):
    """The ingest re-reads a batch after a crash: a record the key already points to
    changes nothing, and one older than it (its own replacement came first) is the one
    cancelled; a release older than the key's message leaves it alone."""
    r = connect(redis_url)
    idx = TopicIndex(r, f"persistent://{unique}/ns/x")
    far = int(time.time() * 1000) + 600_000
    got = idx.replace([(b"k", far, 0, 10), (b"k", far + TICK, 0, 20)], far - 300_000)
    assert [x.code for x in got] == [3, 1]
    assert idx.replace([(b"k", far + TICK, 0, 20)], far - 300_000)[0].code == 3
    again = idx.replace([(b"k", far, 0, 10), (b"k", None, 0, 15)], far - 300_000)
    assert [(x.code, x.member) for x in again] == [(2, b"0:10"), (3, b"")]
    assert idx.replace([(b"k", far, 0, 5)], far - 300_000)[0] == (1, b"%d" % far, b"0:5")
    assert r.hget(idx.keys.scheduled, b"k") == b"%d 0:20" % (far + TICK)
    assert idx.replaced() == 2
    # Offsets compare as numbers however long (9 after 10 in text order).
    assert idx.replace([(b"n", far, 1, 10), (b"n", far, 1, 9)], 0)[1].member == b"1:9"
    # The sweep drops a key whose message's bucket is gone and long past, only that.
    r.hset(idx.keys.scheduled, b"gone", b"1000 0:1")
    cursor, dropped = idx.sweep_schedule_keys(far - 1)
    assert (cursor, dropped) == (0, 1)
    assert sorted(r.hkeys(idx.keys.scheduled)) == [b"k", b"n"]


def test_replace_through_admission_and_the_sdk(services, redis_url, kafka_bootstrap, unique):
    """`scheduleKey` on the publish body (the SDK's `schedule_key`): a delayed message
    replaces the pending one, an immediate one is delivered at once and cancels it; bad
    keys are refused with 400."""
    r = connect(redis_url)
    tracker, admission = _tracker_and_admission(services, kafka_bootstrap, unique)
    topic = f"persistent://{unique}/ns/x"
    idx = TopicIndex(r, topic)
    with SdkProducer(topic, admission_url=admission.url) as producer:
        a = producer.send("a", deliver_after=600_000, schedule_key="order-1")
        b = producer.send("b", deliver_after=300_000, schedule_key="order-1")
        c = producer.send("c", deliver_after=600_000, schedule_key="order-2")
        wait_for(lambda: idx.cancellations() == 1, 30, "a replaced by b", interval=0.1)
        now_id = producer.send("now", schedule_key="order-2")
        assert now_id.startswith(TopicName.parse(topic).kafka_topic + ":")
        wait_for(lambda: idx.cancellations() == 2, 30, "c cancelled by the immediate one",
                 interval=0.1)
        assert sorted(r.zrange(idx.keys.cancelled, 0, -1)) == sorted([_member(a),
                                                                     _member(c)])
        assert r.hkeys(idx.keys.scheduled) == [b"order-1"]
        assert _member(b) in r.hget(idx.keys.scheduled, b"order-1")
        for bad, why in (("", "0 bytes"), ("é" * 129, "258 bytes")):
            with pytest.raises(PublishError, match=f"scheduleKey: {why}; a schedule key"):
                producer.send("x", deliver_after=1000, schedule_key=bad)
    # Over HTTP as Pulsar's REST producer sends it.
    with httpx.Client(base_url=admission.url, timeout=30) as http:
        resp = http.post(f"/topics/persistent/{unique}/ns/x", json={"messages": [
            {"payload": "d", "deliverAfterMs": 600_000, "scheduleKey": "order-1"}]})
        assert resp.status_code == 200, resp.text
        resp = http.post(f"/topics/persistent/{unique}/ns/x", json={"messages": [
            {"payload": "d", "scheduleKey": 7}]})
        assert resp.status_code == 400, resp.text
    wait_for(lambda: idx.cancellations() == 3, 30, "b replaced", interval=0.1)
