"""dwell.tracker.ingest.decode: a polled batch as arrays, bad header values marked."""

from __future__ import annotations

import numpy as np

from dwell.adapters.kafka import Columns
from dwell.tracker.ingest import Decoded, decode, last_offsets


def test_decode_keeps_each_record_in_its_row_and_codes_its_key() -> None:
    batch = Columns([0, 1, 0, 2], [5, 7, 6, 1], [b"b", b"a", b"b", None],
                    [[b"100", b"200", b"x", b"300"], [b"1000", b"1000", b"1000", None]])
    d = decode(batch)
    assert len(d) == 4
    assert d.partitions.tolist() == [0, 1, 0, 2] and d.offsets.tolist() == [5, 7, 6, 1]
    assert d.keys == [b"b", b"a", None]  # in order of first appearance
    assert [d.keys[c] for c in d.codes.tolist()] == batch.keys
    assert d.ok.tolist() == [True, True, False, False]  # "x"; no tick-time
    assert d.deliver_at[d.ok].tolist() == [100, 200]
    assert d.tick[d.ok].tolist() == [1000, 1000]


def test_decode_marks_a_tick_time_below_one_and_values_out_of_int64() -> None:
    batch = Columns([0, 0, 0], [1, 2, 3], [b"t"] * 3,
                    [[b"1", b"2", b"%d" % 2**63], [b"0", b"5", b"5"]])
    d = decode(batch)
    assert d.ok.tolist() == [False, True, False]
    assert d.codes.tolist() == [0, 0, 0] and d.keys == [b"t"]


def test_an_empty_batch_decodes_to_empty_arrays() -> None:
    d = decode(Columns([], [], [], [[], []]))
    assert len(d) == 0 and d.keys == [] and d.codes.dtype == np.intp


def test_last_offsets_takes_each_partitions_last_record() -> None:
    parts = np.array([3, 1, 3, 1, 2], dtype=np.int64)
    offs = np.array([10, 4, 11, 9, 0], dtype=np.int64)
    assert last_offsets(parts, offs) == {1: 9, 2: 0, 3: 11}
    assert last_offsets(parts[:0], offs[:0]) == {}


def test_decoded_batches_concatenate_in_order_with_their_keys_merged() -> None:
    a = decode(Columns([0, 0], [1, 2], [b"x", b"y"], [[b"10", b"11"], [b"5", b"5"]]))
    b = decode(Columns([1], [7], [b"y"], [[b"12"], [b"5"]]))
    c = decode(Columns([], [], [], [[], []]))
    d = decode(Columns([2, 2], [3, 4], [b"z", b"x"], [[b"13", b"bad"], [b"5", b"5"]]))
    one = Decoded.concat([a, b, c, d])
    assert one.offsets.tolist() == [1, 2, 7, 3, 4]
    assert one.partitions.tolist() == [0, 0, 1, 2, 2]
    assert [one.keys[k] for k in one.codes.tolist()] == [b"x", b"y", b"y", b"z", b"x"]
    assert sorted(one.keys) == [b"x", b"y", b"z"]
    assert one.ok.tolist() == [True, True, True, True, False]
    assert one.deliver_at[one.ok].tolist() == [10, 11, 12, 13]
    assert Decoded.concat([a]) is a


def test_schedule_keys_are_decoded_and_kept_through_concat() -> None:
    """Rows with a schedule key, which of them are releases (no deliver-at), and a key
    admission would refuse (empty, over 256 bytes) is no key."""
    a = decode(Columns([0, 0, 0, 0], [1, 2, 3, 4], [b"t"] * 4,
                       [[b"10", None, b"12", b"13"], [b"5", None, b"5", b"5"],
                        [b"k", b"k", b"", b"x" * 257]]))
    assert a.keyed.tolist() == [0, 1]
    assert a.schedule_keys == [b"k", b"k"]
    assert a.releases.tolist() == [False, True]
    assert a.ok.tolist() == [True, False, True, True]
    b = decode(Columns([0], [5], [b"t"], [[b"14"], [b"5"], [None]]))
    c = decode(Columns([0], [6], [b"t"], [[b"15"], [b"5"], [b"j"]]))
    assert len(b.keyed) == 0
    one = Decoded.concat([a, b, c])
    assert one.keyed.tolist() == [0, 1, 5]
    assert one.schedule_keys == [b"k", b"k", b"j"]
    assert one.releases.tolist() == [False, True, False]
