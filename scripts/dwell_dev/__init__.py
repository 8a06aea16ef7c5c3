"""dwell's development tooling: the local stack (`devstack`, started by `make up` and by
the test suites on their own ports), what it installs (`devinstall`), the kube tier, the
images, the secured stack's certificates and ACLs, and the helpers the tests and benches
share (`testkit`).

Standard library only, except where a module says so, so that `python3
scripts/devstack.py` runs before the project's venv exists; in the venv it is the
editable install of `scripts/` (the `dwell-dev` distribution of the dev extras).
"""

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# The checkout: the tooling is always installed editable from it.
ROOT = Path(__file__).resolve().parents[2]


def say(msg: str) -> None:
    """A line of the tooling's progress, as every step prints it."""
    print(f"dwell: {msg}", flush=True)


def as_command(main: Callable[[], int]) -> int:
    """``main()`` as a command's exit status: a failed step (a command that failed, a
    process that did not start) ends the command with its message, not a traceback."""
    try:
        return main()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        sys.exit(f"dwell: {exc}")
