"""Delivery end to end on the running stack (tests/e2e/conftest.py), driven through the SDK
and, for one scenario, a plain Kafka consumer.

The timed scenarios are independent (own tenant, topic and subscriptions) and mostly wait,
so they run at the same time in threads, started together when the first test asks;
each test then asserts on what its scenario measured. Bounds come from tickTime and the
Spark triggers (conftest's margins); every redelivery gap is asserted both ways, late by
at most what conftest.redelivery_margin_ms allows for its delay."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from dwell import headers as hdr
from dwell.adapters import kafka
from dwell.client import ExponentialRedeliveryBackoff, NotAllowedError, Producer
from dwell.core import topics as names
from dwell.core.positions import format_message_id
from dwell.core.topics import TopicName, dlq_topic, retry_topic

from .conftest import (
    SPARK_MARGIN_MS,
    TICK_MS,
    Dwell,
    Received,
    consumer,
    make_topic,
    new_tenant,
    now_ms,
    receive_all,
    receive_one,
    redelivery_margin_ms,
    warm_redelivery_path,
)

# The widest redelivery margin (a delay of 0): how long a scenario waits for a copy, or
# for the silence after an ack.
REDELIVERY_MARGIN_MS = redelivery_margin_ms(0)

# PIP-130's example shape, scaled down: ackTimeout 2 s, min 1 s, max 4 s, multiplier 2.
ACK_TIMEOUT_MS = 2000
PIP130 = ExponentialRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=4000, multiplier=2)
NACK = ExponentialRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=4000, multiplier=2)
MAX_REDELIVER = 4


def gaps_between(received: list[Received]) -> list[int]:
    """From the start of the receive that got copy k to the end of the one that got k+1:
    never shorter than the scheduled gap (the SDK stamps its event inside the first)."""
    return [b.after - a.before for a, b in zip(received, received[1:], strict=False)]


# -- scenarios (each returns what it measured; run concurrently by the `runs` fixture)

def delays_scenario(e2e: Dwell) -> dict[str, Any]:
    topic = make_topic(e2e, new_tenant())
    subs = {s: consumer(e2e, topic, s) for s in ("billing", "audit")}
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            ids = {p.send(b"in-2s", key="k2", properties={"a": "1"}, deliver_after=2000): 2000,
                   p.send(b"in-5s", key="k5", deliver_after=5000): 5000,
                   p.send(b"in-10s", key="k10", deliver_after=10000): 10000}
        got = receive_all(subs, 3, timeout=30)
        for sub, msgs in got.items():
            for r in msgs:
                subs[sub].acknowledge(r.msg)
        # Nothing more arrives: no duplicates survive to the application.
        extra = {sub: c.receive(1.5) for sub, c in subs.items()}
        return {"ids": ids, "got": got, "extra": extra}
    finally:
        for c in subs.values():
            c.close()


def restaged_total(e2e: Dwell) -> float:
    text = httpx.get(f"{e2e.tracker}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("dwell_tracker_restaged_total "))


def refiled_scenario(e2e: Dwell) -> dict[str, Any]:
    """Delays that vary (not in deliverAt order): the tracker re-files their buckets
    before they are due (RESTAGE_LEAD_MS), and they still arrive once, on time, with the
    ids the producer got."""
    topic = make_topic(e2e, new_tenant())
    c = consumer(e2e, topic, "refiled")
    before = restaged_total(e2e)
    delays = [14_000, 12_000, 9_000, 13_000, 11_000, 8_000]
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            ids = {p.send(b"in-%d" % d, key=f"k{d}", deliver_after=d): d for d in delays}
        got = receive_all({"refiled": c}, len(delays), timeout=40)["refiled"]
        for r in got:
            c.acknowledge(r.msg)
        return {"ids": ids, "got": got, "extra": c.receive(1.5),
                "restaged": restaged_total(e2e) - before}
    finally:
        c.close()


def ack_timeout_scenario(e2e: Dwell) -> dict[str, Any]:
    topic = make_topic(e2e, new_tenant())
    c = consumer(e2e, topic, "slow", ack_timeout_ms=ACK_TIMEOUT_MS,
                 ack_timeout_redelivery_backoff=PIP130)
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"late-ack")
        copies = [receive_one(c, 20)]
        for n in range(4):
            wait = (ACK_TIMEOUT_MS + PIP130.next(n) + REDELIVERY_MARGIN_MS) / 1000 + 5
            copies.append(receive_one(c, wait))
        c.acknowledge(copies[-1].msg)
        # Acked: the timer is gone; nothing comes back within ackTimeout + next(4).
        quiet_s = (ACK_TIMEOUT_MS + PIP130.next(4) + REDELIVERY_MARGIN_MS) / 1000
        return {"mid": mid, "copies": copies, "after_ack": c.receive(quiet_s)}
    finally:
        c.close()


def unacked_dead_letter_scenario(e2e: Dwell) -> dict[str, Any]:
    """maxRedeliverCount 1 and no ack: the original, one redelivery, then the DLQ once
    the redelivery's own ack timeout (plus backoff) has run out."""
    topic = make_topic(e2e, new_tenant())
    dlq = dlq_topic(TopicName.parse(topic), "never")
    kafka.ensure_topic(e2e.bootstrap, dlq, 4)
    reader = kafka.Consumer(e2e.bootstrap, f"dlq-{uuid.uuid4().hex[:8]}", [dlq],
                            auto_offset_reset="earliest")
    c = consumer(e2e, topic, "never", ack_timeout_ms=ACK_TIMEOUT_MS,
                 ack_timeout_redelivery_backoff=PIP130, max_redeliver_count=1)
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"unwanted")
        copies = [receive_one(c, 20)]
        copies.append(receive_one(c, (ACK_TIMEOUT_MS + PIP130.next(0)
                                      + REDELIVERY_MARGIN_MS) / 1000 + 5))
        deadline = time.monotonic() + (ACK_TIMEOUT_MS + PIP130.next(1)
                                       + REDELIVERY_MARGIN_MS) / 1000 + 5
        dead: list[kafka.Record] = []
        while not dead and time.monotonic() < deadline:
            dead = reader.poll(10, 0.05)
        return {"mid": mid, "copies": copies, "dead": dead, "dead_at": now_ms(),
                "after_dead": c.receive(1.0)}
    finally:
        c.close()
        reader.close()


