"""Pure parts of the index: delta packing, bucket math, blob round-trips and
the compare-and-set digest (which merge-4.lua recomputes server side)."""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap64

from dwell.core.buckets import bucket_start, bucket_starts
from dwell.index.roaring import bucket_digest, decode, encode, pack_deltas, unpack_deltas

offsets = st.lists(st.integers(0, 2**63 - 1), max_size=200)


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1)), max_size=300))
def test_deltas_round_trip_as_sets(rows):
    fields = np.array([f for f, _ in rows], dtype=np.uint64)
    offs = np.array([o for _, o in rows], dtype=np.uint64)
    got = unpack_deltas(pack_deltas(fields, offs))
    want: dict[int, set[int]] = {}
    for f, o in rows:
        want.setdefault(f, set()).add(o)
    assert {f: set(v.tolist()) for f, v in got.items()} == want


@given(offsets)
def test_blob_round_trip(values):
    bm = BitMap64(values)
    assert decode(encode(bm)) == bm


@given(st.lists(st.integers(-(2**50), 2**50), min_size=1, max_size=100), st.integers(1, 10**6))
def test_vector_bucket_math_matches_core(deliver_ats, tick):
    got = bucket_starts(np.array(deliver_ats, dtype=np.int64), tick).tolist()
    assert got == [bucket_start(d, tick) for d in deliver_ats]


def test_digest_of_an_empty_bucket_is_sha1_of_nothing():
    assert bucket_digest({}) == hashlib.sha1(b"").hexdigest()


def test_digest_ignores_field_order_and_sees_content():
    a = bucket_digest({b"1": b"xy", b"0": b"z"})
    assert a == bucket_digest({b"0": b"z", b"1": b"xy"})
    assert a != bucket_digest({b"0": b"z", b"1": b"xz"})
