"""What a tool knows about the run it serves."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.tools.limits import ToolLimits

__all__ = ["ToolContext"]


@dataclass(slots=True)
class ToolContext:
    """One run's view for its tools.

    :param run_id: the run being served.
    :param root: the folder the file tools may read, or ``None`` when the run has none.
    :param limits: read and listing limits.
    :param state: per-run scratch space for tools (scripted results count calls here);
        dropped with the run.
    :param temporary: folders a tool made on the host for this run (``make_figure``'s
        outputs): the tool executor removes them when the run finishes, or, for a stage run
        of a pipeline (``PIPELINE.STAGE``), when the pipeline finishes.
    :param finished: set when the run finished: a call still running then removes what it
        makes itself.
    """

    run_id: str
    root: Path | None = None
    limits: ToolLimits = field(default_factory=ToolLimits)
    state: dict[str, Any] = field(default_factory=dict)
    temporary: list[Path] = field(default_factory=list)
    finished: bool = False
