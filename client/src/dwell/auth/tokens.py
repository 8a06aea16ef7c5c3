"""Pulsar-style JWTs: the role is the `sub` claim, `exp` (when present) is honoured.
`TokenVerifier` checks a token once and then remembers its role until it expires, so that
a request carrying a token seen before costs one dict lookup; `create_token` and the key
makers are what `dwell-admin tokens` runs (Pulsar's `pulsar tokens`).

Kafka tokens: a request on `dwell.publish` or an event on `dwell.acks` stays readable in
Kafka for the topic's retention, so it never carries a client's long-lived token. It
carries a Kafka token instead (`create_kafka_token`, served by the policy service's
`POST /admin/v2/kafka-tokens`): the same role, audience `dwell-kafka`, a life of minutes,
signed with a key only dwell holds. `KafkaTokenVerifier` accepts one when it was valid at
the record's broker-assigned timestamp (LogAppendTime), so a record that waited in a
backlog is still accepted and a token copied out of Kafka is worth nothing once it
expired: re-sent, its record gets a new append time. `TokenVerifier` (HTTP) refuses
Kafka tokens, and the Kafka paths refuse every other token.

Delegated tokens: admission's Kafka ingress hands the cancels it read on `dwell.publish`
to the tracker over HTTP, on behalf of the role the request's Kafka token authenticated.
It signs, with the same key, a token of that role with audience `dwell-delegated` and a
life of a minute (`create_delegated_token`); only the tracker's cancel route accepts one
(`DelegatedTokenVerifier`). Such a token never goes to Kafka or to a client."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from dwell.auth.keys import VerificationKey

_T = TypeVar("_T")


class InvalidToken(Exception):
    """A token that does not authenticate anyone; the text says why (never the token)."""


# The audience of Kafka tokens, and the only one the Kafka paths accept.
KAFKA_AUDIENCE: Final = "dwell-kafka"
KAFKA_TOKEN_ROUTE: Final = "POST /admin/v2/kafka-tokens"
# The audience of the tokens admission signs for the tracker (see the module's text).
DELEGATED_AUDIENCE: Final = "dwell-delegated"
DELEGATED_TOKEN_TTL_S: Final = 60
# How far before its `iat` a record's append time may be: the policy service's clock and
# the broker's are different clocks.
KAFKA_TOKEN_SKEW_MS: Final = 10_000
# What the Kafka paths say to a client that sent a long-lived token.
USE_KAFKA_TOKEN: Final = (f"a long-lived token is not accepted on Kafka; send a Kafka "
                          f"token ({KAFKA_TOKEN_ROUTE}) in the header")


def _audiences(claims: dict[str, Any]) -> list[Any]:
    aud = claims.get("aud")
    if aud is None:
        return []
    return aud if isinstance(aud, list) else [aud]


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
        return self.identity(token)[0]

    def identity(self, token: str) -> tuple[str, float | None]:
        """(the role the token authenticates, its expiry in s or None); InvalidToken when
        it is not valid now."""
        hit = self._cache.get(token)
        if hit is not None:
            if hit[1] is None or self._clock() < hit[1]:
                return hit
            self._forget(token)
            raise InvalidToken("token expired")
        role, expiry = self._verify(token)
        self._remember(token, role, expiry)
        return role, expiry

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
        # Kafka and delegated tokens are signed with a key HTTP may share; they must not
        # open HTTP.
        audiences = _audiences(claims)
        if KAFKA_AUDIENCE in audiences:
            raise InvalidToken(f"a Kafka token (aud {KAFKA_AUDIENCE}) is accepted only on "
                               "dwell.publish and dwell.acks, not over HTTP")
        if DELEGATED_AUDIENCE in audiences:
            raise InvalidToken(f"a delegated token (aud {DELEGATED_AUDIENCE}) is accepted "
                               "only on the tracker's cancel route")
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


def _hs256_claims(token: str, key: bytes, wrong_key: str = "") -> dict[str, Any]:
    """The claims of an HS256 token signed with ``key`` (dwell checks the times itself);
    InvalidToken otherwise, its reason followed by ``wrong_key`` when the signature or
    the algorithm is not that."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token, key, algorithms=["HS256"],
            options={"verify_aud": False, "verify_exp": False, "verify_iat": False,
                     "verify_nbf": False})
    except jwt.InvalidTokenError as exc:
        reason = _reason(exc)
        if isinstance(exc, (jwt.InvalidSignatureError, jwt.InvalidAlgorithmError)):
            reason += wrong_key
        raise InvalidToken(reason) from None
    return claims


