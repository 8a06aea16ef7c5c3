"""Human-readable durations as pulsar-admin reads them (``1s 10m 5h 3d 2w 1y``, a plain
number being seconds), plus ``ms`` for sub-second tick times, parsed to and formatted from
whole milliseconds."""

from __future__ import annotations

import re
from typing import Final

MAX_DURATION_MS: Final = 2**63 - 1

# Largest unit first: format_duration_ms walks this order, and compound input must follow it.
_UNITS_MS: Final = {
    "y": 365 * 24 * 3_600_000,
    "w": 7 * 24 * 3_600_000,
    "d": 24 * 3_600_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
}
_ORDER: Final = list(_UNITS_MS)
_BARE = re.compile(r"[0-9]+")
# "ms" must be tried before "m" or "10ms" would read as ten minutes and a stray "s".
_TOKEN = re.compile(r"([0-9]+)(ms|y|w|d|h|m|s)", re.IGNORECASE)


def _invalid(text: str) -> ValueError:
    return ValueError(
        f"invalid duration {text!r}: use a number with a unit, e.g. 500ms, 1s, 10m, 5h, 3d"
    )


def parse_duration_ms(text: str) -> int:
    """Parse a duration to milliseconds.

    A bare integer means seconds and ``y`` is 365 days, as in pulsar-admin
    (`TimeUnitToMillisConverter` over `RelativeTimeUtil.parseRelativeTimeInSeconds`, which
    knows s m h d w y and no ``ms``: ``ms`` is dwell's own, for sub-second tick times).
    Units are case-insensitive. Compound forms written largest unit first (``1m30s``, the output of
    :func:`format_duration_ms`) are accepted too; negatives and fractions are not.
    """
    s = text.strip()
    if _BARE.fullmatch(s):
        total = int(s) * 1000
    else:
        total = 0
        pos = 0
        last_rank = -1
        for m in _TOKEN.finditer(s):
            if m.start() != pos:
                raise _invalid(text)
            rank = _ORDER.index(m.group(2).lower())
            if rank <= last_rank:
                raise _invalid(text)
            last_rank = rank
            total += int(m.group(1)) * _UNITS_MS[m.group(2).lower()]
            pos = m.end()
        if pos == 0 or pos != len(s):
            raise _invalid(text)
    if total > MAX_DURATION_MS:
        raise ValueError(f"invalid duration {text!r}: longer than {MAX_DURATION_MS} ms")
    return total


def format_duration_ms(ms: int) -> str:
    """Format milliseconds readably: 5000 → ``5s``, 90000 → ``1m30s``, 1500 → ``1500ms``.

    The result always parses back to ``ms`` with :func:`parse_duration_ms`.
    """
    if ms < 0:
        raise ValueError(f"duration must not be negative, got {ms} ms")
    if ms == 0:
        return "0s"
    # Sub-second remainders stay in plain ms: "1500ms" reads better than "1s500ms".
    if ms % 1000:
        return f"{ms}ms"
    out: list[str] = []
    rest = ms
    for unit, size in _UNITS_MS.items():
        if rest >= size:
            count, rest = divmod(rest, size)
            out.append(f"{count}{unit}")
    return "".join(out)
