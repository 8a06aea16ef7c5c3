"""Tokens given as Pulsar's AuthenticationToken authParams (dwell.client.auth)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from dwell.client import auth as auth_module
from dwell.client.auth import KafkaTokens, token_from_auth_params, token_from_env


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


class _Policy:
    """`POST /admin/v2/kafka-tokens` answering in turn from ``answers`` (an exception is
    raised as httpx would)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, str]] = []

    def post(self, url: str, headers: dict[str, str], **_: object) -> httpx.Response:
        assert url.endswith("/admin/v2/kafka-tokens")
        self.calls.append(headers)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, httpx.Response)
        return answer


def _token(life_s: int) -> httpx.Response:
    from dwell.auth.tokens import create_kafka_token, create_secret_key
    token, exp = create_kafka_token(create_secret_key(), "app", life_s * 1000)
    return httpx.Response(200, json={"token": token, "expiresAtMs": exp})


def test_kafka_tokens_are_fetched_again_at_half_their_life_and_failures_wait(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    first, second = _token(600), _token(600)
    policy = _Policy(first, httpx.ConnectError("refused"), second)
    monkeypatch.setattr(auth_module.httpx, "post", policy.post)
    tokens = KafkaTokens("http://policy", "long.lived", clock=lambda: now[0])
    assert tokens.header() == f"Bearer {first.json()['token']}"
    assert policy.calls == [{"Authorization": "Bearer long.lived"}]
    now[0] += 299
    tokens.header()
    assert len(policy.calls) == 1  # cached until half its life
    now[0] += 2
    assert tokens.header() == f"Bearer {first.json()['token']}"  # refresh failed: kept
    assert "Kafka token not fetched" in caplog.text
    tokens.header()
    assert len(policy.calls) == 2  # no retry before RETRY_S
    now[0] += auth_module.RETRY_S
    assert tokens.header() == f"Bearer {second.json()['token']}"


def test_no_kafka_token_once_the_last_expired_and_none_with_authentication_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    policy = _Policy(_token(10), httpx.ConnectError("refused"),
                     httpx.Response(404, json={"reason": "authentication is disabled"}))
    monkeypatch.setattr(auth_module.httpx, "post", policy.post)
    tokens = KafkaTokens("http://policy", "t", clock=lambda: now[0])
    assert tokens.header() is not None
    now[0] += 10
    assert tokens.header() is None and not tokens.disabled
    now[0] += auth_module.RETRY_S
    assert tokens.header() is None and tokens.disabled
