"""The fault suite's stack: Redis, Apache Kafka, policy, admission, tracker and the Spark
app as real processes of devstack's `faults` profile (ports 500 above the test profile,
state in .dwell/faults), so the faults it injects (kill -9, FLUSHALL, Kafka stopped)
never reach the other suites' servers. Started once for the package, stopped after.

Its processes run with dwell_dev.workload's PROCESS_SETTINGS: a short drain lease and
restage lead, so that the short scenarios (delays 0-10 s) exercise the re-filing and a
killed drain's lease."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from dwell.core.topics import TopicName
from dwell_dev.workload import (
    Checker,
    FaultStack,
    Generator,
    Row,
    SdkReader,
    format_table,
    now_ms,
    outcome,
    wait_delivered,
)

ROOT = Path(__file__).resolve().parents[2]

# The short forms `make test` runs; DWELL_FAULTS_FULL=1 runs the sizes.
FULL = os.environ.get("DWELL_FAULTS_FULL") == "1"
RATE = 200 if FULL else 100  # messages a second
MAX_DELAY_MS = 60_000 if FULL else 10_000
RUN_S = 120 if FULL else 24  # how long the generator publishes
FAULT_AT_S = 30 if FULL else 8


@dataclass
class Run:
    """One scenario's workload: fresh topics on a fresh tenant, its generator, checker
    and SDK consumer."""

    stack: FaultStack
    topics: list[str]
    generator: Generator
    checker: Checker
    sdk: SdkReader
    rows: list[Row]
    fault_ms: int = 0
    notes: list[str] = field(default_factory=list)

    def finish(self, scenario: str, settle_s: float = 90) -> Row:
        self.generator.stop()
        pub = self.generator.out
        sdk_ids = {i for i, t in pub.topic_of.items() if t == self.sdk.topic}
        wait_delivered(pub, self.checker, settle_s, self.sdk, sdk_ids)
        # A copy delivered twice comes shortly after the first: give repeats a moment.
        time.sleep(2)
        self.checker.stop()
        self.sdk.stop()
        row = outcome(scenario, pub, self.checker, self.sdk, self.fault_ms)
        self.rows.append(row)
        print("\n" + format_table([row]))
        assert not pub.other_errors, pub.other_errors[:5]
        # No loop of the tracker stuck inside a call (dwell.liveness; its stack is then in
        # the tracker's log).
        health = httpx.get(f"http://127.0.0.1:{self.stack.ports['tracker']}/healthz", timeout=5)
        assert health.status_code == 200, health.text
        return row


@pytest.fixture(scope="package")
def fault_stack() -> Iterator[FaultStack]:
    s = FaultStack("faults")
    try:
        s.start_all()
        yield s
    finally:
        s.down()


# Every scenario's row, printed together at the end of the run.
ROWS: list[Row] = []


@pytest.fixture(scope="package")
def fault_rows() -> list[Row]:
    return ROWS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ROWS:
        return
    table = format_table(ROWS)
    out = ROOT / ".dwell" / "faults"
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.txt").write_text(table + "\n")
    terminalreporter.write_sep("-", "fault suite (lost, early>tick and dup(SDK) must be 0)")
    for line in table.splitlines():
        terminalreporter.write_line(line)


@pytest.fixture()
def workload(fault_stack: FaultStack, fault_rows: list[Row], unique: str) -> Iterator[
        Callable[..., Run]]:
    runs: list[Run] = []

    def make(rate: int = RATE, topics: int = 2, start: bool = True) -> Run:
        fault_stack.make_namespace(unique)
        names_ = [f"persistent://{unique}/ns/t{i}" for i in range(topics)]
        admission = f"http://127.0.0.1:{fault_stack.ports['admission']}"
        gen = Generator(admission, names_, rate=rate, max_delay_ms=MAX_DELAY_MS)
        checker = Checker(fault_stack.kafka_bootstrap,
                          [TopicName.parse(t).kafka_topic for t in names_])
        sdk = SdkReader(names_[0], "faults", fault_stack.service_env(),
                        fault_stack.log_dir)
        run = Run(fault_stack, names_, gen, checker, sdk, fault_rows)
        runs.append(run)
        # Wait until admission has the namespace (it follows the policy feed).
        deadline = time.monotonic() + 15
        while True:
            with httpx.Client(base_url=admission, timeout=10) as c:
                t = names_[0].split("://")[1]
                r = c.post(f"/topics/persistent/{t}", json={
                    "producerName": "probe", "messages": [{"payload": "probe"}]})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        checker.start()
        sdk.start()
        if start:
            gen.start()
        return run

    yield make
    for run in runs:
        run.generator.stopping.set()
        run.checker.stopping.set()
        run.sdk.stop()


def at_fault(run: Run, seconds: float = FAULT_AT_S) -> None:
    """Let the workload run ``seconds``, then note the fault's time."""
    time.sleep(seconds)
    run.fault_ms = now_ms()


def rest_of_run(run: Run) -> None:
    left = RUN_S - (now_ms() - run.fault_ms) / 1000 - FAULT_AT_S
    if left > 0:
        time.sleep(left)
