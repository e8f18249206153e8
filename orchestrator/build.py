"""Which of loopfuse's modules run compiled (mypyc, ``setup.py``) and which as Python."""

from __future__ import annotations

import os
import sys

__all__ = ["compiled_modules", "stale_modules"]

_PACKAGES = ("bus", "actors", "orchestrator")
_EXTENSIONS = (".so", ".pyd")


def _loaded() -> list[tuple[str, str]]:
    loaded = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and name.split(".", 1)[0] in _PACKAGES:
            loaded.append((name, path))
    return loaded


def compiled_modules() -> tuple[str, ...]:
    """The imported loopfuse modules that are C extensions, sorted by name."""
    return tuple(sorted(name for name, path in _loaded() if path.endswith(_EXTENSIONS)))


def stale_modules() -> tuple[str, ...]:
    """Imported compiled modules whose source beside them changed after they were built
    (an editable install edited since: run ``pip install -e .`` again)."""
    stale = []
    for name, path in _loaded():
        if not path.endswith(_EXTENSIONS):
            continue
        source = os.path.join(os.path.dirname(path), name.rsplit(".", 1)[-1] + ".py")
        if os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(path):
            stale.append(name)
    return tuple(sorted(stale))
