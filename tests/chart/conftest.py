"""Fixtures of the chart's tests."""

from __future__ import annotations

import pytest

from dwell_dev import devinstall


@pytest.fixture(scope="session")
def helm() -> str:
    """Helm, built once into .dwell/cache/bin (devinstall.helm_bin)."""
    return str(devinstall.helm_bin())
