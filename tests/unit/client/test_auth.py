"""Tokens given as Pulsar's AuthenticationToken authParams (dwell.client.auth)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dwell.client.auth import token_from_auth_params, token_from_env


def test_a_token_inline_or_in_a_file(tmp_path: Path) -> None:
    assert token_from_auth_params("token:abc.def.ghi") == "abc.def.ghi"
    f = tmp_path / "my token"
    f.write_text("abc.def.ghi\n")
    assert token_from_auth_params(f"file:{f}") == "abc.def.ghi"
    assert token_from_auth_params(f"file://{str(f).replace(' ', '%20')}") == "abc.def.ghi"


@pytest.mark.parametrize(("params", "says"), [
    ("abc.def.ghi", "expected token:<jwt> or file:<path>"),
    ("file:///nonexistent/token", "cannot read /nonexistent/token: No such file"),
])
def test_bad_params_say_what_is_wrong(params: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        token_from_auth_params(params)


def test_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DWELL_AUTH_PARAMS", raising=False)
    assert token_from_env() is None
    monkeypatch.setenv("DWELL_AUTH_PARAMS", "")
    assert token_from_env() is None
    monkeypatch.setenv("DWELL_AUTH_PARAMS", "token:t")
    assert token_from_env() == "t"
