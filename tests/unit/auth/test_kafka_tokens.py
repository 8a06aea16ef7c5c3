"""Kafka tokens (dwell.auth.tokens): their audience keeps them off HTTP and keeps
long-lived tokens off Kafka, and they are judged at the time the broker wrote their record,
within a small skew of when they were issued."""

from __future__ import annotations

import base64

import jwt
import pytest

from dwell.auth.guard import Guard
from dwell.auth.keys import InvalidKey, kafka_token_key, verification_key
from dwell.auth.tokens import (
    KAFKA_AUDIENCE,
    KAFKA_TOKEN_SKEW_MS,
    InvalidToken,
    KafkaTokenVerifier,
    TokenVerifier,
    create_kafka_token,
    create_key_pair,
    create_secret_key,
    create_token,
)
from dwell.settings import CommonSettings

NOW = 1_800_000_000


def b64(raw: bytes) -> str:
    return "data:;base64," + base64.b64encode(raw).decode()


def test_a_kafka_token_names_the_role_audience_and_life() -> None:
    key = create_secret_key()
    token, expires_ms = create_kafka_token(key, "app", 600_000, now=NOW + 0.7)
    claims = jwt.decode(token, key, algorithms=["HS256"], audience=KAFKA_AUDIENCE,
                        options={"verify_exp": False, "verify_iat": False})
    assert claims == {"sub": "app", "aud": KAFKA_AUDIENCE, "iat": NOW, "exp": NOW + 600}
    assert expires_ms == (NOW + 600) * 1000


def test_a_kafka_token_ends_when_the_token_it_was_exchanged_for_ends() -> None:
    key = create_secret_key()
    _, expires_ms = create_kafka_token(key, "app", 600_000, now=NOW, not_after=NOW + 30.9)
    assert expires_ms == (NOW + 30) * 1000
    _, expires_ms = create_kafka_token(key, "app", 600_000, now=NOW, not_after=NOW + 9999)
    assert expires_ms == (NOW + 600) * 1000
    # Never before it was issued, whatever the caller's token says.
    _, expires_ms = create_kafka_token(key, "app", 600_000, now=NOW, not_after=NOW - 5)
    assert expires_ms == NOW * 1000


def test_valid_at_the_record_time_not_at_the_reading_time() -> None:
    key = create_secret_key()
    token, expires_ms = create_kafka_token(key, "app", 60_000, now=NOW)
    v = KafkaTokenVerifier(key)
    # Read long after it expired: judged by when its record was written.
    assert v.role_at(token, NOW * 1000 + 30_000) == "app"
    assert v.role_at(token, expires_ms) == "app"
    with pytest.raises(InvalidToken, match="expired before the record was written"):
        v.role_at(token, expires_ms + 1)
    # Clocks differ a little: a record stamped just before iat is accepted.
    assert v.role_at(token, NOW * 1000 - KAFKA_TOKEN_SKEW_MS) == "app"
    with pytest.raises(InvalidToken, match="issued after the record"):
        v.role_at(token, NOW * 1000 - KAFKA_TOKEN_SKEW_MS - 1)


def test_kafka_refuses_a_long_lived_token_and_says_what_to_send() -> None:
    key = create_secret_key()
    v = KafkaTokenVerifier(key)
    for token in (create_token(key, "HS256", "app"),
                  create_token(key, "HS256", "app", expires_at=NOW + 10**6),
                  jwt.encode({"sub": "app", "aud": "other", "iat": NOW, "exp": NOW + 60},
                             key, algorithm="HS256")):
        with pytest.raises(InvalidToken, match="POST /admin/v2/kafka-tokens"):
            v.role_at(token, NOW * 1000)
    # A user's token under its own key pair: the same advice.
    private, _ = create_key_pair("RS256")
    from dwell.auth.keys import load_private_key
    rs = create_token(load_private_key(private, "k"), "RS256", "app")
    with pytest.raises(InvalidToken, match="kafka-tokens"):
        v.role_at(rs, NOW * 1000)


def test_kafka_refuses_forged_and_incomplete_tokens() -> None:
    key = create_secret_key()
    v = KafkaTokenVerifier(key)
    forged, _ = create_kafka_token(create_secret_key(), "root", 60_000, now=NOW)
    with pytest.raises(InvalidToken, match="signature"):
        v.role_at(forged, NOW * 1000)
    no_iat = jwt.encode({"sub": "app", "aud": KAFKA_AUDIENCE, "exp": NOW + 60}, key,
                        algorithm="HS256")
    with pytest.raises(InvalidToken, match="iat and exp"):
        v.role_at(no_iat, NOW * 1000)
    with pytest.raises(InvalidToken, match="well-formed"):
        v.role_at("not-a-jwt", NOW * 1000)


def test_http_refuses_a_kafka_token() -> None:
    key = create_secret_key()
    http = TokenVerifier(verification_key(b64(key), ""))
    token, _ = create_kafka_token(key, "root", 3_600_000)
    with pytest.raises(InvalidToken, match="not over HTTP"):
        http.role(token)
    listed = jwt.encode({"sub": "root", "aud": ["x", KAFKA_AUDIENCE]}, key, algorithm="HS256")
    with pytest.raises(InvalidToken, match="not over HTTP"):
        http.role(listed)
    assert http.role(create_token(key, "HS256", "root")) == "root"


def test_the_kafka_key_and_when_a_service_refuses_to_start() -> None:
    user, own = create_secret_key(), create_secret_key()
    _, public = create_key_pair("ES256")
    pub = base64.b64encode(public).decode()
    assert kafka_token_key(b64(own), b64(user), "") == own
    assert kafka_token_key("", b64(user), "") == user
    assert kafka_token_key(b64(own), "", pub) == own
    with pytest.raises(InvalidKey, match="set DWELL_KAFKA_TOKEN_SECRET_KEY"):
        kafka_token_key("", "", pub)
    with pytest.raises(InvalidKey, match="shorter than 32 bytes"):
        kafka_token_key(b64(b"short"), b64(user), "")
    on = {"authentication_enabled": True, "token_public_key": pub}
    with pytest.raises(InvalidKey, match="DWELL_KAFKA_TOKEN_SECRET_KEY"):
        Guard(CommonSettings(**on))  # type: ignore[arg-type]
    guard = Guard(CommonSettings(**on, kafka_token_secret_key=b64(own)))  # type: ignore[arg-type]
    assert guard.kafka_key == own
    assert Guard(CommonSettings()).kafka_key is None  # authentication off: no key needed


def test_the_ttl_is_bounded() -> None:
    with pytest.raises(ValueError, match="kafka_token_ttl_ms"):
        CommonSettings(kafka_token_ttl_ms=3_600_001)  # type: ignore[call-arg]
    assert CommonSettings().kafka_token_ttl_ms == 600_000