def nack_scenario(e2e: Dwell) -> dict[str, Any]:
    topic = make_topic(e2e, new_tenant())
    c = consumer(e2e, topic, "work", negative_ack_redelivery_backoff=NACK,
                 max_redeliver_count=MAX_REDELIVER)
    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"job", key="j")
        copies: list[Received] = []
        nacked: list[int] = []
        for n in range(MAX_REDELIVER + 1):
            wait = 20 if n == 0 else (NACK.next(n - 1) + REDELIVERY_MARGIN_MS) / 1000 + 5
            copies.append(receive_one(c, wait))
            nacked.append(now_ms())
            c.negative_acknowledge(copies[-1].msg)
        # Past maxRedeliverCount the message goes to the DLQ, not back to the consumer.
        dlq = dlq_topic(TopicName.parse(topic), "work")
        deadline = time.monotonic() + 20
        recs: list[kafka.Record] = []
        while not recs:
            assert time.monotonic() < deadline, "nothing on the DLQ"
            try:
                recs = kafka.read_all(e2e.bootstrap, dlq, timeout=5)
            except kafka.KafkaUnavailable:
                recs = []
            if not recs:
                time.sleep(0.2)
        dlq_seen = now_ms()
        return {"mid": mid, "copies": copies, "nacked": nacked, "dlq": recs,
                "dlq_after_ms": dlq_seen - nacked[-1], "after_dlq": c.receive(1.0)}
    finally:
        c.close()


CHILD = textwrap.dedent("""
    import sys, time
    from dwell.client import Consumer, ExponentialRedeliveryBackoff
    topic, sub, bootstrap, tracker = sys.argv[1:5]
    c = Consumer(topic, sub, bootstrap=bootstrap, tracker_url=tracker,
                 initial_position="earliest", ack_timeout_ms=int(sys.argv[5]),
                 ack_timeout_redelivery_backoff=ExponentialRedeliveryBackoff(
                     int(sys.argv[6]), int(sys.argv[7]), float(sys.argv[8])))
    print("READY", flush=True)
    while True:
        before = int(time.time() * 1000)
        m = c.receive(0.05)
        if m is not None:
            after = int(time.time() * 1000)
            print("GOT", m.message_id, m.redelivery_count, before, after, flush=True)
            time.sleep(3600)  # received, never acked: killed here
""")
# Long enough for Kafka to drop the killed member (session.timeout.ms 6 s) and hand its
# partitions to the new consumer before the redelivery is due.
KILL_ACK_TIMEOUT_MS = 6000
KILL_BACKOFF = ExponentialRedeliveryBackoff(min_delay_ms=2000, max_delay_ms=8000, multiplier=2)


