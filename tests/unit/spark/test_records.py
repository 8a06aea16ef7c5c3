"""The drain's record copy, without Kafka: which headers a copy keeps, drops and sets
(docs/internals.md), and the lateness figures it feeds the metric."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dwell.core import topics as names
from dwell_spark.records import (
    LATENESS_BOUNDS_MS,
    CopyStats,
    Range,
    output_record,
    same_topic,
    spans,
)


class Message:
    """The parts of confluent-kafka's Message that output_record reads."""

    def __init__(self, offset: int, key: bytes | None, value: bytes,
                 headers: list[tuple[str, bytes | None]]) -> None:
        self._offset, self._key, self._value, self._headers = offset, key, value, headers

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers


DELAYED_HEADERS = [("colour", b"red"), ("dwell-topic", b"persistent://t/ns/x"),
                   ("dwell-publish-time", b"1000"), ("dwell-deliver-at", b"6000"),
                   ("dwell-tick-time", b"1000"), ("dwell-key", b"k1"), ("note", None)]


def test_copy_of_a_delayed_record_takes_its_key_and_gets_origin_and_message_id() -> None:
    rng = Range("persistent.t.ns.x", names.DELAYED, 3, 10, 20)
    due: list[bytes] = []
    topic, value, key, headers, ts = output_record(
        rng, Message(12, b"persistent://t/ns/x", b"v", DELAYED_HEADERS), due)
    assert (topic, value, key, ts) == ("persistent.t.ns.x", b"v", b"k1", None)
    assert headers == [("colour", b"red"), ("dwell-topic", b"persistent://t/ns/x"),
                       ("dwell-publish-time", b"1000"), ("dwell-deliver-at", b"6000"),
                       ("note", b""), ("dwell-origin", b"3:12"),
                       ("dwell-message-id", f"{names.DELAYED}:3:12".encode())]
    assert due == [b"6000"]


def test_a_copy_of_a_partitions_message_goes_to_that_partition_without_the_header() -> None:
    # Published to x-partition-2: the copy is written to partition 2 of x's ready topic,
    # from either delay log; a message published to x itself goes where the
    # partitioner puts it, and so does a redelivery, whatever its record carries.
    hdrs = [*DELAYED_HEADERS, ("dwell-partition", b"2")]
    parts: list[int] = []
    for source in (names.DELAYED, names.REFILED):
        _, _, _, headers, _ = output_record(Range("persistent.t.ns.x", source, 0, 0, 5),
                                            Message(4, b"t", b"v", hdrs), [], parts)
        assert "dwell-partition" not in dict(headers)
    output_record(Range("persistent.t.ns.x", names.DELAYED, 0, 0, 5),
                  Message(4, b"t", b"v", DELAYED_HEADERS), [], parts)
    output_record(Range("persistent.t.ns.x-s-RETRY", "persistent.t.ns.x", 1, 0, 9, "s"),
                  Message(7, b"k1", b"v", hdrs), [], parts)
    assert parts == [2, 2, -1, -1]


def test_a_refiled_record_keeps_its_original_message_id_and_origin() -> None:
    # The tracker's restage copies a record to the re-file log with the original's id
    # and origin.
    rng = Range("persistent.t.ns.x", names.REFILED, 0, 0, 5)
    hdrs = [("dwell-key", b"k"), ("dwell-tick-time", b"1000"), ("dwell-origin", b"9:9"),
            ("dwell-message-id", b"dwell.delayed:9:9"), ("a", b"1")]
    _, _, key, headers, _ = output_record(rng, Message(4, b"t", b"v", hdrs), [])
    assert key == b"k"
    assert headers == [("dwell-origin", b"9:9"), ("a", b"1"),
                       ("dwell-message-id", b"dwell.delayed:9:9")]


def test_a_carried_message_id_survives_and_a_forged_origin_does_not() -> None:
    rng = Range("persistent.t.ns.x", names.DELAYED, 0, 0, 5)
    hdrs = [("dwell-origin", b"9:9"), ("dwell-message-id", b"orig:1:2"), ("a", b"1")]
    _, _, key, headers, _ = output_record(rng, Message(4, b"t", b"v", hdrs), [])
    assert key is None
    assert headers == [("a", b"1"), ("dwell-origin", b"0:4"), ("dwell-message-id", b"orig:1:2")]


