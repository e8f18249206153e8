"""The plan: stage names enumerated from the config alone, and the one shared probe."""

from __future__ import annotations

import importlib.util
import shutil

import msgspec

from orchestrator.pipeline.config import PipelineConfig

__all__ = ["Probes", "plan_of", "probe"]


class Probes(msgspec.Struct, frozen=True, kw_only=True):
    """What this machine offers, probed once and shared by the plan and the run."""

    xelatex: str | None = None
    """The path of ``xelatex``, or ``None`` when it was not found."""
    matplotlib: bool = False


def probe() -> Probes:
    """Probe the machine once (``xelatex`` on PATH, matplotlib importable)."""
    return Probes(
        xelatex=shutil.which("xelatex"),
        matplotlib=importlib.util.find_spec("matplotlib") is not None,
    )


def plan_of(config: PipelineConfig) -> tuple[str, ...]:
    """The stage names in order: the progress plan, known before the first stage runs."""
    return tuple(stage.name for stage in config.stages)