def _line(proc: subprocess.Popen[str], prefix: str, timeout: float) -> list[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            assert line, f"consumer process exited {proc.poll()}"
            if line.startswith(prefix):
                return line.split()
    raise AssertionError(f"consumer process printed no {prefix} within {timeout}s")


def consumer_killed_scenario(e2e: Dwell) -> dict[str, Any]:
    topic = make_topic(e2e, new_tenant())
    b = KILL_BACKOFF
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, topic, "jobs", e2e.bootstrap, e2e.tracker,
         str(KILL_ACK_TIMEOUT_MS), str(b.min_delay_ms), str(b.max_delay_ms), str(b.multiplier)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _line(proc, "READY", 60)
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"crash-me")
        _, got_id, count, before, after = _line(proc, "GOT", 30)
        proc.kill()  # kill -9: no ack, no close, no leave-group
        proc.wait()
        killed = now_ms()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first = Received(int(before), int(after), None)  # type: ignore[arg-type]
    c = consumer(e2e, topic, "jobs", ack_timeout_ms=KILL_ACK_TIMEOUT_MS,
                 ack_timeout_redelivery_backoff=b)
    try:
        wait = (KILL_ACK_TIMEOUT_MS + b.next(0) + REDELIVERY_MARGIN_MS) / 1000 + 10
        again = receive_one(c, wait)
        # The new consumer does not ack either: the schedule goes on (next(1)).
        third = receive_one(c, (KILL_ACK_TIMEOUT_MS + b.next(1) + REDELIVERY_MARGIN_MS) / 1000
                            + 5)
        c.acknowledge(third.msg)
        return {"mid": mid, "child": (got_id, int(count)), "killed_after_ms": killed - first.after,
                "copies": [first, again, third]}
    finally:
        c.close()


def plain_kafka_scenario(e2e: Dwell) -> dict[str, Any]:
    """A consumer without the SDK: registers over the tracker's HTTP API, reads the ready
    and retry topics with a bare Kafka consumer, and posts events without settings."""
    topic = make_topic(e2e, new_tenant())
    t = TopicName.parse(topic)
    sub = "plain"
    ready, retry = t.kafka_topic, retry_topic(t, sub)
    r = httpx.put(f"{e2e.tracker}/v1/topics/{t.domain}/{t.tenant}/{t.namespace}/{t.local}/"
                  f"subscriptions/{sub}",
                  json={"ackTimeoutMs": ACK_TIMEOUT_MS,
                        "ackTimeoutRedeliveryBackoff": PIP130.to_json()}, timeout=10)
    assert r.status_code < 300, r.text
    for name in (ready, retry):
        kafka.ensure_topic(e2e.bootstrap, name, 4)
    c = kafka.Consumer(e2e.bootstrap, sub, [ready, retry], auto_offset_reset="earliest")
    events = kafka.Producer(e2e.bootstrap, linger_ms=0)

    def post(event: str, rec: kafka.Record, mid: str) -> int:
        body: dict[str, Any] = {"event": event, "topic": topic, "subscription": sub,
                                "messageId": mid, "ts": now_ms()}
        if rec.header("dwell-redelivery-count"):
            body["redeliveryCount"] = int(rec.header("dwell-redelivery-count") or 0)
        events.send(names.ACKS, json.dumps(body).encode(),
                    key=f"{topic}/{sub}".encode()).result(10)
        return int(body["ts"])

    def next_record(timeout: float) -> kafka.Record:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recs = c.poll(1, 0.05)
            if recs:
                return recs[0]
        raise AssertionError(f"plain consumer got nothing within {timeout}s")

    try:
        with Producer(topic, admission_url=e2e.admission) as p:
            mid = p.send(b"plain")
        first = next_record(20)
        first_mid = first.header("dwell-message-id") or format_message_id(
            first.topic, first.partition, first.offset)
        delivered = post("delivered", first, first_mid)
        again = next_record((ACK_TIMEOUT_MS + PIP130.next(0) + REDELIVERY_MARGIN_MS) / 1000 + 5)
        again_at = now_ms()
        post("delivered", again, first_mid)
        post("ack", again, first_mid)
        quiet_s = (ACK_TIMEOUT_MS + PIP130.next(1) + REDELIVERY_MARGIN_MS) / 1000
        deadline = time.monotonic() + quiet_s
        after_ack: list[kafka.Record] = []
        while time.monotonic() < deadline and not after_ack:
            after_ack = c.poll(1, 0.2)
        return {"mid": mid, "first_mid": first_mid, "first_topic": first.topic,
                "again": again, "gap": again_at - delivered, "after_ack": after_ack}
    finally:
        c.close()
        events.close()


