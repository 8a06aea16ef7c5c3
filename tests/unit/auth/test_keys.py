import base64
from pathlib import Path

import pytest

from dwell.auth.keys import (
    EC_ALGORITHMS,
    HMAC_ALGORITHMS,
    RSA_ALGORITHMS,
    InvalidKey,
    read_key,
    verification_key,
)
from dwell.auth.tokens import create_key_pair, create_secret_key


def test_read_key_forms(tmp_path: Path) -> None:
    raw = create_secret_key()
    b64 = base64.b64encode(raw).decode()
    path = tmp_path / "secret.key"
    path.write_bytes(raw)
    for value in (f"data:;base64,{b64}", f"data:application/octet-stream;base64,{b64}", b64,
                  f"file://{path}", f"file:{path}", f"  {b64}\n"):
        assert read_key(value, "X") == raw


@pytest.mark.parametrize(("value", "words"), [
    ("not base64!", "X: not base64"),
    ("data:;base64", "needs a ','"),
    ("file:///nonexistent/key", "cannot read /nonexistent/key"),
    ("file://", "needs a path"),
])
def test_read_key_errors_name_the_setting(value: str, words: str) -> None:
    with pytest.raises(InvalidKey, match=words):
        read_key(value, "X")


def test_secret_key_wins_and_short_ones_are_refused() -> None:
    secret = base64.b64encode(create_secret_key()).decode()
    _, public = create_key_pair("RS256")
    key = verification_key(secret, base64.b64encode(public).decode())
    assert key.algorithms == HMAC_ALGORITHMS
    assert secret not in repr(key)
    with pytest.raises(InvalidKey, match="shorter than 32 bytes"):
        verification_key(base64.b64encode(b"short").decode(), "")
    with pytest.raises(InvalidKey, match="neither"):
        verification_key("", "")


@pytest.mark.parametrize(("alg", "family"), [("RS256", RSA_ALGORITHMS),
                                              ("ES256", EC_ALGORITHMS)])
def test_public_keys_der_and_pem(alg: str, family: tuple[str, ...], tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    _, public = create_key_pair(alg)
    (tmp_path / "public.key").write_bytes(public)
    assert verification_key("", f"file://{tmp_path}/public.key").algorithms == family
    pem = serialization.load_der_public_key(public).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert verification_key("", pem.decode()).algorithms == family
    with pytest.raises(InvalidKey, match="not a public key"):
        verification_key("", base64.b64encode(b"garbage").decode())



def _pem(der: bytes, public: bool) -> bytes:
    from cryptography.hazmat.primitives import serialization as ser

    if public:
        return ser.load_der_public_key(der).public_bytes(
            ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    return ser.load_der_private_key(der, None).private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())


@pytest.mark.parametrize(("form", "says"), [
    ("der-public", "holds a DER public key"),
    ("der-private", "holds a DER private key"),
    ("pem-public", "holds a PEM PUBLIC KEY"),
    ("pem-private", "holds a PEM PRIVATE KEY"),
])
def test_a_key_pair_key_given_as_the_secret_key_is_refused(form: str, says: str) -> None:
    """A public key taken as an HMAC secret lets anyone who has it sign tokens; a PEM one
    made every request fail with 500."""
    private, public = create_key_pair("RS256")
    der = public if form.endswith("public") else private
    raw = _pem(der, form.endswith("public")) if form.startswith("pem") else der
    with pytest.raises(InvalidKey, match=f"DWELL_TOKEN_SECRET_KEY {says}, not a secret key"):
        verification_key("data:;base64," + base64.b64encode(raw).decode(), "")
    assert verification_key(base64.b64encode(create_secret_key()).decode(), "").algorithms \
        == HMAC_ALGORITHMS
