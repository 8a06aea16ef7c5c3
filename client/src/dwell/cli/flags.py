"""The pure part of `dwell-admin`: turning command-line flags into request bodies and
names, with pulsar-admin's messages. No I/O, so it is unit-tested on its own."""

from __future__ import annotations

from dwell.core.durations import parse_duration_ms
from dwell.core.topics import PERSISTENT, InvalidTopicName, TopicName, validate_namespace

# pulsar-admin's exact text, kept so that scripts written against it still match.
ENABLE_OR_DISABLE = "Need to specify either --enable or --disable"


class FlagError(ValueError):
    """Flags that do not make a request; the message is shown as is."""


def delayed_delivery_body(*, enable: bool, disable: bool, time: str | None = None,
                          max_delay: str | None = None, fixed_delay: str | None = None
                          ) -> dict[str, bool | int]:
    """The DelayedDeliveryPolicies body for `set-delayed-delivery`.

    Exactly one of enable/disable. A duration flag that is not given is left out of the
    body, so that field inherits from the namespace or the broker (pulsar-admin would send
    its defaults, tickTime 1000 and max 0, and so override them).
    """
    if enable == disable:
        raise FlagError(ENABLE_OR_DISABLE)
    body: dict[str, bool | int] = {"active": enable}
    for flag, field, text in (("--time", "tickTime", time),
                              ("--maxDelay", "maxDeliveryDelayInMillis", max_delay),
                              ("--fixed-delay", "fixedDeliveryDelayInMillis", fixed_delay)):
        if text is None:
            continue
        try:
            body[field] = parse_duration_ms(text)
        except ValueError as exc:
            raise FlagError(f"{flag}: {exc}") from exc
    if body.get("tickTime") == 0:
        raise FlagError("--time: the tick time must be at least 1ms")
    return body


def namespace_name(text: str) -> tuple[str, str]:
    """`tenant/namespace` → (tenant, namespace)."""
    tenant, sep, ns = text.partition("/")
    if not sep or "/" in ns:
        raise FlagError(f"namespace {text!r} must be written tenant/namespace")
    try:
        validate_namespace(tenant, ns)
    except InvalidTopicName as exc:
        raise FlagError(str(exc)) from exc
    return tenant, ns


def persistent_topic(text: str) -> TopicName:
    """`persistent://t/ns/x`, or `t/ns/x` for short (persistent, as in pulsar-admin)."""
    try:
        topic = TopicName.parse(text if "://" in text else f"{PERSISTENT}://{text}")
    except InvalidTopicName as exc:
        raise FlagError(str(exc)) from exc
    if not topic.persistent:
        raise FlagError(f"topic {text!r}: only persistent topics have delayed-delivery "
                        "policies (non-persistent topics never delay)")
    return topic
