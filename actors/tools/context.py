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
    """

    run_id: str
    root: Path | None = None
    limits: ToolLimits = field(default_factory=ToolLimits)
    state: dict[str, Any] = field(default_factory=dict)