SCENARIOS: dict[str, Callable[[Dwell], dict[str, Any]]] = {
    "delays": delays_scenario, "ack_timeout": ack_timeout_scenario, "nack": nack_scenario,
    "consumer_killed": consumer_killed_scenario, "plain_kafka": plain_kafka_scenario,
    "unacked_dead_letter": unacked_dead_letter_scenario, "refiled": refiled_scenario,
}


@pytest.fixture(scope="module")
def runs(e2e: Dwell) -> Iterator[dict[str, Future[dict[str, Any]]]]:
    warm_redelivery_path(e2e)
    pool = ThreadPoolExecutor(max_workers=len(SCENARIOS), thread_name_prefix="scenario")
    futures = {name: pool.submit(fn, e2e) for name, fn in SCENARIOS.items()}
    yield futures
    pool.shutdown(wait=True)


# -- assertions

def test_delayed_messages_reach_each_subscription_once_on_time(runs) -> None:
    res = runs["delays"].result(timeout=120)
    lateness: dict[int, list[int]] = {}
    for sub, msgs in res["got"].items():
        assert sorted(r.msg.message_id for r in msgs) == sorted(res["ids"]), sub
        assert res["extra"][sub] is None, f"{sub} got a duplicate: {res['extra'][sub]}"
        for r in msgs:
            m = r.msg
            assert m.deliver_at is not None and m.redelivery_count == 0
            # Never earlier than deliverAt - tickTime (the bucket's start) ...
            assert r.after >= m.deliver_at - TICK_MS, (sub, r.after - m.deliver_at)
            # ... and at most tickTime + 1 s late, plus the drain's trigger and round.
            assert r.before <= m.deliver_at + TICK_MS + 1000 + SPARK_MARGIN_MS, \
                (sub, r.before - m.deliver_at)
            lateness.setdefault(res["ids"][m.message_id], []).append(r.after - m.deliver_at)
    first = next(r.msg for r in res["got"]["billing"] if r.msg.value == b"in-2s")
    assert first.key == "k2" and first.properties == {"a": "1"}
    print(f"lateness ms (received - deliverAt) by delay: {dict(sorted(lateness.items()))}")


def test_refiled_delays_arrive_once_on_time(runs) -> None:
    res = runs["refiled"].result(timeout=120)
    assert res["restaged"] >= len(res["ids"]), "the tracker re-filed them"
    assert sorted(r.msg.message_id for r in res["got"]) == sorted(res["ids"])
    assert res["extra"] is None, f"a duplicate: {res['extra']}"
    lateness = {}
    for r in res["got"]:
        m = r.msg
        assert m.deliver_at is not None and m.redelivery_count == 0
        assert m.value == b"in-%d" % res["ids"][m.message_id]
        assert r.after >= m.deliver_at - TICK_MS, r.after - m.deliver_at
        assert r.before <= m.deliver_at + TICK_MS + 1000 + SPARK_MARGIN_MS, \
            r.before - m.deliver_at
        lateness[res["ids"][m.message_id]] = r.after - m.deliver_at
    print(f"re-filed, lateness ms by delay: {dict(sorted(lateness.items()))}")


def test_max_delay_rejection_is_typed(e2e: Dwell, unique: str) -> None:
    topic = make_topic(e2e, unique)
    with Producer(topic, admission_url=e2e.admission) as p, \
            pytest.raises(NotAllowedError, match="Exceeds max allowed delivery delay"):
        p.send(b"x", deliver_after=120000)


