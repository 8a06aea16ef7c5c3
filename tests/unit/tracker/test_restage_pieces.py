"""How a restage round is cut into pieces: every position once, in (bucket, field,
offset) order, no piece above its size."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap64

from dwell.tracker.restage import pieces

_parts = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5),
                            st.sets(st.integers(0, 2**40 - 1), min_size=1, max_size=60)),
                  max_size=12)


@given(_parts, st.integers(1, 100))
def test_pieces_keep_every_position_in_order_and_stay_small(parts, size) -> None:
    uniq = {(b, f): offs for b, f, offs in parts}  # one bitmap per (bucket, field)
    ordered = sorted(((b, f, BitMap64(o)) for (b, f), o in uniq.items()), key=lambda x: x[:2])
    cut = list(pieces(ordered, size))
    assert all(0 < sum(len(o) for _, _, o in p) <= size for p in cut)
    assert all(sum(len(o) for _, _, o in p) == size for p in cut[:-1])
    got = [(b, f, int(o)) for p in cut for b, f, offs in p for o in offs]
    assert got == [(b, f, o) for b, f, bm in ordered for o in bm]
