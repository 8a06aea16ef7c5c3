"""The publish rule (Pulsar PIP-315 max delay, PIP-437 fixed delay): whether a message is
accepted, given a forced delay, or rejected, and whether it must wait in the delay log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from dwell.core.backoff import MAX_DELAY_MS
from dwell.core.buckets import delivery_cutoff
from dwell.core.policy import DelayedDeliveryPolicies, EffectivePolicy

DISABLED_REASON: Final = "delayed delivery is disabled for this topic"
NON_PERSISTENT_REASON: Final = "non-persistent topics do not support delayed delivery"
# The class Pulsar's REST producer names in a rejection's errorMsg (it is the message of the
# ExecutionException wrapping the broker's NotAllowedException).
NOT_ALLOWED_EXCEPTION: Final = (
    "org.apache.pulsar.broker.service.BrokerServiceException$NotAllowedException")
# The longest delay dwell accepts, above every policy (DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS
# may lower it): a century, the bound of every other delay dwell handles (ack timeouts and
# redelivery backoff, dwell.core.backoff). A due time within it stays below the end of
# year 9999, past which a consumer's ack event is refused (dwell.core.invalid.MAX_TS_MS),
# and far below 2**53 ms, past which the index's bucket scores (Redis ZSET doubles) stop
# being exact; docs/architecture.md, "The longest delay", gives the rest.
DELAY_LIMIT_MS: Final = MAX_DELAY_MS


@dataclass(frozen=True, slots=True)
class Accept:
    """Publish with the producer's own ``deliver_at`` (None when there is none to keep).

    ``delay_ignored`` says why a requested delay was dropped; the publish still succeeds.
    """

    deliver_at: int | None
    delayed: bool
    delay_ignored: str | None = None


@dataclass(frozen=True, slots=True)
class Override:
    """Publish with the topic's fixed delay in place of whatever the producer asked for."""

    deliver_at: int
    requested_deliver_at: int | None
    delayed: bool

    @property
    def counts_as_override(self) -> bool:
        """Whether fixed_delay_overridden counts it: only when the producer set a time."""
        return self.requested_deliver_at is not None


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse the message: its delay exceeds the topic's max or the broker-wide limit;
    nothing is written."""

    max_delay_ms: int
    error: str
    error_code: ClassVar[int] = 2

    @classmethod
    def exceeding(cls, max_delay_ms: int) -> Reject:
        error = f"Exceeds max allowed delivery delay of {max_delay_ms} milliseconds"
        return cls(max_delay_ms, error)

    @property
    def full_error(self) -> str:
        """The errorMsg of Pulsar's REST producer for this rejection."""
        return f"{NOT_ALLOWED_EXCEPTION}: {self.error}"


Decision = Accept | Override | Reject


def over_delay_limit(policy: DelayedDeliveryPolicies, delay_limit_ms: int) -> str | None:
    """Why a namespace or topic policy may not be set under the broker-wide limit, or
    None: a fixed delay beyond it would reject every message. A larger max is accepted,
    as Pulsar accepts any max up to Long.MAX_VALUE: the limit still caps each message."""
    value = policy.fixedDeliveryDelayInMillis
    if value is not None and value > delay_limit_ms:
        return (f"fixedDeliveryDelayInMillis: {value} is more than the longest delay dwell "
                f"accepts, {delay_limit_ms} ms (DWELL_DELAYED_DELIVERY_DELAY_LIMIT_MS)")
    return None


def admit(
    *,
    deliver_at: int | None,
    deliver_after_ms: int | None,
    policy: EffectivePolicy,
    persistent: bool,
    publish_time: int,
    now: int,
    strict: bool = False,
    delay_limit_ms: int = DELAY_LIMIT_MS,
) -> Decision:
    """Decide one message's fate. ``publish_time`` (ms) is Pulsar's publishTime: when
    admission received the message, never the producer's eventTime; ``deliver_at``
    wins over ``deliver_after_ms``, as in Pulsar's producers. ``delay_limit_ms`` is the
    broker-wide limit: a delay beyond it is rejected whatever the policy, with the same
    error as a policy's max, naming the smaller of the two."""
    requested = deliver_at
    if requested is None and deliver_after_ms is not None:
        requested = publish_time + deliver_after_ms

    if not persistent:
        return Accept(None, False, NON_PERSISTENT_REASON if requested is not None else None)
    if not policy.active:
        return Accept(None, False, DISABLED_REASON if requested is not None else None)

    cutoff = delivery_cutoff(now, policy.tick_time_ms, strict)
    if policy.fixed_delay_ms > 0:
        # PIP-437's goal is one delay for every message on the topic, so messages without
        # a deliverAt get it too, and the max check does not apply.
        # A fixed delay past the limit (a policy stored before the limit was lowered) would
        # be accepted and never honoured: refused instead.
        if policy.fixed_delay_ms > delay_limit_ms:
            return Reject.exceeding(delay_limit_ms)
        fixed_at = publish_time + policy.fixed_delay_ms
        return Override(fixed_at, requested, fixed_at > cutoff)
    if requested is None:
        return Accept(None, False)
    limit = delay_limit_ms
    if 0 < policy.max_delay_ms < limit:
        limit = policy.max_delay_ms
    if requested - publish_time > limit:
        return Reject.exceeding(limit)
    return Accept(requested, requested > cutoff)
