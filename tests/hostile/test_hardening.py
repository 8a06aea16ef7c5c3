"""Hardening of every process, as real processes over the real stack: DWELL_ENV=production
refuses what runs unprotected unless allowed by name, a key of the wrong kind stops a
service at start, and with `authenticateMetricsEndpoint` /metrics (which names every
tenant's topics) answers only a super-user or a metrics role."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dwell.auth.guard import Guard
from dwell.auth.tokens import create_key_pair, create_secret_key, create_token
from dwell.settings import CommonSettings
from dwell_dev.testkit import ServiceFactory, free_port

SECRET = create_secret_key()
SECRET_B64 = base64.b64encode(SECRET).decode()
SUPER, WATCHER, TENANT_ADMIN = "root", "prometheus", "acme-admin"


def run_until_exit(module: str, env: dict[str, str], timeout: float = 90.0
                   ) -> subprocess.CompletedProcess[str]:
    """Start `python -m <module>` and wait for it to exit (a refusal exits at start)."""
    return subprocess.run([sys.executable, "-m", module], env=dict(os.environ) | env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("module", ["dwell.policy", "dwell.admission", "dwell.tracker",
                                    "dwell_spark"])
def test_production_refuses_an_unprotected_setup_at_start(services: ServiceFactory,
                                                          module: str) -> None:
    env = services.stack.service_env() | {
        "DWELL_ENV": "production", "DWELL_HTTP_PORT": str(free_port()),
        "DWELL_REDIS_URL": "redis://:pw@127.0.0.1:1/0", "DWELL_AUTHENTICATION_ENABLED": "false"}
    done = run_until_exit(module, env)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-2000:]
    assert "DWELL_ENV=production refuses to run with authentication off" in out, out[-2000:]
    for name in ("auth", "kafka-plaintext", "redis-plaintext", "http-plaintext"):
        assert f"allow with '{name}'" in out
    assert "DWELL_ALLOW_INSECURE" in out


def test_production_starts_with_each_gap_allowed_by_name(services: ServiceFactory) -> None:
    svc = services.start("policy", {
        "DWELL_ENV": "production",
        "DWELL_REDIS_URL": services.stack.redis_url.replace("redis://", "redis://:unused@"),
        "DWELL_ALLOW_INSECURE": "auth,kafka-plaintext,redis-plaintext,http-plaintext"},
        ready=False)
    try:
        assert httpx.get(svc.url + "/healthz", timeout=5).status_code == 200
    finally:
        svc.stop()


def _pem_public() -> bytes:
    from cryptography.hazmat.primitives import serialization as ser

    der = create_key_pair("RS256")[1]
    return ser.load_der_public_key(der).public_bytes(ser.Encoding.PEM,
                                                     ser.PublicFormat.SubjectPublicKeyInfo)


@pytest.mark.parametrize(("module", "raw", "says"), [
    ("dwell.policy", create_key_pair("RS256")[1], "holds a DER public key"),
    ("dwell.admission", _pem_public(), "holds a PEM PUBLIC KEY"),
    ("dwell.tracker", create_key_pair("ES256")[1], "holds a DER public key"),
])
def test_a_public_key_as_the_secret_key_stops_the_service_at_start(
        services: ServiceFactory, tmp_path: Path, module: str, raw: bytes, says: str) -> None:
    """A DER public key was taken as an HMAC secret (whoever has the public key signs
    tokens), and a PEM one made every request a 500."""
    key = tmp_path / "given-as-secret.key"
    key.write_bytes(raw)
    done = run_until_exit(module, services.stack.service_env() | {
        "DWELL_HTTP_PORT": str(free_port()), "DWELL_AUTHENTICATION_ENABLED": "true",
        "DWELL_AUTHORIZATION_ENABLED": "true", "DWELL_TOKEN_SECRET_KEY": f"file:{key}"})
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-2000:]
    assert f"DWELL_TOKEN_SECRET_KEY {says}, not a secret key" in out, out[-2000:]
    assert "DWELL_TOKEN_PUBLIC_KEY" in out


METRICS_ENV = {"DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
               "DWELL_TOKEN_SECRET_KEY": f"data:;base64,{SECRET_B64}",
               "DWELL_SUPER_USER_ROLES": SUPER, "DWELL_METRICS_ROLES": WATCHER,
               "DWELL_AUTHENTICATE_METRICS_ENDPOINT": "true"}


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(SECRET, 'HS256', role)}"}


def assert_metrics_guarded(url: str) -> None:
    anonymous = httpx.get(url, timeout=10)
    assert anonymous.status_code == 401, anonymous.text
    assert "Authentication required" in anonymous.json()["reason"]
    forged = httpx.get(url, timeout=10, headers={"Authorization": "Bearer x.y.z"})
    assert forged.status_code == 401
    tenant = httpx.get(url, timeout=10, headers=bearer(TENANT_ADMIN))
    assert tenant.status_code == 403, tenant.text
    assert "may not read the metrics" in tenant.json()["reason"]
    for role in (SUPER, WATCHER):
        answer = httpx.get(url, timeout=10, headers=bearer(role))
        assert answer.status_code == 200 and "# HELP" in answer.text, role


@pytest.mark.parametrize("name", ["policy", "admission", "tracker"])
def test_metrics_need_a_super_user_or_metrics_role(services: ServiceFactory,
                                                   name: str) -> None:
    svc = services.start(name, METRICS_ENV, ready=False)
    try:
        assert_metrics_guarded(svc.url + "/metrics")
        assert httpx.get(svc.url + "/healthz", timeout=10).status_code == 200  # probes stay open
    finally:
        svc.stop()


@pytest.fixture()
def spark_metrics_port() -> Iterator[int]:
    from dwell_spark import metrics

    saved = dict(os.environ)
    os.environ.update(METRICS_ENV)
    try:
        guard = Guard(CommonSettings())
    finally:
        os.environ.clear()
        os.environ.update(saved)
    port = free_port()
    server = metrics.serve("127.0.0.1", port, None, guard.check_metrics)
    yield port
    server.shutdown()
    server.server_close()


def test_the_spark_apps_metrics_port_is_guarded_too(spark_metrics_port: int) -> None:
    base = f"http://127.0.0.1:{spark_metrics_port}"
    assert_metrics_guarded(base + "/metrics")
    assert httpx.get(base + "/healthz", timeout=10).status_code == 200


def test_metrics_stay_open_by_default_as_in_pulsar(services: ServiceFactory) -> None:
    env = {k: v for k, v in METRICS_ENV.items() if k != "DWELL_AUTHENTICATE_METRICS_ENDPOINT"}
    svc = services.start("policy", env, ready=False)
    try:
        assert httpx.get(svc.url + "/metrics", timeout=10).status_code == 200
    finally:
        svc.stop()
