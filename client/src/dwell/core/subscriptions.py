"""A subscription's redelivery settings (ack timeout, backoffs, max redeliveries): the
one shape the SDK registers and sends on its events, the tracker validates and stores,
and the backoff job applies. Validation answers with Pulsar's builder messages, each
prefixed with the JSON field it is about (the tracker's HTTP 400 reasons)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dwell.core.backoff import ExponentialRedeliveryBackoff, validate_ack_timeout_ms

# The JSON field names: integers (milliseconds, a count) and backoff objects.
ACK_TIMEOUT_MS: Final = "ackTimeoutMs"
ACK_TIMEOUT_BACKOFF: Final = "ackTimeoutRedeliveryBackoff"
NACK_BACKOFF: Final = "negativeAckRedeliveryBackoff"
MAX_REDELIVER_COUNT: Final = "maxRedeliverCount"
FIELDS: Final = (ACK_TIMEOUT_MS, ACK_TIMEOUT_BACKOFF, NACK_BACKOFF, MAX_REDELIVER_COUNT)
INTEGER_FIELDS: Final = (ACK_TIMEOUT_MS, MAX_REDELIVER_COUNT)
BACKOFF_FIELDS: Final = (ACK_TIMEOUT_BACKOFF, NACK_BACKOFF)
# Pulsar's ConsumerBuilderImpl.deadLetterPolicy check.
MAX_REDELIVER_ERROR: Final = "MaxRedeliverCount must be > 0."
# Pulsar's redelivery counts (DeadLetterPolicy.maxRedeliverCount, a message's
# redeliveryCount) are Java ints.
MAX_REDELIVERY_COUNT: Final = 2**31 - 1


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _backoff(name: str, raw: Any) -> ExponentialRedeliveryBackoff | None:
    if raw is None:
        return None
    try:
        return ExponentialRedeliveryBackoff.from_json(raw)
    except ValueError as exc:
        msg = str(exc).removeprefix("backoff: ")
        raise ValueError(f"{name}: {msg}") from None


@dataclass(frozen=True)
class SubscriptionSettings:
    """``{"ackTimeoutMs", "ackTimeoutRedeliveryBackoff", "negativeAckRedeliveryBackoff",
    "maxRedeliverCount"}``; 0 switches the ack timeout off, None leaves a backoff or the
    dead-letter limit unset."""

    ack_timeout_ms: int = 0
    ack_timeout_redelivery_backoff: ExponentialRedeliveryBackoff | None = None
    negative_ack_redelivery_backoff: ExponentialRedeliveryBackoff | None = None
    max_redeliver_count: int | None = None

    def __post_init__(self) -> None:
        try:
            validate_ack_timeout_ms(self.ack_timeout_ms)
        except ValueError as exc:
            raise ValueError(f"ackTimeoutMs: {exc}") from None
        mrc = self.max_redeliver_count
        if mrc is not None and mrc <= 0:
            raise ValueError(f"maxRedeliverCount: {MAX_REDELIVER_ERROR}")
        if mrc is not None and mrc > MAX_REDELIVERY_COUNT:
            raise ValueError(f"maxRedeliverCount: must be at most {MAX_REDELIVERY_COUNT}")

    @classmethod
    def from_json(cls, body: Any) -> SubscriptionSettings:
        """Validate a JSON body (absent or null fields default); ValueError whose message
        names the field."""
        if not isinstance(body, Mapping):
            raise ValueError("body: must be a JSON object")
        for k in body:
            if k not in FIELDS:
                raise ValueError(f"{k}: unknown field (expected one of {', '.join(FIELDS)})")
        ack = body.get("ackTimeoutMs", 0)
        if not _is_int(ack) or ack < 0:
            raise ValueError("ackTimeoutMs: must be a non-negative integer (milliseconds)")
        try:
            validate_ack_timeout_ms(ack)
        except ValueError as exc:
            raise ValueError(f"ackTimeoutMs: {exc}") from None
        ack_backoff = _backoff("ackTimeoutRedeliveryBackoff",
                               body.get("ackTimeoutRedeliveryBackoff"))
        nack_backoff = _backoff("negativeAckRedeliveryBackoff",
                                body.get("negativeAckRedeliveryBackoff"))
        mrc = body.get("maxRedeliverCount")
        if mrc is not None and not _is_int(mrc):
            raise ValueError("maxRedeliverCount: must be an integer")
        return cls(ack, ack_backoff, nack_backoff, mrc)

    def to_json(self, *, omit_unset: bool = False) -> dict[str, Any]:
        """Every field, unset ones as null (the tracker's registry and its answers); with
        ``omit_unset``, unset backoffs and limit left out (the SDK's request and events)."""
        ack = self.ack_timeout_redelivery_backoff
        nack = self.negative_ack_redelivery_backoff
        out: dict[str, Any] = {
            ACK_TIMEOUT_MS: self.ack_timeout_ms,
            ACK_TIMEOUT_BACKOFF: ack.to_json() if ack is not None else None,
            NACK_BACKOFF: nack.to_json() if nack is not None else None,
            MAX_REDELIVER_COUNT: self.max_redeliver_count,
        }
        if omit_unset:
            return {k: v for k, v in out.items() if v is not None}
        return out
