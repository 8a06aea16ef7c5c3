"""Token keys as Pulsar's broker reads `tokenSecretKey` and `tokenPublicKey`
(`AuthTokenUtils.readKeyFromUrl`): a `data:` URL (`data:;base64,<base64>`), a `file:`
path or URL (`file:///etc/dwell/secret.key`, e.g. a mounted Kubernetes Secret), or else
the key itself in base64. A secret key is raw bytes (HMAC); a public or private key is DER
(what `pulsar tokens create-key-pair` writes) or PEM."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_to_bytes, urlparse

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

# The algorithms a key verifies, by key kind; PyJWT refuses any other `alg` (and `none`).
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")


class InvalidKey(ValueError):
    """A key setting that cannot be read or decoded; the text names the setting, never
    the key."""


def read_key(value: str, setting: str) -> bytes:
    """The key bytes a setting's value stands for (see the module's docstring)."""
    value = value.strip()
    if value.startswith("data:"):
        meta, sep, data = value[len("data:"):].partition(",")
        if not sep:
            raise InvalidKey(f"{setting}: a data: URL needs a ',' before its data")
        if meta.endswith(";base64"):
            return _b64(unquote(data), setting)
        return unquote_to_bytes(data)
    if value.startswith("file:"):
        url = urlparse(value)
        path = unquote(url.path) if url.netloc in ("", "localhost") else ""
        if not path:
            raise InvalidKey(f"{setting}: a file: URL needs a path (file:///path/to/key)")
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise InvalidKey(f"{setting}: cannot read {path}: {exc.strerror}") from None
    if value.startswith("-----BEGIN"):
        return value.encode()
    return _b64(value, setting)


def _b64(text: str, setting: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidKey(f"{setting}: not base64 (give the key in base64, as data:;base64,"
                        "..., or as file:/path)") from None


def load_public_key(raw: bytes, setting: str) -> Any:
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_public_key(raw)
        return serialization.load_der_public_key(raw)
    except ValueError:
        raise InvalidKey(f"{setting}: not a public key (DER or PEM)") from None


def load_private_key(raw: bytes, setting: str) -> Any:
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_private_key(raw, password=None)
        return serialization.load_der_private_key(raw, password=None)
    except (ValueError, TypeError):
        raise InvalidKey(f"{setting}: not an unencrypted private key (DER or PEM)") from None


def _kind_of(raw: bytes) -> str | None:
    """What an asymmetric key (or certificate) `raw` is, or None when it is none of them."""
    text = raw.lstrip()
    if text.startswith(b"-----BEGIN"):
        label = text[len(b"-----BEGIN"):].split(b"-----", 1)[0].strip().decode("ascii",
                                                                                  "replace")
        return f"a PEM {label[:40] or 'block'}"
    for kind, load in (("public key", serialization.load_der_public_key),
                       ("private key", lambda b: serialization.load_der_private_key(b, None))):
        try:
            load(raw)
        except (ValueError, TypeError):
            continue
        return f"a DER {kind}"
    return None


def check_secret_key(raw: bytes, setting: str) -> None:
    """Refuse a public or private key given as an HMAC secret: a public key used as one
    lets anyone who has it sign tokens, and PyJWT fails every request on a PEM one."""
    kind = _kind_of(raw)
    if kind is not None:
        raise InvalidKey(f"{setting} holds {kind}, not a secret key: a secret key is random "
                         "bytes (dwell-admin tokens create-secret-key); a public key goes in "
                         "DWELL_TOKEN_PUBLIC_KEY, and a private key only signs tokens "
                         "(dwell-admin tokens create --private-key)")


def algorithms_of(key: Any) -> tuple[str, ...]:
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return RSA_ALGORITHMS
    if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        return EC_ALGORITHMS
    raise InvalidKey(f"unsupported key type {type(key).__name__}: use RSA or EC")


@dataclass(frozen=True)
class VerificationKey:
    """What verifies tokens: the key object PyJWT takes and the algorithms it may use."""

    key: Any
    algorithms: tuple[str, ...]

    def __repr__(self) -> str:  # a secret key must never reach a log line
        return f"VerificationKey(algorithms={self.algorithms})"


def verification_key(secret_key: str, public_key: str) -> VerificationKey:
    """The key from the settings: the secret key when one is set (as Pulsar prefers it),
    else the public key."""
    if secret_key:
        raw = read_key(secret_key, "DWELL_TOKEN_SECRET_KEY")
        check_secret_key(raw, "DWELL_TOKEN_SECRET_KEY")
        if len(raw) < 32:
            raise InvalidKey("DWELL_TOKEN_SECRET_KEY: shorter than 32 bytes (256 bits), "
                            "too short for HS256")
        return VerificationKey(raw, HMAC_ALGORITHMS)
    if public_key:
        key = load_public_key(read_key(public_key, "DWELL_TOKEN_PUBLIC_KEY"),
                              "DWELL_TOKEN_PUBLIC_KEY")
        return VerificationKey(key, algorithms_of(key))
    raise InvalidKey("authentication is enabled but neither DWELL_TOKEN_SECRET_KEY nor "
                    "DWELL_TOKEN_PUBLIC_KEY is set")


def kafka_token_key(kafka_secret_key: str, secret_key: str, public_key: str) -> bytes:
    """The HMAC key dwell signs and checks Kafka tokens with (dwell.auth.tokens):
    DWELL_KAFKA_TOKEN_SECRET_KEY, else DWELL_TOKEN_SECRET_KEY when user tokens are
    HMAC-signed. With a public key for user tokens dwell holds no secret of its own, so
    the Kafka key must be given."""
    if kafka_secret_key:
        raw = read_key(kafka_secret_key, "DWELL_KAFKA_TOKEN_SECRET_KEY")
        if len(raw) < 32:
            raise InvalidKey("DWELL_KAFKA_TOKEN_SECRET_KEY: shorter than 32 bytes (256 "
                            "bits), too short for HS256")
        return raw
    if secret_key:
        return verification_key(secret_key, "").key  # type: ignore[no-any-return]
    raise InvalidKey("authentication is enabled and user tokens are verified with "
                    "DWELL_TOKEN_PUBLIC_KEY: set DWELL_KAFKA_TOKEN_SECRET_KEY, the HMAC "
                    "secret (32 bytes or more) dwell signs Kafka tokens with "
                    "(dwell-admin tokens create-secret-key)")
