"""How a restage round is cut into pieces: every position once, by offset (each field's
pieces read disjoint ranges of its log, so a round reads the log once), in (bucket,
field, offset) order within a piece, no piece much above its size."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap64

from dwell.tracker.restage import pieces

# A position (field, offset) is a record: it lies in one bucket only.
_positions = st.dictionaries(st.tuples(st.integers(0, 5), st.integers(0, 2**40 - 1)),
                             st.integers(0, 50), max_size=300)


def _parts(positions: dict[tuple[int, int], int]) -> list[tuple[int, int, BitMap64]]:
    bms: dict[tuple[int, int], BitMap64] = {}
    for (f, off), b in positions.items():
        bms.setdefault((b, f), BitMap64()).add(off)
    return sorted(((b, f, bm) for (b, f), bm in bms.items()), key=lambda x: x[:2])


@given(_positions, st.integers(1, 100))
def test_pieces_cut_by_offset_keep_every_position_once(positions, size) -> None:
    parts = _parts(positions)
    cut = list(pieces(parts, size))
    fields = {f for f, _ in positions}
    assert len(cut) <= -(-len(positions) // size)
    assert all(0 < sum(len(o) for _, _, o in p) <= size + len(fields) for p in cut)
    got = [(f, int(o), b) for p in cut for b, f, offs in p for o in offs]
    assert sorted(got) == sorted((f, o, b) for (f, o), b in positions.items())
    for p in cut:
        assert [x[:2] for x in p] == sorted({x[:2] for x in p})
        assert all(list(offs) == sorted(offs) for _, _, offs in p)
    # Each field's pieces cover ranges of its offsets that follow one another.
    for f in fields:
        ranges = [(min(o), max(o)) for p in cut
                  if (o := [int(x) for _, g, offs in p if g == f for x in offs])]
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))


def test_a_round_of_one_piece_keeps_each_bucket_whole() -> None:
    parts = _parts({(0, off): off % 3 for off in range(30)})
    [piece] = pieces(parts, 100)
    assert [(b, f, list(o)) for b, f, o in piece] == [
        (b, 0, list(range(b, 30, 3))) for b in range(3)]
