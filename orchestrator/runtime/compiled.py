"""Which of loopfuse's modules run compiled (mypyc, ``setup.py``) and which as Python."""

from __future__ import annotations

import os
import sys
import sysconfig

__all__ = ["STALE_FIX", "compiled_modules", "stale_modules"]

STALE_FIX = (
    "delete them (`find bus actors orchestrator -name '*.so' -delete`): an editable "
    "install is pure Python, and Python imports an extension before the source beside it"
)

_PACKAGES = ("bus", "actors", "orchestrator")
_EXTENSIONS = (".so", ".pyd")


def _loaded() -> list[tuple[str, str]]:
    return [
        (name, path)
        for name, module in list(sys.modules.items())
        if (path := getattr(module, "__file__", None)) and name.split(".", 1)[0] in _PACKAGES
    ]


def compiled_modules() -> tuple[str, ...]:
    """The imported loopfuse modules that are C extensions, sorted by name."""
    return tuple(sorted(name for name, path in _loaded() if path.endswith(_EXTENSIONS)))


def stale_modules() -> tuple[str, ...]:
    """Compiled modules in a source tree whose source beside them changed after they were
    built: extensions left by an older build, which Python imports instead of the edited
    source (delete them; an editable install is pure Python)."""
    paths = sysconfig.get_paths()
    roots = tuple(os.path.realpath(paths[key]) + os.sep for key in ("purelib", "platlib"))
    stale = []
    for name, path in _loaded():
        # one in an installed package is left out: a wheel's sources beside its extensions
        # keep the wheel's times, which say nothing about staleness
        if not path.endswith(_EXTENSIONS) or os.path.realpath(path).startswith(roots):
            continue
        source = os.path.join(os.path.dirname(path), name.rsplit(".", 1)[-1] + ".py")
        if os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(path):
            stale.append(name)
    return tuple(sorted(stale))
