"""Build loopfuse's hot path as C extensions with mypyc (everything else is in pyproject.toml).

The modules in :data:`COMPILED` run for every message of every turn: the bus, the
conductor, the monitors and observers. mypyc turns their strictly typed Python into C
extensions (the same sources, checked by ``mypy --strict``), which halves the orchestrator's
CPU per turn (``docs/performance.md``). Every other module stays Python.

Only a built wheel or a regular install (``pip install .``) compiles. An editable install
(``pip install -e .``) stays pure Python, so an edited module runs as edited with no rebuild.
Compiling needs a C compiler and the Python headers. Without them (or with
``LOOPFUSE_PURE_PYTHON=1`` at install time) the install goes on as pure Python, the same
behaviour at the old speed (``pip install -v`` shows why);
:func:`orchestrator.runtime.compiled.compiled_modules` tells at run time which modules are compiled.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = [
    "bus/bus.py",
    "bus/exit.py",
    "orchestrator/conductor/conductor.py",
    "orchestrator/conductor/context_recovery.py",
    "orchestrator/conductor/final_answer.py",
    "orchestrator/conductor/inbox.py",
    "orchestrator/conductor/model_call.py",
    "orchestrator/conductor/state.py",
    "orchestrator/conductor/tool_phase.py",
    "orchestrator/runtime/event_log.py",
    "orchestrator/metrics/labels.py",
    "orchestrator/metrics/recorder.py",
    "orchestrator/metrics/series.py",
    "actors/budget/monitor.py",
    "actors/context/gatekeeper.py",
    "actors/fingerprint.py",
    "actors/loop/monitor.py",
    "actors/progress/reporter.py",
    "actors/budget/tokens.py",
    "actors/tools/executor.py",
    "actors/workers.py",
    "actors/context/calibration.py",
    "actors/context/ledger.py",
    "actors/context/planning.py",
    "actors/context/probing.py",
    "actors/context/tokens.py",
    "actors/context/windows.py",
    "actors/hooks/runner.py",
    "actors/loop/content.py",
    "actors/loop/cycle.py",
    "actors/loop/detector.py",
    "actors/loop/generic.py",
    "actors/loop/global_breaker.py",
    "actors/loop/ping_pong.py",
    "actors/loop/poll.py",
    "actors/tools/cache.py",
    "actors/tools/invoke.py",
    "actors/tools/registry.py",
    "actors/tools/schema.py",
]
"""The compiled modules. Modules that define msgspec Structs stay Python (mypyc would
build the class without its ``frozen=True``), and so do async generators (unsupported)."""


class _OptionalBuildExt(build_ext):
    """Builds the extensions, or leaves the modules pure Python if the compiler fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers: the pure-Python build works
            for ext in self.extensions:  # no half-built set (a module without its runtime)
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            _fall_back(f"compiling failed ({exc})")


def _fall_back(why: str) -> None:
    print(f"loopfuse: {why}; installing pure Python (slower hot path)", file=sys.stderr)


_BUILDING_COMMANDS = frozenset({"bdist_wheel", "build", "build_ext", "install"})
"""The setup commands that make installable code; ``editable_wheel`` (``pip install -e``)
and the metadata steps (``egg_info``, ``dist_info``) are not among them."""


def _extensions() -> list[Any]:
    if os.environ.get("LOOPFUSE_PURE_PYTHON") == "1":
        return []
    if _BUILDING_COMMANDS.isdisjoint(sys.argv[1:]):
        return []
    try:
        from mypyc.build import mypycify

        return list(mypycify(COMPILED, opt_level="3"))
    except (Exception, SystemExit) as exc:  # mypyc reports type errors with SystemExit
        _fall_back(f"mypyc could not compile the hot path ({exc!r})")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
