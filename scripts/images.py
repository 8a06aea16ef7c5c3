#!/usr/bin/env python3
"""`make images`: dwell_dev.images_cli, run with any Python 3.11 (`check` needs the venv's)."""

from dwell_dev import as_command
from dwell_dev.images_cli import main

if __name__ == "__main__":
    raise SystemExit(as_command(main))
