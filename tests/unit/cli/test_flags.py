"""dwell-admin's pure flag handling: bodies built from flags, pulsar-admin's messages."""

from __future__ import annotations

import pytest

from dwell.cli.flags import (
    ENABLE_OR_DISABLE,
    FlagError,
    delayed_delivery_body,
    namespace_name,
    persistent_topic,
)


def test_pulsar_example_body() -> None:
    # pulsar-admin's documented example: -e -t 1s -md 5s
    assert delayed_delivery_body(enable=True, disable=False, time="1s", max_delay="5s") == {
        "tickTime": 1000, "active": True, "maxDeliveryDelayInMillis": 5000}


def test_flags_left_out_are_not_sent_so_they_inherit() -> None:
    assert delayed_delivery_body(enable=True, disable=False) == {"active": True}
    assert delayed_delivery_body(enable=False, disable=True, fixed_delay="5m") == {
        "active": False, "fixedDeliveryDelayInMillis": 300_000}


@pytest.mark.parametrize(("enable", "disable"), [(True, True), (False, False)])
def test_exactly_one_of_enable_disable(enable: bool, disable: bool) -> None:
    with pytest.raises(FlagError) as err:
        delayed_delivery_body(enable=enable, disable=disable, time="1s")
    assert str(err.value) == ENABLE_OR_DISABLE == "Need to specify either --enable or --disable"


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"time": "5x"}, "--time"), ({"max_delay": "-1s"}, "--maxDelay"),
    ({"fixed_delay": "1.5s"}, "--fixed-delay"), ({"time": "0"}, "--time")])
def test_bad_durations_name_the_flag(kwargs: dict[str, str], flag: str) -> None:
    with pytest.raises(FlagError, match=f"^{flag}: "):
        delayed_delivery_body(enable=True, disable=False, **kwargs)


def test_durations_take_units_and_bare_seconds() -> None:
    body = delayed_delivery_body(enable=True, disable=False, time="500ms", max_delay="10d",
                                 fixed_delay="30")
    assert body == {"active": True, "tickTime": 500, "maxDeliveryDelayInMillis": 864_000_000,
                    "fixedDeliveryDelayInMillis": 30_000}


def test_namespace_name() -> None:
    assert namespace_name("t1/ns") == ("t1", "ns")
    for bad in ("t1", "t1/ns/x", "dwell/ns", "t1/", "t 1/ns"):
        with pytest.raises(FlagError):
            namespace_name(bad)


def test_persistent_topic() -> None:
    assert str(persistent_topic("persistent://t/ns/x")) == "persistent://t/ns/x"
    assert str(persistent_topic("t/ns/x")) == "persistent://t/ns/x"
    with pytest.raises(FlagError, match="only persistent"):
        persistent_topic("non-persistent://t/ns/x")
    with pytest.raises(FlagError):
        persistent_topic("persistent://t/ns")
