"""Pipelines: stages fixed by config before the run, a plan known at the first event.

A pipeline is a list of stages: deterministic ones (code, no model) and agent ones (a model
loop through the conductor, each with its own model, budget, loop preset and stop policy).
The plan is enumerated from the config alone (:func:`plan_of`); optional stages were decided
by one shared :class:`Probes` answer when the config was built, so plan and run agree.
"""

from orchestrator.pipeline.config import AgentStage, CodeStage, PipelineConfig, Stage
from orchestrator.pipeline.plan import Probes, plan_of, probe
from orchestrator.pipeline.runner import (
    StageContext,
    StageHandler,
    StageOutcome,
    run_pipeline,
)

__all__ = [
    "AgentStage",
    "CodeStage",
    "PipelineConfig",
    "Probes",
    "Stage",
    "StageContext",
    "StageHandler",
    "StageOutcome",
    "plan_of",
    "probe",
    "run_pipeline",
]
