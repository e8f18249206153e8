"""A pipeline's config: its stages, fixed before the run."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

__all__ = ["AgentStage", "CodeStage", "PipelineConfig", "Stage", "StopPolicy"]

StopPolicy = Literal["degrade", "fail"]
"""What an agent stage's stop means: go on with what was gathered (the result is marked
degraded), or end the run with that stop's reason."""

_Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_.]*$", max_length=40)]


class CodeStage(msgspec.Struct, frozen=True, kw_only=True, tag="code"):
    """A deterministic stage: code, no model, no tokens."""

    name: _Name


class AgentStage(msgspec.Struct, frozen=True, kw_only=True, tag="agent"):
    """A model loop run through the conductor with its own settings.

    ``overrides`` are :class:`orchestrator.config.RunSettings` keys (``model``,
    ``max_turns``, ``loop_preset``, ``tools`` …) applied to this stage's runs only.
    """

    name: _Name
    overrides: dict[str, Any] = {}
    on_stop: StopPolicy = "fail"


Stage = CodeStage | AgentStage


class PipelineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The stages in order; names must be unique."""

    name: str
    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        names = [stage.name for stage in self.stages]
        if not names:
            raise ValueError(f"pipeline {self.name!r}: stages: at least one stage is needed")
        if duplicates := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(
                f"pipeline {self.name!r}: stages: duplicate names {', '.join(duplicates)}"
            )
