"""The Consumer's offset bookkeeping: only a settled prefix of each partition is committed,
so a crash re-reads what the application or the backoff job does not yet own."""

from __future__ import annotations

import copy
import json
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable

import pytest

from dwell.adapters.kafka import KafkaUnavailable, Record
from dwell.client import Consumer, ExponentialRedeliveryBackoff
from dwell.client import consumer as consumer_module
from dwell.client.consumer import Message, _event_parts, _Offsets, _Recent, properties_of
from dwell.core import backoff
from dwell.core.topics import TopicName

TP = ("acme.orders.new", 0)


def test_commits_up_to_the_first_unsettled_offset() -> None:
    o = _Offsets()
    for off in (10, 11, 12):
        o.received(TP, off)
    assert o.committable() == {TP: 10}
    o.settle(TP, 11)
    assert o.committable() == {TP: 10}
    o.settle(TP, 10)
    assert o.committable() == {TP: 12}
    o.settle(TP, 12)
    assert o.committable() == {TP: 13}


def test_partitions_are_independent() -> None:
    o = _Offsets()
    other = ("acme.orders.new", 1)
    o.received(TP, 5)
    o.received(other, 7)
    o.settle(other, 7)
    assert o.committable() == {TP: 5, other: 8}


def test_properties_exclude_dwell_headers() -> None:
    assert properties_of({"dwell-topic": b"x", "colour": b"red",
                          "dwell-redelivery-count": b"1"}) == {"colour": "red"}


def test_backoff_is_the_core_one() -> None:
    assert ExponentialRedeliveryBackoff is backoff.ExponentialRedeliveryBackoff
    b = ExponentialRedeliveryBackoff.builder().min_delay_ms(1000).max_delay_ms(60000).build()
    assert [b.next(c) for c in (0, 1, 4, 100)] == [1000, 2000, 16000, 60000]