def test_a_redelivery_behind_its_ack_is_dropped(e2e: Dwell, unique: str) -> None:
    """The backoff job read a delivered event in one micro-batch and its ack in the next,
    so the redelivery it scheduled from the first reaches the retry topic after the ack
    (the copies here are what the drain writes then). The consumer that acked drops that
    copy and settles it; the copy of a message it did not ack still arrives."""
    topic = make_topic(e2e, unique)
    c = consumer(e2e, topic, "behind", ack_timeout_ms=60_000)
    p = kafka.Producer(e2e.bootstrap)
    try:
        with Producer(topic, admission_url=e2e.admission) as prod:
            prod.send(b"acked")
            prod.send(b"kept")
        got = {r.msg.value: r.msg for r in (receive_one(c, 30), receive_one(c, 30))}
        c.acknowledge(got[b"acked"])
        retry = retry_topic(TopicName.parse(topic), "behind")
        for m in (got[b"acked"], got[b"kept"]):
            p.send(retry, m.value, key=m.key, headers={
                hdr.MESSAGE_ID: m.message_id, hdr.REDELIVERY_COUNT: "1"}).result(10)
        again = receive_one(c, 30).msg
        assert (again.value, again.message_id, again.redelivery_count) == \
            (b"kept", got[b"kept"].message_id, 1)
        assert c.receive(2.0) is None, "the acked message came back"
        c.acknowledge(again)
    finally:
        p.close()
        c.close()
    # Both copies were settled: a consumer of the subscription starts after them.
    c2 = consumer(e2e, topic, "behind", ack_timeout_ms=60_000)
    try:
        assert c2.receive(3.0) is None
    finally:
        c2.close()


def test_grouped_acknowledgements_redeliver_only_what_was_not_acked(e2e: Dwell,
                                                                     unique: str) -> None:
    """A consumer with ``ack_group_time_ms`` (its events sent without waiting, offsets
    committed every 100 ms): of 300 messages received with an ack timeout, the one it did
    not ack is redelivered and none of the 299 it acked comes back; after ``close`` a
    consumer of the subscription starts after all of them."""
    topic = make_topic(e2e, unique)
    warm_redelivery_path(e2e)
    c = consumer(e2e, topic, "grouped", ack_timeout_ms=ACK_TIMEOUT_MS,
                 ack_timeout_redelivery_backoff=PIP130, ack_group_time_ms=100)
    try:
        with Producer(topic, admission_url=e2e.admission) as prod:
            sent = {prod.send(f"m{i}".encode()) for i in range(300)}
        got = [receive_one(c, 30).msg for _ in range(300)]
        assert {m.message_id for m in got} == sent
        kept = got[150]
        for m in got:
            if m is not kept:
                c.acknowledge(m)
        again = receive_one(c, 30).msg
        assert (again.message_id, again.redelivery_count) == (kept.message_id, 1)
        c.acknowledge(again)
        assert c.receive(ACK_TIMEOUT_MS / 1000 + REDELIVERY_MARGIN_MS / 1000) is None
    finally:
        c.close()
    c2 = consumer(e2e, topic, "grouped", ack_timeout_ms=ACK_TIMEOUT_MS)
    try:
        assert c2.receive(3.0) is None
    finally:
        c2.close()


