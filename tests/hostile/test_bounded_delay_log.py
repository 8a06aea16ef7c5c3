"""The tracker's ingest against delay-log records anyone who may write `dwell.delayed`
could forge, on real Redis: a key that is not UTF-8 or names no Pulsar topic is counted
and skipped with the batch's other bad records, and the good records around it are
indexed (issue 28, "every Kafka input bounded")."""

from __future__ import annotations

import pytest

from dwell.adapters import redis as redis_adapter
from dwell.adapters.kafka import Columns
from dwell.tracker.ingest import Ingest

pytestmark = pytest.mark.integration


def test_forged_keys_are_skipped_and_the_batch_is_indexed(redis_url: str,
                                                          unique: str) -> None:
    r = redis_adapter.connect(redis_url)
    t0 = 1_900_000_000_000
    good = f"persistent://{unique}/ns/a".encode()
    keys = [good, b"\xff\xfe", b"x" * 100_000, f"persistent://{unique}/ns/{'y' * 300}".encode(),
            b"persistent://" + unique.encode() + b"/ns/{a}\n", good]
    batch = Columns([0] * len(keys), list(range(len(keys))), keys,
                    [[b"%d" % t0] * len(keys), [b"1000"] * len(keys)])
    ing = Ingest(r)
    assert ing.index_batch(batch) == 2
    assert ing.dirty_topics == {good.decode()}
    assert not [k for k in r.scan_iter(match="dwell:*xxxxxxxx*", count=1000)]
