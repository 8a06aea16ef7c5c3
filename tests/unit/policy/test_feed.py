"""Reading versions off `dwell.policies` records, including ones that are not ours."""

from __future__ import annotations

from dwell.adapters.kafka import Record
from dwell.policy.feed import record_version


def _record(value: bytes | None, headers: dict[str, bytes] | None = None) -> Record:
    return Record("dwell.policies", 0, 0, b"ns:t/ns", value, headers or {}, 0)


def test_version_from_header_then_value() -> None:
    assert record_version(_record(None, {"dwell-version": b"12"})) == 12
    assert record_version(_record(b'{"version": 5, "scope": "ns:t/ns"}')) == 5


def test_foreign_records_have_no_version() -> None:
    for value in (b"{}", b"[1]", b"not json", b'{"version": "5"}', None):
        assert record_version(_record(value)) is None
    assert record_version(_record(b"{}", {"dwell-version": b"x"})) is None
