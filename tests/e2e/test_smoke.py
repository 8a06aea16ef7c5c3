"""`python -m dwell.smoke`, the chart's `helm test` hook, against the real delivery stack:
what tests/kube cannot prove under kwok (which runs no container) is proven here."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import Dwell


def test_smoke_publishes_a_delayed_message_and_sees_it_arrive(e2e: Dwell) -> None:
    env = dict(os.environ, DWELL_POLICY_URL=e2e.policy, DWELL_ADMISSION_URL=e2e.admission,
               DWELL_KAFKA_BOOTSTRAP=e2e.bootstrap, DWELL_TRACKER_URL=e2e.tracker)
    got = subprocess.run([sys.executable, "-m", "dwell.smoke", "--delay-ms", "2000",
                          "--timeout-s", "60"], env=env, capture_output=True, text=True,
                         timeout=120)
    print(got.stdout, got.stderr)
    assert got.returncode == 0, got.stderr
    assert "smoke: ok:" in got.stdout


def test_smoke_fails_when_nothing_answers() -> None:
    env = dict(os.environ, DWELL_POLICY_URL="http://127.0.0.1:9", DWELL_ADMISSION_URL=
               "http://127.0.0.1:9")
    got = subprocess.run([sys.executable, "-m", "dwell.smoke", "--timeout-s", "5"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 1
    assert "smoke: FAILED:" in got.stderr
