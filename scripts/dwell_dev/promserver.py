"""A Prometheus server (Debian's `prometheus` package) on 127.0.0.1 that scrapes given
`/metrics` endpoints and evaluates the chart's rules: the e2e suite checks the dashboards
and alerts against it (tests/e2e/test_prometheus.py).

Standard library only, like devstack: `make chart-tools` installs the package through it.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dwell_dev import devinstall, devstack
from dwell_dev.procs import Child, ChildFailed

# Prometheus' own port, shifted like the other ports of a profile (test: 19090 by default).
BASE_PORT = 9090


def prometheus_bin() -> Path:
    """The Prometheus server, from Debian's prometheus package (the one promtool comes in)."""
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    devinstall.apt_install("prometheus", "the Prometheus server")
    return Path("/usr/bin/prometheus")


def port(profile: str) -> int:
    """Prometheus' port in a profile: BASE_PORT plus the profile's offset."""
    return BASE_PORT + devstack.PROFILES[profile]["redis"] - devstack.PROFILES["dev"]["redis"]


def config(targets: Mapping[str, Sequence[str]], rule_files: Sequence[Path],
           interval_s: float) -> str:
    """prometheus.yml (JSON is YAML): one job per name, scraping its host:port targets."""
    every = f"{int(interval_s * 1000)}ms"
    return json.dumps({
        "global": {"scrape_interval": every, "evaluation_interval": every,
                   "scrape_timeout": every},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(hosts)}]}
                           for job, hosts in targets.items()],
    }, indent=2)


class Prometheus:
    """One server: `start()` writes the config under ``state`` and waits until it is
    ready; `query()` asks its HTTP API; `stop()` ends exactly that process."""

    def __init__(self, state: Path, listen_port: int,
                 targets: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = (),
                 interval_s: float = 1.0) -> None:
        self.state = state
        self.port = listen_port
        self.targets = targets
        self.rule_files = list(rule_files)
        self.interval_s = interval_s
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.state / "prometheus.log"

    def start(self, timeout: float = 60.0) -> Prometheus:
        if devstack.port_open(self.port):
            raise RuntimeError(f"port {self.port} for prometheus is taken")
        data = self.state / "data"
        if data.exists():
            shutil.rmtree(data)
        data.mkdir(parents=True)
        cfg = self.state / "prometheus.yml"
        cfg.write_text(config(self.targets, self.rule_files, self.interval_s))
        argv = [str(prometheus_bin()), f"--config.file={cfg}",
                f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=1h",
                f"--web.listen-address=127.0.0.1:{self.port}"]
        self.child = Child.spawn("prometheus", argv, self.log)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False
        try:
            self.child.wait_until(ready, timeout, "ready")
        except ChildFailed:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

    def wait_up(self, timeout: float = 30.0) -> None:
        """Until every target has been scraped successfully (service discovery hands
        Prometheus its static targets some seconds after start)."""
        deadline = time.monotonic() + timeout
        want = sum(len(hosts) for hosts in self.targets.values())
        while True:
            active = self.api("targets")["activeTargets"]
            down = [t["scrapeUrl"] + ": " + (t["lastError"] or t["health"])
                    for t in active if t["health"] != "up"]
            if len(active) == want and not down:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus targets not up in {timeout}s: {down}")
            time.sleep(0.5)

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        """GET /api/v1/<path>; the `data` of a success, RuntimeError with Prometheus'
        error otherwise."""
        qs = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{qs}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at the current time: its series (vector or scalar result)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return list(data["result"])
        return [{"metric": {}, "value": data["result"]}]

    def label_values(self, label: str, match: str) -> list[str]:
        """Grafana's `label_values(match, label)`: the label's values on matching series."""
        return list(self.api(f"label/{label}/values", **{"match[]": match}))
