"""`dwell-admin` with token authentication: keys and tokens from `dwell-admin tokens`, the
policy service reading its key from a file, `--auth-params token:` / `file:`, and the
namespace permission commands."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

DWELL_ADMIN = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "dwell-admin"


def admin(*args: str, url: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ) | {"DWELL_POLICY_URL": url, "COLUMNS": "120"}
    env.pop("DWELL_AUTH_PARAMS", None)
    return subprocess.run([str(DWELL_ADMIN), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def ok(*args: str, url: str = "") -> str:
    result = admin(*args, url=url)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "secret.key"
    ok("tokens", "create-secret-key", "--output", str(path))
    assert len(path.read_bytes()) == 32
    return path


@pytest.fixture(scope="module")
def policy(services, keyfile: Path):  # type: ignore[no-untyped-def]
    svc = services.start("policy", env={
        "DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
        "DWELL_SUPER_USER_ROLES": "admin", "DWELL_TOKEN_SECRET_KEY": f"file://{keyfile}"})
    yield svc
    svc.stop()


def test_permissions_with_tokens(policy, keyfile: Path, unique: str,  # type: ignore[no-untyped-def]
                                 tmp_path: Path) -> None:
    def token(role: str) -> str:
        return ok("tokens", "create", "--secret-key", f"file:{keyfile}", "--subject", role,
                  "--expiry-time", "1h").strip()

    url, ns = policy.url, f"{unique}/ns"
    refused = admin("tenants", "list", url=url)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: 401 Authentication required: no Authorization")

    root = f"token:{token('admin')}"
    ok("--auth-params", root, "tenants", "create", unique, "--admin-roles", "ops", url=url)
    ok("--auth-params", root, "namespaces", "create", ns, url=url)

    ops_file = tmp_path / "ops.token"
    ops_file.write_text(token("ops") + "\n")
    ops = f"file://{ops_file}"
    ok("--auth-params", ops, "namespaces", "grant-permission", ns, "--role", "app",
       "--actions", "produce,consume", url=url)
    ok("--auth-params", ops, "namespaces", "grant-permission", ns, "--role", "billing",
       "--actions", "consume", url=url)
    assert json.loads(ok("--auth-params", ops, "-o", "json", "namespaces", "permissions", ns,
                         url=url)) == {"app": ["consume", "produce"], "billing": ["consume"]}
    ok("--auth-params", ops, "namespaces", "revoke-permission", ns, "--role", "app", url=url)
    assert "billing" in ok("--auth-params", ops, "namespaces", "permissions", ns, url=url)
    assert json.loads(ok("--auth-params", ops, "-o", "json", "namespaces", "permissions", ns,
                         url=url)) == {"billing": ["consume"]}

    bad = admin("--auth-params", ops, "namespaces", "grant-permission", ns, "--role", "x",
                "--actions", "write", url=url)
    assert bad.returncode == 1 and "400 body[0]: 'write' is not an action" in bad.stderr
    # A role with a permission does not manage, and ops manages its own tenant only.
    app = f"token:{token('billing')}"
    denied = admin("--auth-params", app, "namespaces", "permissions", ns, url=url)
    assert denied.returncode == 1 and denied.stderr.startswith("error: 403 Unauthorized")
    assert admin("--auth-params", ops, "tenants", "list", url=url).stderr.startswith(
        "error: 403")
    missing = admin("--auth-params", "token", "tenants", "list", url=url)
    assert missing.returncode == 1 and "token:<jwt> or file:<path>" in missing.stderr
