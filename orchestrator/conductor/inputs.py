"""What a run starts from: its fixed inputs, the settings the conductor reads, the context
functions it is handed, and the checkpoint a resumed run goes on after."""

from __future__ import annotations

from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec

from bus import ChatMessage, Fold, Nudge, ToolSpec, Usage
from orchestrator.result import CallLogEntry, TraceEntry

__all__ = [
    "CompactionPrompt",
    "ConductorSettings",
    "ContextFunctions",
    "RunCheckpoint",
    "RunInputs",
]


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
    pending_nudges: tuple[Nudge, ...] = ()
    """Nudges given during the turn, to be injected before the next model call (a loop
    warning, a token target's continuation)."""
    monitors: dict[str, bytes] = {}
    """The monitors' states of the run by monitor name (the loop monitor's history, the
    token budget's account), added by the runtime (``orchestrator.runtime.resume``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ConductorSettings:
    """What the conductor reads of a run's settings (the runtime makes it from the config's
    ``RunSettings``; no defaults here, so none is written twice). The budgets are only passed
    on, in ``RunStarted``; 0 means none."""

    model: str
    max_turns: int
    max_tool_calls: int
    deadline_seconds: float
    max_output_tokens: int | None
    escalated_max_tokens: int | None
    tool_timeout_seconds: float
    abort_grace_seconds: float
    truncation_recoveries: int
    max_cache_hits: int
    cache_ttl_seconds: float
    cache_max_entries: int
    answer_max_tokens: int
    answer_deadline_seconds: float
    on_stop: Literal["keep", "answer"]
    output_token_budget: int
    input_token_budget: int
    cost_budget: float
    budget_mode: Literal["ceiling", "target"]
    input_price_per_million: float
    output_price_per_million: float


class CompactionPrompt(Protocol):
    """The request that asks the model to summarise ``messages`` (turns ``first_turn`` to
    ``last_turn``)."""

    def __call__(
        self,
        messages: Sequence[ChatMessage],
        *,
        first_turn: int,
        last_turn: int,
        history_chars: int,
        summary_max_tokens: int,
    ) -> tuple[ChatMessage, ...]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextFunctions:
    """How the context gatekeeper's answers are carried out on a transcript. The runtime
    passes ``actors.context``'s functions; the conductor only calls them."""

    fold: Callable[[MutableSequence[ChatMessage], Sequence[Fold]], list[Fold]]
    """Put each fold's stub in place of its tool result; returns the folds that missed."""
    compaction_prompt: CompactionPrompt
    summary: Callable[[str, int, int], ChatMessage]
    """The message that stands for turns ``first``..``last`` once summarised."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunInputs:
    """Everything one run needs, fixed before it starts."""

    run_id: str
    trace_id: str
    task: str
    settings: ConductorSettings
    context: ContextFunctions
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
    traceparent: str = ""
    """The caller's span this run continues (W3C ``traceparent``; its trace id is
    ``trace_id``), passed on in ``RunStarted``; empty: none."""
    notes: tuple[str, ...] = ()
    """What the run's settings became beside what was asked (a loop threshold clamped):
    published as ``Notice(kind="loop.config")`` after ``RunStarted`` and kept in the
    result's ``notes``."""
