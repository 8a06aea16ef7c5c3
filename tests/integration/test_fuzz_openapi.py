"""schemathesis against the three services' OpenAPI specs, each service running for real
on the test Redis and Kafka: generated requests (valid and invalid) must never get a 5xx,
and every answer must fit the spec (status, content type and body schema).

The services run with authentication and authorization on, the fuzzer sending a
super-user's token (made at test time); `make fuzz` also runs them with auth off.
`make test` runs FUZZ_CASES cases per operation without the stateful phase (a few hundred
per service); `make fuzz` sets DWELL_FUZZ_FULL=1 for every phase and at least
FULL_MIN_CASES per service and mode, and prints each service's summary either way."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dwell.auth.tokens import create_secret_key, create_token

pytestmark = pytest.mark.integration

FULL = os.environ.get("DWELL_FUZZ_FULL") == "1"
# Per operation and phase (schemathesis --max-examples). The full run's counts give each
# service at least FULL_MIN_CASES: policy has 30 operations, the tracker 6, admission 1.
FUZZ_CASES = 4
FULL_CASES = {"policy": 100, "admission": 2000, "tracker": 400}
FULL_MIN_CASES = 2000
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")
SEED = 16
FUZZ_REDIS_DB = 9


@dataclass
class Fuzzed:
    urls: dict[str, str]
    headers: list[str]  # schemathesis -H arguments


@pytest.fixture(scope="module", params=["auth-on", "auth-off"] if FULL else ["auth-on"])
def fuzzed(request: pytest.FixtureRequest, services: Any,
           redis_url: str) -> Iterator[Fuzzed]:
    """The three services on a Redis database of their own (the fuzzer's tenants stay out
    of the other suites' stores); admission creates no topic on first use, so generated
    topic names do not become Kafka topics. With auth on, the fuzzer is a super-user."""
    env = {"DWELL_REDIS_URL": redis_url.rsplit("/", 1)[0] + f"/{FUZZ_REDIS_DB}"}
    headers: list[str] = []
    if request.param == "auth-on":
        secret = create_secret_key()
        env |= {"DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
                "DWELL_SUPER_USER_ROLES": "fuzz-root",
                "DWELL_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode()}
        headers = ["-H", f"Authorization: Bearer {create_token(secret, 'HS256', 'fuzz-root')}"]
    started = [services.start("policy", env=env),
               services.start("admission", env=env | {
                   "DWELL_ALLOW_AUTO_TOPIC_CREATION": "false",
                   "DWELL_INGRESS_ENABLED": "false"}),
               services.start("tracker", env=env)]
    yield Fuzzed({svc.name: svc.url for svc in started}, headers)
    for svc in started:
        svc.stop()


def run_schemathesis(url: str, report: Path, cases: int,
                     extra: list[str]) -> tuple[int, str]:
    cmd = [str(Path(sys.executable).parent / "schemathesis"), "--no-color", "run",
           f"{url}/openapi.json", "--checks", CHECKS, "--max-examples", str(cases),
           "--seed", str(SEED), "--workers", "1", "--request-timeout", "30",
           "--suppress-health-check", "too_slow,filter_too_much",
           "--report", "ndjson", "--report-ndjson-path", str(report), *extra]
    if not FULL:
        cmd += ["--phases", "examples,coverage,fuzzing"]
    # In the test's own folder: schemathesis keeps a cache of crashes where it runs.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=report.parent)
    return proc.returncode, proc.stdout + proc.stderr


def cases(report: Path) -> int:
    """Test cases sent, from the run's event stream."""
    n = 0
    for line in report.read_text().splitlines():
        event = json.loads(line)
        for _, body in event.items():
            if isinstance(body, dict) and "recorder" in body:
                n += len(body["recorder"].get("cases", {}))
    return n


@pytest.mark.parametrize("service", ["policy", "admission", "tracker"])
def test_no_5xx_and_no_schema_violation(fuzzed: Fuzzed, service: str,
                                        tmp_path: Path) -> None:
    report = tmp_path / f"{service}.ndjson"
    rc, out = run_schemathesis(fuzzed.urls[service], report,
                               FULL_CASES[service] if FULL else FUZZ_CASES, fuzzed.headers)
    summary = out[out.rfind("=" * 20, 0, out.find("SUMMARY")):] if "SUMMARY" in out else out
    n = cases(report)
    mode = "auth on" if fuzzed.headers else "auth off"
    print(f"\n--- schemathesis, {service}, {mode}: {n} cases ---\n{summary[-3000:]}")
    assert rc == 0, out[-20000:]
    if FULL:
        assert n >= FULL_MIN_CASES, n