def test_a_consumer_of_one_partition_reads_that_partition_alone(e2e: Dwell,
                                                                 unique: str) -> None:
    """A consumer of `x-partition-1` gets what was published to that partition, at once,
    delayed and redelivered after a nack, and nothing of partition 0: both are Kafka
    partitions of x's ready topic, and no Kafka topic of the partition's name is made."""
    make_topic(e2e, unique)
    x = TopicName.parse(f"persistent://{unique}/ns/x")
    with httpx.Client(base_url=e2e.policy, timeout=10) as policy:
        r = policy.put(f"/admin/v2/persistent/{unique}/ns/x/partitions", json=2)
        assert r.status_code == 204, r.text
    one, zero = str(x.partition(1)), str(x.partition(0))
    c = consumer(e2e, one, "p1", negative_ack_redelivery_backoff=NACK)
    try:
        with Producer(zero, admission_url=e2e.admission) as p0, \
                Producer(one, admission_url=e2e.admission) as p1:
            p0.send(b"zero")
            p0.send(b"zero-later", deliver_after=1500)
            now = p1.send(b"now")
            later = p1.send(b"later", deliver_after=1500)
        got = {m.value: m for m in (receive_one(c, 30).msg, receive_one(c, 30).msg)}
        assert set(got) == {b"now", b"later"}
        assert got[b"now"].message_id == now and got[b"later"].message_id == later
        assert {(m.topic, m.record_topic, m.partition) for m in got.values()} == \
            {(one, x.kafka_topic, 1)}
        c.acknowledge(got[b"later"])
        c.negative_acknowledge(got[b"now"])
        again = receive_one(c, (NACK.next(0) + REDELIVERY_MARGIN_MS) / 1000 + 10).msg
        assert (again.value, again.message_id, again.redelivery_count) == (b"now", now, 1)
        c.acknowledge(again)
        assert c.receive(3.0) is None, "partition 0's messages reached partition 1's consumer"
    finally:
        c.close()
    assert x.partition(1).kafka_topic not in kafka.topic_names(e2e.bootstrap)


def test_ack_timeout_redeliveries_follow_pip130_schedule(runs) -> None:
    res = runs["ack_timeout"].result(timeout=150)
    copies = res["copies"]
    assert [r.msg.message_id for r in copies] == [res["mid"]] * 5
    assert [r.msg.redelivery_count for r in copies] == [0, 1, 2, 3, 4]
    want = [ACK_TIMEOUT_MS + PIP130.next(n) for n in range(4)]
    assert want == [3000, 4000, 6000, 6000]
    got = gaps_between(copies)
    print(f"ack-timeout redelivery gaps ms: want {want}, got {got}")
    for n, (w, g) in enumerate(zip(want, got, strict=True)):
        assert w <= g <= w + redelivery_margin_ms(w), (n, w, g)
    assert res["after_ack"] is None, f"redelivered after the ack: {res['after_ack']}"


def test_nack_backoff_gaps_then_dead_letter(runs) -> None:
    res = runs["nack"].result(timeout=150)
    copies = res["copies"]
    assert [r.msg.message_id for r in copies] == [res["mid"]] * (MAX_REDELIVER + 1)
    assert [r.msg.redelivery_count for r in copies] == list(range(MAX_REDELIVER + 1))
    assert all(r.msg.value == b"job" and r.msg.key == "j" for r in copies)
    want = [NACK.next(n) for n in range(MAX_REDELIVER)]
    assert want == [1000, 2000, 4000, 4000]  # min, ×2, capped at max
    # From just before the nack (the SDK stamps it inside) to the redelivery's receipt.
    got = [b.after - t for t, b in zip(res["nacked"], copies[1:], strict=False)]
    print(f"nack redelivery gaps ms: want {want}, got {got}; "
          f"DLQ seen {res['dlq_after_ms']} ms after the last nack")
    for n, (w, g) in enumerate(zip(want, got, strict=True)):
        assert w <= g <= w + redelivery_margin_ms(w), (n, w, g)
    assert res["after_dlq"] is None
    [dead] = res["dlq"]
    assert dead.value == b"job" and dead.header("dwell-message-id") == res["mid"]
    assert dead.header("dwell-redelivery-count") == str(MAX_REDELIVER)


def test_unacked_past_max_redeliver_count_goes_to_the_dlq_on_schedule(runs) -> None:
    res = runs["unacked_dead_letter"].result(timeout=120)
    first, again = res["copies"]
    assert (again.msg.message_id, again.msg.redelivery_count) == (res["mid"], 1)
    assert len(res["dead"]) == 1, "nothing (or too much) on the DLQ"
    [dead] = res["dead"]
    assert dead.value == b"unwanted" and dead.header("dwell-message-id") == res["mid"]
    assert dead.header("dwell-redelivery-count") == "1"
    # Due ackTimeout + next(1) after the redelivery was received; read within a poll.
    want = ACK_TIMEOUT_MS + PIP130.next(1)
    got = res["dead_at"] - again.before
    print(f"unacked past maxRedeliverCount: DLQ {got} ms after the redelivery (want {want})")
    assert want <= got <= want + redelivery_margin_ms(want)
    assert res["after_dead"] is None


