"""Simulates a missing optional extra in a ``loopfuse`` subprocess (tests/test_cli_errors.py).

Put this directory first on ``PYTHONPATH`` and name the packages to hide in
``TEST_BLOCK_IMPORTS`` (comma-separated, e.g. ``opentelemetry.sdk``): importing
one of them, or a module inside it, then fails as it does when the extra is not installed.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

_BLOCKED = tuple(
    name.strip() for name in os.environ.get("TEST_BLOCK_IMPORTS", "").split(",") if name
)


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if any(fullname == name or fullname.startswith(f"{name}.") for name in _BLOCKED):
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


if _BLOCKED:
    sys.meta_path.insert(0, _Blocker())
