"""How the index stores positions: portable run-optimized `BitMap64` blobs, packed
12-byte delta entries (u32 field, u64 offset) appended between compactions, and the
digest merge-4.lua compares before it writes a bucket."""

from __future__ import annotations

import hashlib
from typing import Final

import numpy as np
from pyroaring import BitMap64

DELTA_DTYPE: Final = np.dtype([("field", "<u4"), ("offset", "<u8")])


def encode(bm: BitMap64) -> bytes:
    bm.run_optimize()
    return bytes(bm.serialize())


def decode(blob: bytes) -> BitMap64:
    return BitMap64.deserialize(blob)


def bucket_digest(fields: dict[bytes, bytes]) -> str:
    """SHA-1 of a bucket HASH as merge-4.lua computes it (the compare-and-set token)."""
    h = hashlib.sha1()
    for f in sorted(fields):
        v = fields[f]
        h.update(f + b":" + str(len(v)).encode() + b":" + v)
    return h.hexdigest()


def pack_deltas(fields: np.ndarray, offsets: np.ndarray) -> bytes:
    buf = np.empty(len(offsets), dtype=DELTA_DTYPE)
    buf["field"] = fields
    buf["offset"] = offsets
    return buf.tobytes()


def unpack_deltas(raw: bytes) -> dict[int, np.ndarray]:
    """field id -> offsets (unsorted, may repeat) of a delta string."""
    arr = np.frombuffer(raw, dtype=DELTA_DTYPE, count=len(raw) // DELTA_DTYPE.itemsize)
    out: dict[int, np.ndarray] = {}
    for f in np.unique(arr["field"]).tolist():
        out[int(f)] = arr["offset"][arr["field"] == f]
    return out
