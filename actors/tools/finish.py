"""``finish_exploration``: the explicit end of the exploration stage (seed 000).

The schema makes ``experiment``, ``goal`` and ``key_findings`` required, with three
optional slots. The tool only acknowledges; the conductor sees ``finishes_stage`` and ends
the stage, decoding the same arguments with :class:`FinishExploration`.

``key_findings`` holds at most :data:`KEY_FINDINGS_MAX` items. Servers that generate tool
arguments under the tool's schema (llama.cpp's grammars) stop the list there; without the
bound a small model's list ran on until it filled the window. A longer list is refused
like any invalid argument, so the model can try again.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from actors.tools.context import ToolContext

__all__ = ["KEY_FINDINGS_MAX", "FinishExploration", "finish_exploration"]

_Text = Annotated[str, msgspec.Meta(min_length=1)]
KEY_FINDINGS_MAX: Final = 20
"""The most items ``key_findings`` may hold (``maxItems`` in the schema)."""


class FinishExploration(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """End the exploration and record what it found."""

    experiment: Annotated[_Text, msgspec.Meta(description="What experiment the data is from.")]
    goal: Annotated[_Text, msgspec.Meta(description="What the experiment set out to show.")]
    key_findings: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            min_length=1,
            max_length=KEY_FINDINGS_MAX,
            description="The main findings, one per item.",
        ),
    ]
    requirements: Annotated[
        str | None, msgspec.Meta(description="The assignment's requirements, if any.")
    ] = None
    method: Annotated[
        str | None, msgspec.Meta(description="How the data was taken or should be analysed.")
    ] = None
    exemplar: Annotated[
        str | None, msgspec.Meta(description="A model report to follow, if one was found.")
    ] = None


async def finish_exploration(params: FinishExploration, ctx: ToolContext) -> str:
    """Acknowledge the findings; the stage ends after this call."""
    count = len(params.key_findings)
    return (
        f"Exploration finished: {params.experiment!r} recorded with {count} key "
        f"finding{'s' if count != 1 else ''}. The next stage starts now."
    )