class _Commits:
    """The commit calls the Consumer makes: the first ``failures`` are refused as the
    adapter refuses them when Kafka stays away past its retries."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.committed: list[dict[tuple[str, int], int]] = []
        self.waited: list[bool] = []  # per commit, whether the Consumer waited for it

    def commit(self, offsets: dict[tuple[str, int], int], waited: bool = True) -> None:
        if self.failures:
            self.failures -= 1
            raise KafkaUnavailable("Commit failed: Broker: Coordinator load in progress")
        self.committed.append(dict(offsets))
        self.waited.append(waited)

    def commit_in_background(self, offsets: dict[tuple[str, int], int]) -> None:
        self.commit(offsets, waited=False)

    def close(self) -> None:
        pass


def _message(offset: int) -> Message:
    return Message(b"x", None, {}, f"m{offset}", 0, None, None, None, "t", TP[0], TP[1],
                   offset)


def test_a_commit_refused_while_kafka_is_away_is_carried_by_the_next(
        caplog: pytest.LogCaptureFixture) -> None:
    """An acknowledgement whose commit fails (Kafka away longer than the commit's retries)
    does not raise into the application: the offset stays settled and the next commit
    carries it."""
    c = Consumer.__new__(Consumer)
    c._offsets = _Offsets()
    c._consumer = commits = _Commits(failures=1)  # type: ignore[assignment]
    c._committed_at, c._to_commit, c._group_s = 0.0, False, 0.0
    for off in (10, 11):
        c._offsets.received(TP, off)
    c._settle((*TP, 10))
    c._commit(now=True)
    assert commits.committed == []
    assert "offsets not committed" in caplog.text
    c._settle((*TP, 11))
    c._commit(now=True)
    assert commits.committed == [{TP: 12}]


def test_grouped_offsets_are_committed_at_most_every_group_time() -> None:
    """With ``ack_group_time_ms`` (Pulsar's acknowledgementsGroupTime): one commit for
    what was settled within the group time, the next after it, neither waited for;
    ``now`` (close) commits at once and waits, and nothing settled commits nothing."""
    c = Consumer.__new__(Consumer)
    c._offsets = _Offsets()
    c._consumer = commits = _Commits(failures=0)  # type: ignore[assignment]
    c._committed_at, c._to_commit, c._group_s = 0.0, False, 0.2
    for off in (10, 11, 12):
        c._offsets.received(TP, off)
    c._settle((*TP, 10))
    c._commit()
    c._settle((*TP, 11))
    c._commit()
    assert commits.committed == [{TP: 11}]
    time.sleep(0.25)
    c._commit()
    assert commits.committed == [{TP: 11}, {TP: 12}]
    c._commit(now=True)
    assert len(commits.committed) == 2
    c._settle((*TP, 12))
    c._commit(now=True)
    assert commits.committed[-1] == {TP: 13}
    assert commits.waited == [False, False, True]


class _Sent:
    """One send's delivery report, given by the test as Kafka takes the event or refuses
    it (message timed out while it was away)."""

    def __init__(self, then: Callable[[KafkaUnavailable | None], None]) -> None:
        self.then = then

    def set_result(self, _: tuple[int, int]) -> None:
        self.then(None)

    def set_exception(self, exc: KafkaUnavailable) -> None:
        self.then(exc)


class _Events:
    """The consumer's dwell.acks producer, whose delivery reports the test gives."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, object], _Sent]] = []
        self.raw: list[bytes] = []
        self.headers: list[dict[str, str] | None] = []

    def send_then(self, topic: str, value: bytes, key: bytes | None,
                  headers: dict[str, str] | None,
                  then: Callable[[KafkaUnavailable | None], None]) -> None:
        self.sent.append((json.loads(value), _Sent(then)))
        self.raw.append(value)
        self.headers.append(headers)

    def poll(self, timeout: float = 0.0) -> int:
        time.sleep(timeout)  # the reports are the test's to give
        return 0

    def kinds(self) -> list[tuple[str, str]]:
        return [(str(b["event"]), str(b["messageId"])) for b, _ in self.sent]

    def close(self) -> None:
        pass


def _away_consumer(monkeypatch: pytest.MonkeyPatch) -> tuple[Consumer, _Events, _Commits]:
    monkeypatch.setattr(consumer_module, "EVENT_WAIT_S", 0.2)
    c = Consumer.__new__(Consumer)
    c.topic = TopicName.parse("persistent://acme/orders/new")
    c.subscription = "s"
    c._settings_json = {}
    c._event_heads, c._event_tail = _event_parts(c.topic, c.subscription, {})
    c._event_key = b"persistent://acme/orders/new/s"
    c._kafka_tokens = None
    c._offsets = _Offsets()
    c._consumer = commits = _Commits(failures=0)  # type: ignore[assignment]
    c._events = events = _Events()  # type: ignore[assignment]
    c._unwritten = deque()
    c._unsent = 0
    c._serve_at = 0.0
    c._lock = threading.Lock()
    c._held, c._held_by = deque(), {}
    c._closing = threading.Event()
    c._releaser = None
    c._committed_at, c._to_commit, c._group_s = 0.0, False, 0.0
    c._acked = _Recent()
    for off in (10, 11, 12):
        c._offsets.received(TP, off)
    return c, events, commits


@pytest.mark.parametrize("group_s", [0.0, 1e-6], ids=["each-ack-waits", "grouped"])
def test_acks_while_kafka_is_away_queue_in_order_and_settle_as_it_takes_them(
        monkeypatch: pytest.MonkeyPatch, group_s: float) -> None:
    """An ack whose event Kafka does not take does not raise: by default it waits
    EVENT_WAIT_S once, with ``ack_group_time_ms`` not at all; the acks after it queue
    without waiting, and nothing is committed until Kafka takes the events; then the
    offsets are settled in order."""
    c, events, commits = _away_consumer(monkeypatch)
    c._group_s = group_s
    started = time.monotonic()
    c.acknowledge(_message(10))  # by default: waits, then queues
    waited = time.monotonic() - started
    started = time.monotonic()
    c.negative_acknowledge(_message(11))
    c.acknowledge(_message(12))
    assert (waited >= 0.2) is (group_s == 0) and time.monotonic() - started < 0.1
    assert commits.committed == []
    assert events.kinds() == [("ack", "m10"), ("nack", "m11"), ("ack", "m12")]
    # Kafka takes the first two only: the third's offset still waits.
    events.sent[0][1].set_result((0, 1))
    events.sent[1][1].set_result((0, 2))
    c._write_events(0)
    assert commits.committed[-1] == {TP: 12}
    events.sent[2][1].set_result((0, 3))
    c._write_events(0)
    assert commits.committed[-1] == {TP: 13}
    assert not c._unwritten


def test_events_kafka_refused_are_sent_again_in_their_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Events Kafka refused (its message timeout passed while it was away) are sent again
    in their order, before any later one: an event made meanwhile waits behind them."""
    c, events, commits = _away_consumer(monkeypatch)
    c.acknowledge(_message(10))
    c.acknowledge(_message(11))
    for _, fut in events.sent:  # librdkafka's message timeout passed: both refused
        fut.set_exception(KafkaUnavailable("dwell.acks: Local: Message timed out"))
    c.acknowledge(_message(12))  # behind the refused ones: sent after them
    assert events.kinds()[2:] == [("ack", "m10"), ("ack", "m11"), ("ack", "m12")]
    first_ts = events.sent[0][0]["ts"]
    assert events.sent[2][0]["ts"] == first_ts  # the event's own time, not the resend's
    assert commits.committed == []
    events.sent[2][1].set_result((0, 5))
    events.sent[3][1].set_result((0, 6))
    c._write_events(0)
    assert commits.committed[-1] == {TP: 12}
    events.sent[4][1].set_result((0, 7))
    c._write_events(0)
    assert commits.committed[-1] == {TP: 13}


class _PolledEvents(_Events):
    """A producer whose delivery reports come only when the consumer polls for them, as
    librdkafka's do without a thread of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[_Sent] = []

    def take_all(self) -> None:
        """Kafka has every event sent so far; their reports wait for a poll."""
        self.taken = [sent for _, sent in self.sent]

    def poll(self, timeout: float = 0.0) -> int:
        taken, self.taken = self.taken, []
        for sent in taken:
            sent.set_result((0, 1))
        return len(taken)


def test_acks_from_a_received_batch_commit_without_another_receive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``ack_group_time_ms``, acknowledgements of messages already received commit
    their offsets as Kafka takes their events, while the application has not called
    `receive` again: the consumer's own calls serve the delivery reports."""
    c, _, commits = _away_consumer(monkeypatch)
    c._group_s = 1e-6
    c._events = events = _PolledEvents()  # type: ignore[assignment]
    c.acknowledge(_message(10))
    c.acknowledge(_message(11))
    assert commits.committed == []
    events.take_all()
    time.sleep(consumer_module.REPORT_INTERVAL_S * 2)
    c.acknowledge(_message(12))
    assert commits.committed[-1] == {TP: 12}


class _Tokens:
    """The consumer's Kafka token source, with no token until the test gives one."""

    disabled = False

    def __init__(self) -> None:
        self.token: str | None = None

    def header(self) -> str | None:
        return f"Bearer {self.token}" if self.token else None


def test_events_wait_for_a_kafka_token_as_for_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a Kafka token (the policy service away), events queue and nothing raises;
    once there is one, they are sent with it, never with the long-lived token."""
    c, events, commits = _away_consumer(monkeypatch)
    c._kafka_tokens = tokens = _Tokens()  # type: ignore[assignment]
    c.acknowledge(_message(10))
    c.acknowledge(_message(11))
    assert events.sent == [] and commits.committed == [] and len(c._unwritten) == 2
    assert c._unsent == 2
    tokens.token = "kafka.jwt"
    c._write_events(0)
    assert events.kinds() == [("ack", "m10"), ("ack", "m11")]
    assert events.headers == [{"dwell-authorization": "Bearer kafka.jwt"}] * 2
    for _, fut in events.sent:
        fut.set_result((0, 1))
    c._write_events(0)
    assert commits.committed[-1] == {TP: 12}


def _holding_consumer(monkeypatch: pytest.MonkeyPatch, group_s: float
                      ) -> tuple[Consumer, _Events, _Commits]:
    c, events, commits = _away_consumer(monkeypatch)
    c._group_s = group_s
    c._hold_delivered_events()
    return c, events, commits


def _wait_for(what: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "not within 5 s"
        time.sleep(0.01)


def test_an_ack_within_the_group_time_is_sent_in_place_of_its_delivery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With an ack timeout and ``ack_group_time_ms``, a delivered event waits the group
    time: an ack or nack of its message meanwhile is the one event sent. A delivery not
    acknowledged in time is sent by itself while the application calls nothing, and
    what comes after it is sent as well."""
    c, events, commits = _holding_consumer(monkeypatch, 0.3)
    try:
        for off in (10, 11, 12):
            c._emit("delivered", _message(off))
        c.acknowledge(_message(10))
        c.negative_acknowledge(_message(12))
        assert events.kinds() == [("ack", "m10"), ("nack", "m12")]
        _wait_for(lambda: len(events.sent) == 3)
        assert events.kinds()[2] == ("delivered", "m11")
        c.acknowledge(_message(11))
        assert events.kinds()[3:] == [("ack", "m11")]
        for _, fut in events.sent:
            fut.set_result((0, 1))
        with c._lock:
            c._write_events(0)
        assert commits.committed[-1] == {TP: 13}
        assert not c._held and not c._held_by
    finally:
        c.close()


def test_a_held_delivery_carries_the_time_it_was_received(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A delivered event sent after the group time says when its message was received:
    the backoff job's ack timeout runs from there, not from the send."""
    c, events, _ = _holding_consumer(monkeypatch, 0.3)
    try:
        received = int(time.time() * 1000)
        c._emit("delivered", _message(10))
        _wait_for(lambda: len(events.sent) == 1)
        sent_at = int(time.time() * 1000)
        ts = events.sent[0][0]["ts"]
        assert received <= ts < received + 100 and sent_at - ts >= 250
    finally:
        c.close()


def test_a_record_received_again_while_held_sends_one_delivery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A record read again while its first copy's delivered event is held (a rebalance
    handed its partition back) holds one event, the later copy's: one delivery of the
    message reaches the backoff job, not two."""
    c, events, _ = _holding_consumer(monkeypatch, 0.1)
    try:
        c._emit("delivered", _message(10))
        c._emit("delivered", _message(10))
        c._emit("delivered", _message(11))
        _wait_for(lambda: len(events.sent) == 2)
        time.sleep(0.25)
        assert events.kinds() == [("delivered", "m10"), ("delivered", "m11")]
        assert not c._held and not c._held_by
    finally:
        c.close()


def test_a_message_survives_pickling_and_copies() -> None:
    """Applications hand messages to other processes and copy them: a slotted, frozen
    Message pickles and copies on every Python the client supports."""
    m = _message(10)
    assert pickle.loads(pickle.dumps(m)) == m
    assert copy.copy(m) == m == copy.deepcopy(m)
    assert m.data() == b"x" and "offset" not in repr(m)


class _RefusingEvents(_Events):
    """Events whose first send the client refuses at once (its queue is full)."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 1

    def send_then(self, topic: str, value: bytes, key: bytes | None,
                  headers: dict[str, str] | None,
                  then: Callable[[KafkaUnavailable | None], None]) -> None:
        if self.refusals:
            self.refusals -= 1
            raise KafkaUnavailable("producer queue full")
        super().send_then(topic, value, key, headers, then)


def test_a_held_delivery_refused_at_once_is_sent_again_in_its_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A held delivered event the client refuses when its time is up stays queued: the
    next event waits behind it, and both are sent in their order."""
    c, _, commits = _holding_consumer(monkeypatch, 0.05)
    c._events = events = _RefusingEvents()  # type: ignore[assignment]
    try:
        c._emit("delivered", _message(10))
        _wait_for(lambda: not c._held)
        assert events.sent == [] and c._unsent == 1
        c.acknowledge(_message(11))
        assert events.kinds() == [("delivered", "m10"), ("ack", "m11")]
        for _, fut in events.sent:
            fut.set_result((0, 1))
        with c._lock:
            c._write_events(0)
        assert commits.committed[-1] == {TP: 12}
    finally:
        c.close()


def test_close_sends_the_held_deliveries(monkeypatch: pytest.MonkeyPatch) -> None:
    """``close`` sends the delivered events still held, and waits for them as for any
    queued event: the backoff job redelivers those messages after their ack timeout."""
    c, events, commits = _holding_consumer(monkeypatch, 60.0)
    c._emit("delivered", _message(10))
    assert events.sent == []
    started = time.monotonic()
    c.close()
    assert events.kinds() == [("delivered", "m10")]
    assert time.monotonic() - started < 5
    assert c._releaser is not None and not c._releaser.is_alive()


def test_the_filters_keep_the_last_seen_limit_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The duplicate filter and the acknowledged ids remember at least the last
    SEEN_LIMIT keys and forget those older than twice as many; a key seen again counts
    as new."""
    monkeypatch.setattr(consumer_module, "SEEN_LIMIT", 3)
    seen = _Recent()
    for key in "abcdefg":
        seen.add(key)
        assert key in seen
    assert [k for k in "abcdefg" if k in seen] == list("defg")
    seen.add("d")  # the last three added: g, d, h
    seen.add("h")
    assert [k for k in "abcdefgh" if k in seen] == list("dgh")
    for key in "ij":
        seen.add(key)
    assert [k for k in "abcdefghij" if k in seen] == list("dghij")


@pytest.mark.parametrize("settings", [
    {},
    {"ackTimeoutMs": 30000},
    {"ackTimeoutMs": 1000, "maxRedeliverCount": 3,
     "negativeAckRedeliveryBackoff": {"minDelayMs": 100, "maxDelayMs": 60000,
                                      "multiplier": 2.0}},
], ids=["none", "ack-timeout", "all"])
def test_event_text_is_that_of_json_dumps(monkeypatch: pytest.MonkeyPatch,
                                          settings: dict[str, object]) -> None:
    """An event's text, formatted from parts shared by a subscription's events, is the
    text json.dumps gives of its fields (dwell.acks's contract, byte for byte)."""
    c, events, _ = _away_consumer(monkeypatch)
    c._group_s = 1e-6
    c.subscription = 'b\u00e9"lling'
    c._event_heads, c._event_tail = _event_parts(c.topic, c.subscription, settings)
    odd = Message(b"x", None, {}, 'odd"\\id\u00e9', 2, None, None, None, str(c.topic),
                  TP[0], TP[1], 11)
    c._emit("delivered", _message(10))
    c.acknowledge(_message(10))
    c.negative_acknowledge(odd)
    assert len(events.raw) == 3
    for (kind, msg), raw in zip((("delivered", _message(10)), ("ack", _message(10)),
                                 ("nack", odd)), events.raw):
        ts = json.loads(raw)["ts"]
        assert raw == json.dumps({
            "event": kind, "topic": str(c.topic), "subscription": c.subscription,
            "messageId": msg.message_id, "redeliveryCount": msg.redelivery_count,
            "ts": ts, **settings}).encode()


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"receiver_queue_size": 0}, "receiver_queue_size must be in 1..10,000,000"),
    ({"receiver_queue_size": 10_000_001}, "receiver_queue_size must be in 1..10,000,000"),
    ({"ack_group_time_ms": -1}, "ack_group_time_ms must be >= 0"),
    ({"max_redeliver_count": 0}, "max_redeliver_count must be >= 1"),
])
def test_settings_out_of_range_are_refused_before_anything_is_contacted(
        kwargs: dict[str, int], says: str) -> None:
    # Nothing answers on port 1: a check after a connection would fail otherwise.
    with pytest.raises(ValueError, match=says):
        Consumer("persistent://acme/orders/new", "s", bootstrap="127.0.0.1:1",
                 tracker_url="http://127.0.0.1:1", **kwargs)


