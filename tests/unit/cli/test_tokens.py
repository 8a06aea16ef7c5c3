import base64
from pathlib import Path

from typer.testing import CliRunner

from dwell.auth.keys import verification_key
from dwell.auth.tokens import TokenVerifier
from dwell.cli.main import app

runner = CliRunner()


def test_secret_key_outputs(tmp_path: Path) -> None:
    raw = runner.invoke(app, ["tokens", "create-secret-key"])
    assert raw.exit_code == 0 and len(raw.stdout_bytes) == 32
    b64 = runner.invoke(app, ["tokens", "create-secret-key", "--base64", "-a", "HS512"])
    assert len(base64.b64decode(b64.stdout_bytes, validate=True)) == 64
    out = tmp_path / "k"
    assert runner.invoke(app, ["tokens", "create-secret-key", "-o", str(out)]).exit_code == 0
    token = runner.invoke(app, ["tokens", "create", "-sk", f"file://{out}", "-s", "alice"])
    verifier = TokenVerifier(verification_key(f"file:{out}", ""))
    assert verifier.role(token.stdout.strip()) == "alice"


def test_key_pairs_sign_what_the_public_key_verifies(tmp_path: Path) -> None:
    for alg in ("RS256", "ES256"):
        private, public = tmp_path / f"{alg}.private", tmp_path / f"{alg}.public"
        made = runner.invoke(app, ["tokens", "create-key-pair", "-a", alg,
                                   "--output-private-key", str(private),
                                   "--output-public-key", str(public)])
        assert made.exit_code == 0 and made.stdout == ""
        token = runner.invoke(app, ["tokens", "create", "-pk", f"file:{private}", "-s", "svc",
                                    "-e", "1d"]).stdout.strip()
        assert token.count(".") == 2
        key = "data:;base64," + base64.b64encode(public.read_bytes()).decode()
        assert TokenVerifier(verification_key("", key)).role(token) == "svc"


def test_create_needs_exactly_one_key(tmp_path: Path) -> None:
    none = runner.invoke(app, ["tokens", "create", "-s", "alice"])
    assert none.exit_code == 1
    assert "Either --secret-key or --private-key" in none.stderr
    bad = runner.invoke(app, ["tokens", "create", "-s", "a", "-sk", "!!", "-e", "1h"])
    assert bad.exit_code == 1 and "--secret-key: not base64" in bad.stderr


def test_key_files_are_written_0600_whatever_the_umask(tmp_path: Path) -> None:
    """Key files readable by every local user hand out the power to sign tokens."""
    import os
    import stat

    old = os.umask(0o000)
    try:
        secret = tmp_path / "secret.key"
        secret.write_bytes(b"")
        secret.chmod(0o666)  # an existing, wider file is narrowed too
        assert runner.invoke(app, ["tokens", "create-secret-key", "-o", str(secret)]
                             ).exit_code == 0
        private, public = tmp_path / "private.key", tmp_path / "public.key"
        assert runner.invoke(app, ["tokens", "create-key-pair",
                                   "--output-private-key", str(private),
                                   "--output-public-key", str(public)]).exit_code == 0
    finally:
        os.umask(old)
    for path in (secret, private, public):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert len(secret.read_bytes()) == 32
