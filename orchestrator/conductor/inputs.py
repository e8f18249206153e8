"""What a run starts from: its fixed inputs, and the checkpoint a resumed run goes on after."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from bus import (
    ChatMessage,
    ToolSpec,
    Usage,
)
from orchestrator.config import RunSettings
from orchestrator.result import CallLogEntry, TraceEntry

__all__ = ["RunCheckpoint", "RunInputs"]

logger = logging.getLogger("loopfuse.conductor")


class RunCheckpoint(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A run's state after a completed turn: what it takes to resume it elsewhere or later.

    The transcript is the state; the counters carry on so that budgets and the result
    count the turns before the resume too.
    """

    run_id: str
    trace_id: str
    turn: int
    elapsed_seconds: float
    transcript: tuple[ChatMessage, ...]
    llm_requests: int = 0
    tool_calls: int = 0
    usage: Usage = Usage()
    nudges: int = 0
    injected: tuple[tuple[str, str], ...] = ()
    truncations: int = 0
    output: str = ""
    trace: tuple[TraceEntry, ...] = ()
    call_log: tuple[CallLogEntry, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class RunInputs:
    """Everything one run needs, fixed before it starts."""

    run_id: str
    trace_id: str
    task: str
    settings: RunSettings
    tool_specs: tuple[ToolSpec, ...] = ()
    finishing_tools: frozenset[str] = frozenset()
    system: str | None = None
    folder: str | None = None
    stage: str = "agent"
    plan: tuple[str, ...] = ("agent",)
    history: tuple[ChatMessage, ...] = ()
    """Earlier turns placed between the system prompt and the task (a pipeline stage's
    retry or revision round goes on from its previous reply)."""
    resume: RunCheckpoint | None = None
    """Go on after this checkpoint's turn (its transcript) instead of starting afresh;
    an empty transcript starts from the task, still marked as resumed."""
    on_checkpoint: Callable[[RunCheckpoint], None] | None = None
    """Called after every completed turn with the state to resume from (must not block)."""