def _remembered(cache: dict[str, _T], size: int, token: str,
                verify: Callable[[str], _T]) -> _T:
    """What ``cache`` holds for ``token``, verified and put there first (dropping the
    oldest entry when it holds ``size``)."""
    hit = cache.get(token)
    if hit is None:
        hit = verify(token)
        if len(cache) >= size:
            del cache[next(iter(cache))]
        cache[token] = hit
    return hit


class KafkaTokenVerifier:
    """Verifies Kafka tokens (HS256 with dwell's Kafka token key) against the timestamp
    of the record that carries them, and caches token -> (role, iat ms, exp ms)."""

    def __init__(self, key: bytes, *, cache_size: int = 10_000) -> None:
        self._key = key
        self._cache: dict[str, tuple[str, int, int]] = {}
        self._cache_size = cache_size

    def role_at(self, token: str, record_ms: int) -> str:
        """The role of a Kafka token valid at ``record_ms`` (the record's broker-assigned
        timestamp); InvalidToken otherwise."""
        role, issued_ms, expiry_ms = _remembered(self._cache, self._cache_size, token,
                                                 self._verify)
        if record_ms > expiry_ms:
            raise InvalidToken("Kafka token expired before the record was written")
        if record_ms < issued_ms - KAFKA_TOKEN_SKEW_MS:
            raise InvalidToken("Kafka token issued after the record was written")
        return role

    def _verify(self, token: str) -> tuple[str, int, int]:
        # A user's token under another key or algorithm: say what to send instead.
        claims = _hs256_claims(token, self._key,
                               f" with dwell's Kafka token key; {USE_KAFKA_TOKEN}")
        if KAFKA_AUDIENCE not in _audiences(claims):
            raise InvalidToken(USE_KAFKA_TOKEN)
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise InvalidToken("token has no subject (sub claim)")
        times = [claims.get("iat"), claims.get("exp")]
        if not all(isinstance(t, (int, float)) and not isinstance(t, bool)
                   and 0 <= t < 1e11 for t in times):
            raise InvalidToken("Kafka token needs numeric iat and exp claims")
        return subject, int(times[0] * 1000), int(times[1] * 1000)  # type: ignore[operator]

    def __len__(self) -> int:
        return len(self._cache)


def create_kafka_token(key: bytes, subject: str, ttl_ms: int, now: float | None = None,
                       not_after: float | None = None) -> tuple[str, int]:
    """(a Kafka token for ``subject`` valid ``ttl_ms`` from ``now``, its expiry in ms).

    ``not_after`` is the expiry (s) of the token it is exchanged for: a Kafka token never
    outlives the credential that asked for it, or renewing one would keep a revoked
    (expired) token's rights alive for good."""
    issued = int(time.time() if now is None else now)
    expires = issued + max(1, ttl_ms // 1000)
    if not_after is not None:
        expires = max(issued, min(expires, int(not_after)))
    claims = {"sub": subject, "aud": KAFKA_AUDIENCE, "iat": issued, "exp": expires}
    return jwt.encode(claims, key, algorithm="HS256"), expires * 1000


def create_delegated_token(key: bytes, subject: str, now: float | None = None) -> str:
    """A token of ``subject`` for the tracker's cancel route, valid
    DELEGATED_TOKEN_TTL_S from ``now``, signed with the Kafka token key."""
    issued = int(time.time() if now is None else now)
    return jwt.encode({"sub": subject, "aud": DELEGATED_AUDIENCE, "iat": issued,
                       "exp": issued + DELEGATED_TOKEN_TTL_S}, key, algorithm="HS256")


class DelegatedTokenVerifier:
    """Verifies delegated tokens (HS256 with the Kafka token key, audience
    `dwell-delegated`, not expired) and caches token -> (role, expiry in s)."""

    def __init__(self, key: bytes, *, cache_size: int = 1000,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._cache: dict[str, tuple[str, float]] = {}
        self._cache_size = cache_size
        self._clock = clock

    def role(self, token: str) -> str:
        """The role of a delegated token valid now; InvalidToken otherwise."""
        hit = _remembered(self._cache, self._cache_size, token, self._verify)
        if self._clock() >= hit[1]:
            del self._cache[token]
            raise InvalidToken("token expired")
        return hit[0]

    def _verify(self, token: str) -> tuple[str, float]:
        claims = _hs256_claims(token, self._key)
        if DELEGATED_AUDIENCE not in _audiences(claims):
            raise InvalidToken(f"not a delegated token (aud {DELEGATED_AUDIENCE})")
        subject, expiry = claims.get("sub"), claims.get("exp")
        if not isinstance(subject, str) or not subject:
            raise InvalidToken("token has no subject (sub claim)")
        if not isinstance(expiry, (int, float)) or isinstance(expiry, bool):
            raise InvalidToken("delegated token needs a numeric exp claim")
        return subject, float(expiry)


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
