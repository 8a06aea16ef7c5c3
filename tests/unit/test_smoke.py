"""The smoke hook's own token (the chart's auth.generateKeys): signed for the role it is
given with the services' HS256 key, short-lived, and a key that is not a secret key is
refused before anything is called. The hook end to end is in tests/e2e and tests/secure."""

from __future__ import annotations

import base64
import time

import pytest

from dwell import smoke
from dwell.auth.keys import verification_key
from dwell.auth.tokens import InvalidToken, TokenVerifier, create_key_pair, create_secret_key


def test_the_signed_token_is_the_roles_and_expires() -> None:
    key = create_secret_key()
    setting = "data:;base64," + base64.b64encode(key).decode()
    token = smoke.signed_token(setting, "admin")
    role, expiry = TokenVerifier(verification_key(setting, "")).identity(token)
    assert role == "admin"
    assert expiry is not None
    assert 0 < expiry - time.time() <= smoke.SIGNED_TOKEN_TTL_S
    other = "data:;base64," + base64.b64encode(create_secret_key()).decode()
    with pytest.raises(InvalidToken):
        TokenVerifier(verification_key(other, "")).role(token)


def test_a_public_key_or_a_missing_file_is_refused_and_nothing_is_called(
        capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    public = "data:;base64," + base64.b64encode(create_key_pair()[1]).decode()
    assert smoke.main(["--signing-key", public, "--timeout-s", "1"]) == 1
    assert "not a secret key" in capsys.readouterr().err
    missing = f"file://{tmp_path / 'nope.key'}"
    assert smoke.main(["--signing-key", missing, "--timeout-s", "1"]) == 1
    err = capsys.readouterr().err
    assert "smoke: FAILED: --signing-key: cannot read" in err