def test_a_record_with_bad_headers_or_key_is_received_not_raised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who can write to the ready topic sets its records' headers and key: numbers
    that are not numbers, a messageId and a key that are not UTF-8, a negative count.
    `receive` gives the message with what can be read, and raises nothing."""
    c, _, _ = _away_consumer(monkeypatch)
    c.ack_timeout_ms = 0
    c._seen = _Recent()
    rec = Record(TP[0], TP[1], 10, b"\xff\xfek", b"v", {
        "dwell-message-id": b"\xff:0:1", "dwell-redelivery-count": b"-3",
        "dwell-deliver-at": b"soon", "dwell-publish-time": b"9" * 5000,
        "dwell-event-time": b"", "colour": b"\xffred"}, 0)
    msg = c._accept(rec)
    assert msg is not None
    assert (msg.key, msg.message_id, msg.redelivery_count) == ("\ufffd\ufffdk", "\ufffd:0:1", 0)
    assert (msg.deliver_at, msg.publish_time, msg.event_time) == (None, None, None)
    assert msg.properties == {"colour": "\ufffdred"}


def test_a_record_read_again_while_held_unacknowledged_keeps_its_offset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebalance that hands a partition back before its offset was committed reads a
    record the application still holds. The copy is not given again, and its offset
    stays pending until the first receipt is acknowledged: a commit past it would lose
    the message to a crash. A copy at another offset (a redelivery after the ack) is
    settled at once."""
    c, _, _ = _away_consumer(monkeypatch)
    c.ack_timeout_ms = 0
    c._seen = _Recent()
    c._offsets = _Offsets()

    def record(offset: int) -> Record:
        return Record(TP[0], TP[1], offset, None, b"v", {"dwell-message-id": b"m"}, 0)

    held = c._accept(record(10))
    assert held is not None
    assert c._accept(record(10)) is None
    assert c._offsets.committable() == {TP: 10}
    c._settle((*TP, 10))  # the application's ack is on dwell.acks
    assert c._offsets.committable() == {TP: 11}
    assert c._accept(record(11)) is None
    assert c._offsets.committable() == {TP: 12}
