"""The one process supervisor of the tooling: the local stack (`make up`, whose processes
outlive the command and are found again by pid), the tests' services and Spark apps and
the benches' processes all start and end their children here.

A child runs in a session of its own, its output appended to one log file. Stopping it is
SIGTERM to its process group, then SIGKILL; killing it (the crash a test or a fault wants)
is SIGKILL to every process of its session, which reaches the Spark app's JVM and the
Python workers PySpark puts in process groups of their own. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class ChildFailed(RuntimeError):
    """A child exited, or did not become ready in time; the message ends with its log."""


@dataclass
class Child:
    """One supervised process: ``pid`` leads its session and process group; ``popen`` is
    there when this process started it (then its exit status is reaped)."""

    name: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def spawn(cls, name: str, argv: Sequence[str], log: Path,
              env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Child:
        """Start ``argv`` with ``env`` (added to this process's environment), its output
        appended to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            popen = subprocess.Popen(list(argv), cwd=cwd, env=dict(os.environ) | dict(env or {}),
                                     stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(name, popen.pid, log, popen)

    # -- state

    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return alive(self.pid)

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    # -- waiting

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str = "ready",
                   poll_s: float = 0.2) -> float:
        """Seconds until ``ready()`` holds; ChildFailed, with the log's end, when the child
        exits first or ``timeout`` passes."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if not self.running():
                raise ChildFailed(f"{self.name} exited {self.returncode} before it was "
                                  f"{what}; {self.log}:\n{self.tail()}")
            if ready():
                return time.monotonic() - t0
            time.sleep(poll_s)
        raise ChildFailed(f"{self.name} not {what} within {timeout:.0f}s; {self.log}:\n"
                          + self.tail())

    def wait_for_line(self, line: str, timeout: float) -> float:
        """Seconds until ``line`` is in the log (the child's own word that it is ready)."""
        return self.wait_until(lambda: line in self.tail(1 << 30), timeout,
                               f"logging {line!r}")

    def wait_exit(self, timeout: float) -> bool:
        """Whether the child exited (on its own) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        self._reap()
        return True

    # -- ending

    def signal(self, sig: signal.Signals) -> None:
        """``sig`` to the child's process group (SIGSTOP / SIGCONT freeze and thaw it)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self, timeout: float = 30.0) -> None:
        """kill -9 of every process of the child's session, as a pod's end would be;
        returns once none runs."""
        deadline = time.monotonic() + timeout
        while left := session_members(self.pid):
            if time.monotonic() > deadline:
                raise ChildFailed(f"{self.name}: processes {left} still run after SIGKILL")
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        self._reap()

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``; False when it was not running."""
        if not self.running():
            self._reap()
            return False
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            time.sleep(0.05)
        if self.running():
            self.kill()
        self._reap()
        return True

    def _reap(self) -> None:
        if self.popen is not None:
            self.popen.wait()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` that still run (Linux's /proc; a zombie whose
    parent died may wait there for a reaper, but runs nothing)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, _, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if int(session) == sid and state != "Z":
            pids.append(int(stat.parent.name))
    return pids
