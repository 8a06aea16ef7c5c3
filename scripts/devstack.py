#!/usr/bin/env python3
"""The local stack (`make install|run|up|down|status`): dwell_dev.cli, run with any
Python 3.11 before the venv exists (this directory, first on sys.path, holds dwell_dev)."""

from dwell_dev import as_command
from dwell_dev.cli import main

if __name__ == "__main__":
    raise SystemExit(as_command(main))