def test_redelivery_keeps_the_ready_record_and_resets_count_and_subscription() -> None:
    rng = Range("persistent.t.ns.x-sub-RETRY", "persistent.t.ns.x", 1, 7, 7, "sub", {7: 3})
    hdrs = [("dwell-origin", b"2:40"), ("dwell-message-id", b"dwell.delayed:2:40"),
            ("dwell-deliver-at", b"6000"), ("dwell-redelivery-count", b"2"),
            ("dwell-subscription", b"other")]
    due: list[bytes] = []
    topic, _, key, headers, _ = output_record(rng, Message(7, b"k1", b"v", hdrs), due)
    assert (topic, key) == ("persistent.t.ns.x-sub-RETRY", b"k1")
    assert headers == [("dwell-origin", b"2:40"), ("dwell-deliver-at", b"6000"),
                       ("dwell-message-id", b"dwell.delayed:2:40"),
                       ("dwell-redelivery-count", b"3"), ("dwell-subscription", b"sub")]
    assert due == []  # redeliveries are not late


def test_lateness_reads_header_bytes_and_leaves_out_what_is_not_a_number() -> None:
    stats = CopyStats()
    stats.observe_lateness(10_000, [b"9990", b"9000", b"junk", b"99999999999999999999", 4000])
    assert sum(stats.lateness_counts) == 3
    assert stats.lateness_sum_ms == 10 + 1000 + 6000
    bounds = list(LATENESS_BOUNDS_MS)
    assert stats.lateness_counts[bounds.index(10)] == 1  # 10 ms <= 10
    assert stats.lateness_counts[bounds.index(1000)] == 1
    assert stats.lateness_counts[bounds.index(10000)] == 1  # 6,000 ms: (5,000, 10,000]


def test_spans_of_overlapping_ranges_never_overlap_each_other() -> None:
    """Ranges of topics that share a partition overlap: a group ends at its highest
    offset, not at its last range's, so no later group starts inside it (the copy would
    seek back and take records it had read past as the later group's end)."""
    from pyroaring import BitMap64

    wide = Range("t-a", "dwell.delayed", 0, 0, 4500, offsets=BitMap64([0, 1500, 3000, 4500]))
    inside = Range("t-b", "dwell.delayed", 0, 100, 100)
    later = Range("t-c", "dwell.delayed", 0, 2500, 2600)
    far = Range("t-c", "dwell.delayed", 0, 9000, 9001)
    groups = spans([later, far, wide, inside])
    assert [[r.first for r in g] for g in groups] == [[0, 100, 2500], [9000]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 3_000)), min_size=1,
                max_size=40))
def test_spans_partition_ranges_into_disjoint_groups(spec: list[tuple[int, int]]) -> None:
    ranges = [Range(f"t{i}", "dwell.delayed", 0, a, a + n) for i, (a, n) in enumerate(spec)]
    groups = spans(ranges)
    assert sorted(id(r) for g in groups for r in g) == sorted(id(r) for r in ranges)
    bounds = [(min(r.first for r in g), max(r.last for r in g)) for g in groups]
    assert all(hi < lo for (_, hi), (lo, _) in zip(bounds, bounds[1:], strict=False))


def test_no_copy_carries_a_clients_token() -> None:
    token = ("dwell-authorization", b"Bearer secret")
    for rng in (Range("persistent.t.ns.x", names.DELAYED, 3, 10, 20),
                Range("persistent.t.ns.x", names.REFILED, 3, 10, 20),
                Range("t.ns.x-s-RETRY", "t.ns.x", 0, 10, 20, "s", {12: 2}),
                Range("t.ns.x-s-DLQ", names.DELAYED, 0, 10, 20, "s", {12: 2})):
        _, _, _, headers, _ = output_record(
            rng, Message(12, b"k", b"v", [token, *DELAYED_HEADERS, token]), [])
        assert "dwell-authorization" not in dict(headers), rng


def test_a_record_is_of_a_topic_its_partitions_or_its_partitioned_topic() -> None:
    x = b"persistent://t/ns/x"
    assert same_topic(x, x)
    assert same_topic(b"persistent://t/ns/x-partition-2", x)
    assert same_topic(x, b"persistent://t/ns/x-partition-2")
    for carried in (b"persistent://t/ns/y", b"persistent://u/ns/x", b"", None, b"\xff",
                    b"persistent://t/ns/x-partition-", b"non-persistent://t/ns/x"):
        assert not same_topic(carried, x), carried
