"""The installed `dwell-admin` console script against a real policy service."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

DWELL_ADMIN = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "dwell-admin"


@pytest.fixture(scope="module")
def policy(services):  # type: ignore[no-untyped-def]
    svc = services.start("policy", env={"DWELL_DELAYED_DELIVERY_ENABLED": "true",
                                        "DWELL_DELAYED_DELIVERY_TICK_TIME_MS": "1000"})
    yield svc
    svc.stop()


def admin(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ) | {"DWELL_POLICY_URL": url, "COLUMNS": "120"}
    return subprocess.run([str(DWELL_ADMIN), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def ok(url: str, *args: str) -> str:
    result = admin(url, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_inheritance_scenario(policy, unique: str) -> None:  # type: ignore[no-untyped-def]
    url, ns, topic = policy.url, f"{unique}/ns", f"persistent://{unique}/ns/orders"
    ok(url, "tenants", "create", unique)
    ok(url, "namespaces", "create", ns)
    assert json.loads(ok(url, "-o", "json", "namespaces", "list", unique)) == [ns]
    # A topic policy names an existing topic (dwell-admin has no topics commands).
    assert httpx.put(f"{url}/admin/v2/persistent/{ns}/orders").status_code == 204
    ok(url, "namespaces", "set-delayed-delivery", ns, "-e", "-md", "10d", "-fd", "5m")
    ok(url, "topic-policies", "set-delayed-delivery", topic, "-e", "-t", "500ms")
    ok(url, "topic-policies", "set-delayed-delivery", topic, "-g", "-e", "-t", "2s", "-md", "2w")

    # Only the flags given were sent: the topic policy holds active and tickTime alone.
    assert json.loads(ok(url, "-o", "json", "topic-policies", "get-delayed-delivery",
                         topic)) == {"active": True, "tickTime": 500}
    assert json.loads(ok(url, "-o", "json", "topic-policies", "get-delayed-delivery", topic,
                         "--applied")) == {"active": True, "tickTime": 500,
                                           "maxDeliveryDelayInMillis": 1_209_600_000,
                                           "fixedDeliveryDelayInMillis": 300_000}
    table = ok(url, "topic-policies", "get-delayed-delivery", topic, "-ap")
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
            for line in table.splitlines() if line.startswith("│")}
    assert rows == {
        "active (active)": ["true", "topic"],
        "tick time (tickTime)": ["500 ms (500ms)", "topic"],
        "max delay (maxDeliveryDelayInMillis)": ["1209600000 ms (2w)", "topic (global)"],
        "fixed delay (fixedDeliveryDelayInMillis)": ["300000 ms (5m)", "namespace"],
    }

    ok(url, "topic-policies", "remove-delayed-delivery", topic)
    assert ok(url, "-o", "json", "topic-policies", "get-delayed-delivery", topic) == "null\n"
    ok(url, "topic-policies", "remove-delayed-delivery", topic, "-g")
    ok(url, "namespaces", "remove-delayed-delivery", ns)
    assert httpx.delete(f"{url}/admin/v2/persistent/{ns}/orders").status_code == 204
    ok(url, "namespaces", "delete", ns)
    ok(url, "tenants", "delete", unique)
    assert unique not in json.loads(ok(url, "-o", "json", "tenants", "list"))


def test_enable_disable_error(policy, unique: str) -> None:  # type: ignore[no-untyped-def]
    for flags in (["-e", "-d"], []):
        result = admin(policy.url, "namespaces", "set-delayed-delivery", f"{unique}/ns", *flags)
        assert result.returncode != 0
        assert result.stderr == "Need to specify either --enable or --disable\n"


def test_server_errors_are_one_line(policy, unique: str) -> None:  # type: ignore[no-untyped-def]
    missing = admin(policy.url, "namespaces", "get-delayed-delivery", f"{unique}/nope")
    assert missing.returncode != 0
    assert missing.stderr == "error: 404 Namespace does not exist\n"
    assert missing.stdout == ""

    ok(policy.url, "tenants", "create", unique)
    again = admin(policy.url, "tenants", "create", unique)
    assert (again.returncode, again.stderr) == (1, "error: 409 Tenant already exist\n")

    ok(policy.url, "namespaces", "create", f"{unique}/ns")
    bad = admin(policy.url, "namespaces", "set-delayed-delivery", f"{unique}/ns", "-e",
                "-md", str(2**63))
    assert bad.returncode != 0 and len(bad.stderr.splitlines()) == 1
    assert "--maxDelay" in bad.stderr or "maxDeliveryDelayInMillis" in bad.stderr

    down = admin("http://127.0.0.1:1", "tenants", "list")
    assert down.returncode != 0 and len(down.stderr.splitlines()) == 1
    assert down.stderr.startswith("error: cannot reach the policy service")
    assert "Traceback" not in missing.stderr + again.stderr + bad.stderr + down.stderr
