import base64

import jwt
import pytest

from dwell.auth.keys import load_private_key, verification_key
from dwell.auth.tokens import (
    InvalidToken,
    TokenVerifier,
    create_key_pair,
    create_secret_key,
    create_token,
)

NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def secret() -> bytes:
    return create_secret_key()


def verifier_for(secret: bytes, clock: Clock, size: int = 100) -> TokenVerifier:
    key = verification_key("data:;base64," + base64.b64encode(secret).decode(), "")
    return TokenVerifier(key, cache_size=size, clock=clock)


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_key_pairs(alg: str) -> None:
    private, public = create_key_pair(alg)
    token = create_token(load_private_key(private, "k"), alg, "svc")
    verifier = TokenVerifier(verification_key("", base64.b64encode(public).decode()))
    assert verifier.role(token) == "svc"
    other_private, _ = create_key_pair(alg)
    with pytest.raises(InvalidToken, match="signature"):
        verifier.role(create_token(load_private_key(other_private, "k"), alg, "svc"))


def test_hs256_role_and_expiry(secret: bytes) -> None:
    clock = Clock()
    v = verifier_for(secret, clock)
    token = create_token(secret, "HS256", "alice", expires_at=NOW + 60)
    assert v.role(token) == "alice"
    assert v.role(token) == "alice" and len(v) == 1  # the second time from the cache
    clock.now = NOW + 60
    with pytest.raises(InvalidToken, match="expired"):
        v.role(token)
    assert len(v) == 0  # an expired token drops out
    with pytest.raises(InvalidToken, match="expired"):
        v.role(token)


def test_refusals(secret: bytes) -> None:
    v = verifier_for(secret, Clock())
    with pytest.raises(InvalidToken, match="signature"):
        v.role(create_token(create_secret_key(), "HS256", "alice"))
    with pytest.raises(InvalidToken, match="well-formed"):
        v.role("not.a.jwt")
    with pytest.raises(InvalidToken, match="subject"):
        v.role(jwt.encode({"exp": NOW + 60}, secret, algorithm="HS256"))
    with pytest.raises(InvalidToken, match="algorithm"):
        v.role(jwt.encode({"sub": "alice"}, None, algorithm="none"))
    with pytest.raises(InvalidToken, match="expired"):
        v.role(create_token(secret, "HS256", "alice", expires_at=NOW - 1))
    assert len(v) == 0  # nothing refused is cached


def test_cache_is_bounded(secret: bytes) -> None:
    clock = Clock()
    v = verifier_for(secret, clock, size=10)
    short = [create_token(secret, "HS256", f"s{i}", expires_at=NOW + 5) for i in range(5)]
    long = [create_token(secret, "HS256", f"l{i}") for i in range(5)]
    for t in short + long:
        v.role(t)
    assert len(v) == 10
    clock.now = NOW + 10  # the short ones have expired: they go first
    v.role(create_token(secret, "HS256", "new"))
    assert len(v) == 6
    for i in range(20):
        v.role(create_token(secret, "HS256", f"more{i}"))
    assert len(v) == 10


def test_cache_is_bounded_in_bytes(secret: bytes) -> None:
    """Long tokens (claims padded by the caller) fill a byte budget long before the entry
    count: the cache stays within the budget, and a token bigger than a quarter of it is
    never kept."""
    key = verification_key(base64.b64encode(secret).decode(), "")
    v = TokenVerifier(key, cache_size=10_000, cache_bytes=64 * 1024, clock=Clock())
    for i in range(200):
        v.role(jwt.encode({"sub": f"r{i}", "pad": "x" * 2000}, secret, algorithm="HS256"))
    assert v.cached_bytes <= 64 * 1024 and 0 < len(v) < 200
    huge = jwt.encode({"sub": "big", "pad": "x" * 20_000}, secret, algorithm="HS256")
    assert v.role(huge) == "big" and huge not in v._cache
