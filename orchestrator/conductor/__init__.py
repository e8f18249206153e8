"""The conductor: one run's state machine, PLAN → ACT → OBSERVE → … → DONE | FAILED.

Split by concern, each module a layer of one class (bottom to top): ``state`` (transcript,
counters, result), ``control`` (checkpoints and the control inbox), ``model_call``,
``context_recovery``, ``tool_phase``, ``final_answer``, and ``conductor`` (the loop).
"""

from __future__ import annotations

from orchestrator.conductor.conductor import Conductor
from orchestrator.conductor.inputs import RunCheckpoint, RunInputs

__all__ = ["Conductor", "RunCheckpoint", "RunInputs"]
