"""Redelivery timing (Pulsar PIP-106 negative-ack backoff, PIP-130 ack-timeout backoff):
the exponential backoff, and when an unacked or nacked message comes back."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

DEFAULT_NACK_DELAY_MS: Final = 60000
MIN_NACK_DELAY_MS: Final = 100
MIN_ACK_TIMEOUT_MS: Final = 1000
# Pulsar's ConsumerBuilder says "should be greater than 1000 ms", yet accepts 1000 and 0.
ACK_TIMEOUT_ERROR: Final = "Ack timeout should be 0 (off) or at least 1000 ms"
# Upper bounds Pulsar leaves to Java's int and long: a delay or ack timeout of a century
# and a multiplier of 1000 are past any real consumer's, and keep every due time an event
# can produce (its ts, plus an ack timeout, plus a backoff delay) far inside a signed
# 64-bit millisecond count, which Arrow and Redis scores need.
MAX_DELAY_MS: Final = 100 * 365 * 86_400_000
MAX_MULTIPLIER: Final = 1000.0

_JSON_FIELDS: Final = {
    "minDelayMs": "min_delay_ms",
    "maxDelayMs": "max_delay_ms",
    "multiplier": "multiplier",
}


@dataclass(frozen=True)
class ExponentialRedeliveryBackoff:
    """Pulsar's MultiplierRedeliveryBackoff: ``min * multiplier^count``, capped at ``max``.

    Delays are in milliseconds. A value out of range (a negative minimum, a maximum below
    the minimum or above 100 years, a multiplier not above 1 or above 1000) raises
    ValueError."""

    min_delay_ms: int = 10000
    max_delay_ms: int = 600000
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        # Pulsar's messages, checked in Pulsar's order.
        if self.min_delay_ms < 0:
            raise ValueError("min delay time must be >= 0")
        if self.max_delay_ms < self.min_delay_ms:
            raise ValueError("maxDelayMs must be >= minDelayMs")
        if self.max_delay_ms > MAX_DELAY_MS:
            raise ValueError(f"maxDelayMs must be at most {MAX_DELAY_MS} (100 years)")
        if not self.multiplier > 1:  # also catches NaN
            raise ValueError("multiplier must be > 1")
        if math.isinf(self.multiplier):
            raise ValueError("multiplier must be finite")
        if self.multiplier > MAX_MULTIPLIER:
            raise ValueError(f"multiplier must be at most {MAX_MULTIPLIER:g}")

    @staticmethod
    def builder() -> ExponentialRedeliveryBackoffBuilder:
        """A builder starting from the defaults: 10 s, 10 min, multiplier 2."""
        return ExponentialRedeliveryBackoffBuilder()

    def next(self, redelivery_count: int) -> int:
        """Delay (ms) before redelivery number ``redelivery_count + 1``."""
        if redelivery_count <= 0 or self.min_delay_ms <= 0:
            return self.min_delay_ms
        try:
            delay = self.min_delay_ms * self.multiplier**redelivery_count
        except OverflowError:
            return self.max_delay_ms
        # min * huge can still reach inf without raising; inf >= max, so the cap covers it.
        if delay >= self.max_delay_ms:
            return self.max_delay_ms
        return int(delay)

    def to_json(self) -> dict[str, int | float]:
        return {
            "minDelayMs": self.min_delay_ms,
            "maxDelayMs": self.max_delay_ms,
            "multiplier": self.multiplier,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExponentialRedeliveryBackoff:
        """Build from ``{"minDelayMs", "maxDelayMs", "multiplier"}``; absent keys default."""
        if not isinstance(d, Mapping):
            raise ValueError("backoff must be a JSON object")
        for key in d:
            if key not in _JSON_FIELDS:
                raise ValueError(f"backoff: unknown field {key!r}")
        kwargs: dict[str, Any] = {}
        for key, attr in _JSON_FIELDS.items():
            if key not in d:
                continue
            value = d[key]
            # bool is an int subclass; JSON true is not a number of milliseconds.
            if isinstance(value, bool):
                raise ValueError(f"backoff: {key} must be a number, got a boolean")
            if key == "multiplier":
                if not isinstance(value, (int, float)):
                    raise ValueError(f"backoff: {key} must be a number")
                value = float(value)
            elif not isinstance(value, int):
                raise ValueError(f"backoff: {key} must be an integer")
            kwargs[attr] = value
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"backoff: {exc}") from None


class ExponentialRedeliveryBackoffBuilder:
    """Pulsar-style builder: ``builder().min_delay_ms(1000).max_delay_ms(60000).build()``."""

    def __init__(self) -> None:
        self._min = 10000
        self._max = 600000
        self._multiplier = 2.0

    def min_delay_ms(self, value: int) -> ExponentialRedeliveryBackoffBuilder:
        """The delay before the first redelivery (ms)."""
        self._min = value
        return self

    def max_delay_ms(self, value: int) -> ExponentialRedeliveryBackoffBuilder:
        """The longest delay (ms)."""
        self._max = value
        return self

    def multiplier(self, value: float) -> ExponentialRedeliveryBackoffBuilder:
        """The factor from one delay to the next."""
        self._multiplier = float(value)
        return self

    def build(self) -> ExponentialRedeliveryBackoff:
        """The backoff; ValueError for a value out of range."""
        return ExponentialRedeliveryBackoff(self._min, self._max, self._multiplier)


def next_delay(count: int, backoff: ExponentialRedeliveryBackoff) -> int:
    """Delay (ms) before the redelivery after ``count`` earlier ones."""
    return backoff.next(count)


def validate_ack_timeout_ms(ms: int) -> int:
    """Return ``ms`` if it is 0 (ack timeout off) or from 1000 ms to MAX_DELAY_MS."""
    if ms != 0 and ms < MIN_ACK_TIMEOUT_MS:
        raise ValueError(ACK_TIMEOUT_ERROR)
    if ms > MAX_DELAY_MS:
        raise ValueError(f"Ack timeout should be at most {MAX_DELAY_MS} ms (100 years)")
    return ms


def ack_timeout_redelivery_at(
    delivered_ts: int,
    ack_timeout_ms: int,
    backoff: ExponentialRedeliveryBackoff | None,
    redelivery_count: int,
) -> int:
    """When a message delivered at ``delivered_ts`` and never acked comes back (PIP-130)."""
    extra = next_delay(redelivery_count, backoff) if backoff is not None else 0
    return delivered_ts + ack_timeout_ms + extra


def nack_redelivery_at(
    nack_ts: int,
    backoff: ExponentialRedeliveryBackoff | None,
    redelivery_count: int,
    nack_delay_ms: int = DEFAULT_NACK_DELAY_MS,
) -> int:
    """When a message negatively acked at ``nack_ts`` comes back (PIP-106).

    Without a backoff the fixed nack delay applies, raised to 100 ms as Pulsar's
    NegativeAcksTracker does so a tight nack loop cannot spin.
    """
    if backoff is not None:
        return nack_ts + next_delay(redelivery_count, backoff)
    return nack_ts + max(nack_delay_ms, MIN_NACK_DELAY_MS)
