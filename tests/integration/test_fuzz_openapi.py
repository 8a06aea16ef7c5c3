"""schemathesis against the three services' OpenAPI specs, each service running for real
on the test Redis and Kafka: generated requests (valid and invalid) must never get a 5xx,
and every answer must fit the spec (status, content type and body schema).

`make test` runs FUZZ_CASES cases per operation (a few hundred per service); `make fuzz`
sets DWELL_FUZZ_FULL=1 for at least FULL_MIN_CASES per service, and prints each
service's summary either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

FULL = os.environ.get("DWELL_FUZZ_FULL") == "1"
FUZZ_CASES = 200 if FULL else 6  # per operation and phase (schemathesis --max-examples)
FULL_MIN_CASES = 2000
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")
SEED = 16
FUZZ_REDIS_DB = 9


@pytest.fixture(scope="module")
def fuzzed(services: Any, redis_url: str) -> Iterator[dict[str, str]]:
    """The three services on a Redis database of their own (the fuzzer's tenants stay out
    of the other suites' stores); admission creates no topic on first use, so generated
    topic names do not become Kafka topics."""
    env = {"DWELL_REDIS_URL": redis_url.rsplit("/", 1)[0] + f"/{FUZZ_REDIS_DB}"}
    started = [services.start("policy", env=env),
               services.start("admission", env=env | {
                   "DWELL_ALLOW_AUTO_TOPIC_CREATION": "false",
                   "DWELL_INGRESS_ENABLED": "false"}),
               services.start("tracker", env=env)]
    yield {svc.name: svc.url for svc in started}
    for svc in started:
        svc.stop()


def run_schemathesis(url: str, report: Path, extra: list[str]) -> tuple[int, str]:
    cmd = [str(Path(sys.executable).parent / "schemathesis"), "--no-color", "run",
           f"{url}/openapi.json", "--checks", CHECKS, "--max-examples", str(FUZZ_CASES),
           "--seed", str(SEED), "--workers", "1", "--request-timeout", "30",
           "--suppress-health-check", "too_slow,filter_too_much",
           "--report", "ndjson", "--report-ndjson-path", str(report), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
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
def test_no_5xx_and_no_schema_violation(fuzzed: dict[str, str], service: str,
                                        tmp_path: Path) -> None:
    report = tmp_path / f"{service}.ndjson"
    rc, out = run_schemathesis(fuzzed[service], report, [])
    summary = out[out.rfind("=" * 20, 0, out.find("SUMMARY")):] if "SUMMARY" in out else out
    n = cases(report)
    print(f"\n--- schemathesis, {service}: {n} cases ---\n{summary[-3000:]}")
    assert rc == 0, out[-20000:]
    if FULL:
        assert n >= FULL_MIN_CASES, n
