"""Fixtures of the chart's tests."""

from __future__ import annotations

import pytest

import devstack


@pytest.fixture(scope="session")
def helm() -> str:
    """Helm, built once into .dwell/cache/bin (devstack.helm_bin)."""
    return str(devstack.helm_bin())