def test_backoff_schedule_survives_a_killed_consumer(runs) -> None:
    res = runs["consumer_killed"].result(timeout=150)
    assert res["child"] == (res["mid"], 0)
    first, again, third = res["copies"]
    # The new consumer gets the redeliveries, not the original again.
    assert (again.msg.message_id, again.msg.redelivery_count) == (res["mid"], 1)
    assert (third.msg.message_id, third.msg.redelivery_count) == (res["mid"], 2)
    want = [KILL_ACK_TIMEOUT_MS + KILL_BACKOFF.next(n) for n in range(2)]
    got = gaps_between([first, again, third])
    print(f"after kill -9 of the consumer ({res['killed_after_ms']} ms after it received): "
          f"gaps ms want {want}, got {got}")
    for n, (w, g) in enumerate(zip(want, got, strict=True)):
        assert w <= g <= w + redelivery_margin_ms(w), (n, w, g)


def test_plain_kafka_consumer_gets_registered_settings(runs) -> None:
    res = runs["plain_kafka"].result(timeout=120)
    again = res["again"]
    assert res["first_mid"] == res["mid"]
    assert again.header("dwell-message-id") == res["mid"]
    assert again.header("dwell-redelivery-count") == "1"
    assert again.topic != res["first_topic"]  # the subscription's retry topic
    want = ACK_TIMEOUT_MS + PIP130.next(0)
    print(f"plain Kafka consumer: redelivery {res['gap']} ms after delivery (want {want})")
    assert want <= res["gap"] <= want + redelivery_margin_ms(want)
    assert res["after_ack"] == [], "redelivered after the ack"


GROUPED_CONSUMER = """
import sys, time
from dwell.client import Consumer
topic, sub, bootstrap, tracker = sys.argv[1:5]
c = Consumer(topic, sub, bootstrap=bootstrap, tracker_url=tracker,
             initial_position="earliest", ack_group_time_ms=100)
print("ready", flush=True)
while True:
    m = c.receive(1.0)
    if m is not None:
        c.acknowledge(m)
        print(m.message_id, flush=True)
        time.sleep(0.005)
"""


def test_a_grouped_consumer_killed_mid_stream_loses_nothing(e2e: Dwell, unique: str) -> None:
    """A consumer with ``ack_group_time_ms=100`` in its own process, killed with SIGKILL
    while it acknowledges a stream of 600 messages: a consumer of the subscription then
    receives every message the first did not acknowledge, none is lost, and of those it
    did acknowledge only the last ones come back (offsets are committed in order, every
    100 ms)."""
    topic = make_topic(e2e, unique)
    with Producer(topic, admission_url=e2e.admission) as prod:
        sent = [prod.send(f"m{i}".encode()) for i in range(600)]
    proc = subprocess.Popen(
        [sys.executable, "-c", GROUPED_CONSUMER, topic, "killed", e2e.bootstrap, e2e.tracker],
        stdout=subprocess.PIPE, text=True)
    acked: list[str] = []
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        while len(acked) < 250:
            line = proc.stdout.readline()
            assert line, f"the consumer ended after {len(acked)} acknowledgements"
            acked.append(line.strip())
    finally:
        proc.kill()
        proc.wait(10)
    # What it printed before the kill: acknowledged (an id is printed after its ack).
    acked += [ln.strip() for ln in proc.stdout.read().splitlines() if ln.strip()]
    c = consumer(e2e, topic, "killed")
    try:
        # The group gives it the partitions once the killed member's session (6 s) ends.
        first = receive_one(c, 30).msg
        c.acknowledge(first)
        again = [first.message_id]
        while (m := c.receive(5.0)) is not None:
            again.append(m.message_id)
            c.acknowledge(m)
    finally:
        c.close()
    lost = set(sent) - set(acked) - set(again)
    read_twice = [mid for mid in acked if mid in set(again)]
    print(f"acknowledged before the kill {len(acked)}, received after {len(again)}, "
          f"of them acknowledged before {len(read_twice)}, lost {len(lost)}")
    assert not lost
    assert set(acked) | set(again) == set(sent)
    # Only a tail of the acknowledged ones comes back: the ones after the last commit.
    assert read_twice == acked[len(acked) - len(read_twice):]
    assert len(read_twice) < 100
