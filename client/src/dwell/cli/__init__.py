"""`dwell-admin`: pulsar-admin's tenants, namespaces, topic-policies and tokens commands
for dwell. It needs the `admin` extra: ``pip install 'dwell-client[admin]'``."""

from __future__ import annotations

import sys

# What the `admin` extra brings (and what they import).
_ADMIN_EXTRA = frozenset({"typer", "click", "rich", "cryptography"})


def main() -> None:
    """The `dwell-admin` command."""
    try:
        from dwell.cli.main import app
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _ADMIN_EXTRA:
            raise
        sys.exit(f"dwell-admin needs {exc.name}: pip install 'dwell-client[admin]'")
    app()
