"""The optional accelerator of the HTTP publish path: `dwell_native` (Rust, `native/`),
which plans the common request straight from its JSON and writes its answer. Admission
uses it when it is installed and `DWELL_NATIVE` is not 0; otherwise, and for every
request it hands back, the pure-Python path runs. That path is the reference the
extension is held to (tests/unit/admission/test_native.py)."""

from __future__ import annotations

import importlib
from types import ModuleType

PYTHON = "python"
NATIVE = "native"


def load(enabled: bool = True) -> ModuleType | None:
    """`dwell_native` when `enabled` and installed, else None."""
    if not enabled:
        return None
    try:
        return importlib.import_module("dwell_native")
    except ImportError:
        return None


def implementations(enabled: bool = True) -> list[str]:
    """The publish paths admission can run here: always Python; native too when the
    extension is installed and `enabled`."""
    return [PYTHON, NATIVE] if load(enabled) is not None else [PYTHON]
