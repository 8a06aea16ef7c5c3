"""dwell.settings: DWELL_ENV=production refuses what runs unprotected unless each is
allowed by name, and says what and how."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from dwell.adapters.kafka import DWELL_TOPIC_DEFAULTS
from dwell.settings import INSECURE_NAMES, CommonSettings
from dwell.tracker.service import log_partitions
from dwell.tracker.settings import TrackerSettings

SECURE = {"env": "production", "redis_url": "rediss://:pw@redis:6379/0",
          "authentication_enabled": True, "token_secret_key": SecretStr("x" * 44),
          "kafka_security_protocol": "SASL_SSL", "kafka_sasl_username": "u",
          "kafka_sasl_password": SecretStr("p"), "tls_enabled": True,
          "tls_certificate_file_path": "/c.pem", "tls_key_file_path": "/k.pem"}

LOOSEN = {
    "auth": {"authentication_enabled": False},
    "kafka-plaintext": {"kafka_security_protocol": "SASL_PLAINTEXT"},
    "redis-plaintext": {"redis_url": "redis://:pw@redis:6379/0"},
    "http-plaintext": {"tls_enabled": False},
}


def settings(**kw: object) -> CommonSettings:
    return CommonSettings(**{**SECURE, **kw})  # type: ignore[arg-type]


def test_a_secured_production_setup_starts() -> None:
    assert settings().insecure() == {}


@pytest.mark.parametrize("name", INSECURE_NAMES)
def test_production_refuses_each_insecure_setting_unless_allowed_by_name(name: str) -> None:
    with pytest.raises(ValidationError) as refused:
        settings(**LOOSEN[name])
    text = str(refused.value)
    assert "DWELL_ENV=production refuses" in text and f"allow with '{name}'" in text
    assert "DWELL_ALLOW_INSECURE" in text
    allowed = settings(**LOOSEN[name], allow_insecure=f" {name} ")
    assert list(allowed.insecure()) == [name]


def test_every_refusal_is_named_at_once_and_development_allows_all() -> None:
    loose = {k: v for d in LOOSEN.values() for k, v in d.items()}
    with pytest.raises(ValidationError) as refused:
        settings(**loose)
    assert all(f"allow with '{n}'" in str(refused.value) for n in INSECURE_NAMES)
    assert settings(**loose, allow_insecure=",".join(INSECURE_NAMES)).env == "production"
    assert settings(**loose, env="development").env == "development"


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ValidationError, match="DWELL_ALLOW_INSECURE names tls"):
        settings(tls_enabled=False, allow_insecure="tls")


def test_the_partition_counts_of_dwells_topics_come_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DWELL_ACKS_TOPIC_PARTITIONS", "12")
    monkeypatch.setenv("DWELL_DELAYED_TOPIC_PARTITIONS", "8")
    monkeypatch.setenv("DWELL_REFILED_TOPIC_PARTITIONS", "6")
    monkeypatch.setenv("DWELL_DELIVERED_TOPIC_PARTITIONS", "3")
    monkeypatch.setenv("DWELL_PUBLISH_TOPIC_PARTITIONS", "16")
    assert CommonSettings().dwell_topic_partitions() == {
        "dwell.acks": 12, "dwell.delayed": 8, "dwell.delayed.refiled": 6,
        "dwell.delivered": 3, "dwell.publish": 16, "dwell.publish.results": 16}
    monkeypatch.setenv("DWELL_ACKS_TOPIC_PARTITIONS", "0")
    with pytest.raises(ValidationError, match="acks_topic_partitions"):
        CommonSettings()


def test_every_topic_of_more_than_one_partition_has_its_count_in_a_setting() -> None:
    """A single-partition topic is a feed read whole in order; every other one's count is
    the user's to choose, not a number in the code."""
    set_ = CommonSettings().dwell_topic_partitions()
    several = {name for name, (parts, _) in DWELL_TOPIC_DEFAULTS.items() if parts > 1}
    assert several <= set(set_)
    assert all(set_[name] == DWELL_TOPIC_DEFAULTS[name][0] for name in several)


def test_the_tracker_creates_each_log_with_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DWELL_DELAYED_TOPIC_PARTITIONS", "8")
    monkeypatch.setenv("DWELL_REFILED_TOPIC_PARTITIONS", "6")
    monkeypatch.setenv("DWELL_DELIVERED_TOPIC_PARTITIONS", "3")
    s = TrackerSettings()
    assert [log_partitions(s, t) for t in (s.delayed_topic, s.refile_log, "dwell.delivered")
            ] == [8, 6, 3]
