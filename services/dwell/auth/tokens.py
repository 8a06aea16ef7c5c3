"""Pulsar-style JWTs: the role is the `sub` claim, `exp` (when present) is honoured.
`TokenVerifier` checks a token once and then remembers its role until it expires, so that
a request carrying a token seen before costs one dict lookup; `create_token` and the key
makers are what `dwell-admin tokens` runs (Pulsar's `pulsar tokens`)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from dwell.auth.keys import VerificationKey


class InvalidToken(Exception):
    """A token that does not authenticate anyone; the text says why (never the token)."""


# What 401 says for each of PyJWT's refusals.
_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "token expired"),
    (jwt.InvalidSignatureError, "token signature does not verify"),
    (jwt.InvalidAlgorithmError, "token algorithm not accepted"),
    (jwt.ImmatureSignatureError, "token not valid yet"),
    (jwt.DecodeError, "token is not a well-formed JWT"),
)


def _reason(exc: jwt.InvalidTokenError) -> str:
    for kind, text in _REASONS:
        if isinstance(exc, kind):
            return text
    return "token not accepted"


class TokenVerifier:
    """Verifies tokens against one key and caches token -> (role, expiry in s or None).

    The cache holds at most `cache_size` tokens and `cache_bytes` bytes of tokens and
    roles: a new token when it is full first drops the expired ones, then the oldest ones,
    so that tokens sent by clients (of any length the request allows) cannot grow it
    without end. A token bigger than a quarter of `cache_bytes` is verified every time,
    never cached. Refused tokens are not cached."""

    def __init__(self, key: VerificationKey, *, cache_size: int = 10_000,
                 cache_bytes: int = 16 * 1024 * 1024,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._cache: dict[str, tuple[str, float | None]] = {}
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._bytes = 0
        self._clock = clock

    def role(self, token: str) -> str:
        """The role the token authenticates; InvalidToken when it is not valid now."""
        hit = self._cache.get(token)
        if hit is not None:
            role, expiry = hit
            if expiry is None or self._clock() < expiry:
                return role
            self._forget(token)
            raise InvalidToken("token expired")
        role, expiry = self._verify(token)
        self._remember(token, role, expiry)
        return role

    def _verify(self, token: str) -> tuple[str, float | None]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token, self._key.key, algorithms=list(self._key.algorithms),
                # Pulsar checks no audience unless configured to; dwell has no such setting.
                options={"verify_aud": False, "verify_exp": False, "verify_iat": False})
        except jwt.InvalidTokenError as exc:
            raise InvalidToken(_reason(exc)) from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise InvalidToken("token has no subject (sub claim)")
        expiry = claims.get("exp")
        if expiry is not None:
            if not isinstance(expiry, (int, float)) or isinstance(expiry, bool):
                raise InvalidToken("token exp claim is not a number")
            # Checked against this verifier's clock, the same one the cache uses.
            if self._clock() >= expiry:
                raise InvalidToken("token expired")
        return subject, (float(expiry) if expiry is not None else None)

    @staticmethod
    def _size(token: str, role: str) -> int:
        # str lengths stand for their bytes (tokens are ASCII); the fixed part covers the
        # entry's tuple, float and dict slot.
        return len(token) + len(role) + 200

    def _forget(self, token: str) -> None:
        hit = self._cache.pop(token, None)
        if hit is not None:
            self._bytes -= self._size(token, hit[0])

    def _remember(self, token: str, role: str, expiry: float | None) -> None:
        size = self._size(token, role)
        if size > self._cache_bytes // 4:
            return
        cache = self._cache
        if len(cache) >= self._cache_size or self._bytes + size > self._cache_bytes:
            now = self._clock()
            for stale in [t for t, (_, e) in cache.items() if e is not None and e <= now]:
                self._forget(stale)
            while cache and (len(cache) >= self._cache_size
                             or self._bytes + size > self._cache_bytes):
                self._forget(next(iter(cache)))
        cache[token] = (role, expiry)
        self._bytes += size

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def cached_bytes(self) -> int:
        """What the cache's entries take, as it counts them."""
        return self._bytes


# -- making keys and tokens (dwell-admin tokens)

SECRET_KEY_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}


def create_secret_key(algorithm: str = "HS256") -> bytes:
    """A random HMAC key of the algorithm's size (what jjwt's `Keys.secretKeyFor` makes)."""
    return secrets.token_bytes(SECRET_KEY_BYTES[algorithm])


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """(private key as PKCS#8 DER, public key as X.509 DER), as `pulsar tokens
    create-key-pair` writes them."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm.startswith("RS"):
        bits = {"RS256": 2048, "RS384": 3072, "RS512": 4096}[algorithm]
        private = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    elif algorithm.startswith("ES"):
        curve = {"ES256": ec.SECP256R1(), "ES384": ec.SECP384R1(),
                 "ES512": ec.SECP521R1()}[algorithm]
        private = ec.generate_private_key(curve)
    else:
        raise ValueError(f"{algorithm} does not use a key pair (RS256, ES256, ...)")
    der = serialization.Encoding.DER
    return (private.private_bytes(der, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()),
            private.public_key().public_bytes(der,
                                              serialization.PublicFormat.SubjectPublicKeyInfo))


def create_token(key: Any, algorithm: str, subject: str,
                 expires_at: float | None = None) -> str:
    """A token for `subject`, signed with `key` (secret bytes or a private key)."""
    claims: dict[str, Any] = {"sub": subject}
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    return jwt.encode(claims, key, algorithm=algorithm)
