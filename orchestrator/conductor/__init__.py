"""The conductor: one run's state machine, PLAN → ACT → OBSERVE → … → DONE | FAILED.

A composition (``docs/architecture.md``): ``state`` (the run's record), ``inbox`` (the
control inbox and checkpoints), the phases ``model_call``, ``context_recovery``,
``tool_phase`` and ``final_answer``, and ``conductor`` (the loop that runs them).
"""

from __future__ import annotations

from orchestrator.conductor.conductor import Conductor
from orchestrator.conductor.inputs import (
    ConductorSettings,
    ContextFunctions,
    RunCheckpoint,
    RunInputs,
)

__all__ = ["Conductor", "ConductorSettings", "ContextFunctions", "RunCheckpoint", "RunInputs"]
