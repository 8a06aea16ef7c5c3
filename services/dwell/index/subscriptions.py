"""The subscription registry: each subscription's redelivery settings (ack timeout,
backoffs, max redeliveries), validated with Pulsar's builder messages, stored in
`dwell:subs:{topic}`. Deleting a subscription deletes its redelivery index too."""

from __future__ import annotations

import json
from typing import Any, Final

import redis as redislib

from dwell import keys
from dwell.core.backoff import ExponentialRedeliveryBackoff, validate_ack_timeout_ms
from dwell.index.redelivery import SubscriptionIndex

FIELDS: Final = ("ackTimeoutMs", "ackTimeoutRedeliveryBackoff", "negativeAckRedeliveryBackoff",
                 "maxRedeliverCount")
# Pulsar's ConsumerBuilderImpl.deadLetterPolicy check.
MAX_REDELIVER_ERROR: Final = "MaxRedeliverCount must be > 0."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate(body: Any) -> dict[str, Any]:
    """The normalized settings, or ValueError whose message names the field."""
    if not isinstance(body, dict):
        raise ValueError("body: must be a JSON object")
    for k in body:
        if k not in FIELDS:
            raise ValueError(f"{k}: unknown field (expected one of {', '.join(FIELDS)})")
    out: dict[str, Any] = {}
    ack = body.get("ackTimeoutMs", 0)
    if not _is_int(ack) or ack < 0:
        raise ValueError("ackTimeoutMs: must be a non-negative integer (milliseconds)")
    try:
        out["ackTimeoutMs"] = validate_ack_timeout_ms(ack)
    except ValueError as exc:
        raise ValueError(f"ackTimeoutMs: {exc}") from None
    for name in ("ackTimeoutRedeliveryBackoff", "negativeAckRedeliveryBackoff"):
        raw = body.get(name)
        if raw is None:
            out[name] = None
            continue
        try:
            out[name] = ExponentialRedeliveryBackoff.from_json(raw).to_json()
        except ValueError as exc:
            msg = str(exc).removeprefix("backoff: ")
            raise ValueError(f"{name}: {msg}") from None
    mrc = body.get("maxRedeliverCount")
    if mrc is not None:
        if not _is_int(mrc):
            raise ValueError("maxRedeliverCount: must be an integer")
        if mrc <= 0:
            raise ValueError(f"maxRedeliverCount: {MAX_REDELIVER_ERROR}")
    out["maxRedeliverCount"] = mrc
    return out


def put(r: redislib.Redis, topic: str, sub: str, settings: dict[str, Any]) -> None:
    r.hset(keys.subscriptions(topic), sub, json.dumps(settings, sort_keys=True))


def get(r: redislib.Redis, topic: str, sub: str) -> dict[str, Any] | None:
    raw = r.hget(keys.subscriptions(topic), sub)
    return json.loads(raw) if raw is not None else None


def list_all(r: redislib.Redis, topic: str) -> dict[str, dict[str, Any]]:
    return {k.decode(): json.loads(v) for k, v in r.hgetall(keys.subscriptions(topic)).items()}


def delete(r: redislib.Redis, topic: str, sub: str) -> bool:
    """Remove the subscription and its redelivery index; False when it did not exist."""
    existed = bool(r.hdel(keys.subscriptions(topic), sub))
    SubscriptionIndex(r, topic, sub).drop()
    return existed
