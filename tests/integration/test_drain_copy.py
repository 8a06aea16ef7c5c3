"""The drain's record copy against the real Kafka, for ranges of topics that share a
partition of the delay log and overlap: every wanted record is copied exactly once.
A range lying inside another's span made the copy seek back in the middle of a polled
batch and take the rest of that batch (records it had read past) as the end of the next
group: its records were never copied, and the round reported success."""

from __future__ import annotations

import pytest
from pyroaring import BitMap64

from dwell.adapters import kafka
from dwell_spark.records import Range, copy_ranges

pytestmark = pytest.mark.integration


def test_overlapping_ranges_are_all_copied(kafka_bootstrap: str, unique: str) -> None:
    source, targets = f"copy-src-{unique}", [f"copy-{unique}-{x}" for x in "abcd"]
    kafka.ensure_topic(kafka_bootstrap, source, 2)
    for t in targets:
        kafka.ensure_topic(kafka_bootstrap, t, 1)
    p = kafka.Producer(kafka_bootstrap, linger_ms=20)
    futs = [p.send(source, b"%d" % i, key=b"k", partition=part)
            for part in (0, 1) for i in range(8000)]
    for f in futs:
        f.result(30)
    p.close()
    wide = Range(targets[0], source, 0, 0, 4500, offsets=BitMap64([0, 1500, 3000, 4500]))
    inside = Range(targets[1], source, 0, 100, 100)
    later = Range(targets[2], source, 0, 2500, 2600)
    # A second partition read in the same pass: the polled batches ask for its records
    # too, so they run past the first group's end of partition 0.
    other = Range(targets[3], source, 1, 0, 7999)
    stats = copy_ranges(kafka_bootstrap, [wide, inside, later, other])
    got = {t: sorted(int(r.value) for r in kafka.read_all(kafka_bootstrap, t))
           for t in targets}
    assert got == {targets[0]: [0, 1500, 3000, 4500], targets[1]: [100],
                   targets[2]: list(range(2500, 2601)), targets[3]: list(range(8000))}
    assert stats.written == 4 + 1 + 101 + 8000
