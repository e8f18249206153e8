"""Build loopfuse's hot path as C extensions with mypyc (everything else is in pyproject.toml).

The modules in :data:`COMPILED` run for every message of every turn: the bus, the
conductor, the monitors and observers. mypyc turns their strictly typed Python into C
extensions (the same sources, type-checked by ``mypy --strict``), which halves the
orchestrator's CPU per turn (``docs/performance.md``). Every other module stays Python.

For now the build is opt-in: ``LOOPFUSE_COMPILE=1 pip install .`` (needs a C compiler and
the Python headers); without it every module stays Python.
"""

from __future__ import annotations

import os

from setuptools import setup

COMPILED = [
    "bus/bus.py",
    "bus/exit.py",
    "orchestrator/conductor/conductor.py",
    "orchestrator/conductor/context_recovery.py",
    "orchestrator/conductor/control.py",
    "orchestrator/conductor/final_answer.py",
    "orchestrator/conductor/model_call.py",
    "orchestrator/conductor/state.py",
    "orchestrator/conductor/tool_phase.py",
    "orchestrator/metrics/labels.py",
    "orchestrator/metrics/recorder.py",
    "orchestrator/metrics/series.py",
    "actors/budget_monitor.py",
    "actors/context_gatekeeper.py",
    "actors/fingerprint.py",
    "actors/loop_monitor.py",
    "actors/progress_reporter.py",
    "actors/token_budget.py",
    "actors/tool_executor.py",
    "actors/workers.py",
    "actors/context/calibration.py",
    "actors/context/planning.py",
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
]
"""The compiled modules. Modules that define msgspec Structs stay Python (mypyc would
build the class without its ``frozen=True``), and so do async generators (unsupported)."""


def _extensions() -> list[object]:
    if os.environ.get("LOOPFUSE_COMPILE") != "1":
        return []
    from mypyc.build import mypycify

    return list(mypycify(COMPILED, opt_level="3"))


setup(ext_modules=_extensions())
