#!/usr/bin/env python3
"""`make dev-tools` and `make bench-peers`' build of kms: dwell_dev.devtools, run with any
Python 3.11."""

from dwell_dev import as_command
from dwell_dev.devtools import main

if __name__ == "__main__":
    raise SystemExit(as_command(main))
