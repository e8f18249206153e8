"""What a runtime is given: a run to start (:class:`RunSpec`), where a journal wants it
started (:class:`StartPoint`), and the seams a caller may plug in (:class:`RunJournal`,
:class:`ModelActor`)."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
from anyio.abc import TaskStatus

from bus import ChatMessage
from orchestrator.conductor import RunCheckpoint

__all__ = ["ModelActor", "RunJournal", "RunSpec", "StartPoint"]


class RunSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What to run: a task for the model, with optional per-run overrides.

    ``overrides`` takes the keys of :class:`orchestrator.config.RunSettings`
    (``max_turns``, ``max_tool_calls``, ``deadline_seconds``, ``model`` …).
    """

    task: str
    system: str | None = None
    folder: str | None = None
    overrides: dict[str, Any] = {}
    run_id: str | None = None
    trace_id: str | None = None
    traceparent: str | None = None
    """The W3C ``traceparent`` of the caller's span: the run's span is its child, and the
    run's trace id its trace id (unless ``trace_id`` says otherwise)."""
    history: tuple[ChatMessage, ...] = ()
    """Earlier turns between the system prompt and the task (pipeline retries, revisions)."""
    stage: str = "agent"
    plan: tuple[str, ...] = ("agent",)


class StartPoint(msgspec.Struct, frozen=True, kw_only=True):
    """How a :class:`RunJournal` wants a run started: its trace id, and the checkpoint it
    resumes from (``None``: a first start)."""

    trace_id: str | None = None
    resume: RunCheckpoint | None = None
    traceparent: str | None = None
    """The caller's span the run continues (W3C ``traceparent``), if any."""


class RunJournal(Protocol):
    """Keeps runs durable across restarts (the daemon's store implements it).

    :meth:`start_point` is asked when a run with a given id starts; :meth:`checkpoint` is
    told every completed turn of every run and must not block.
    """

    def start_point(self, run_id: str) -> StartPoint | None: ...

    def checkpoint(self, checkpoint: RunCheckpoint) -> None: ...


class ModelActor(Protocol):
    """An actor that answers :class:`bus.ModelRequest` in place of the LLM caller (e.g. the
    in-process scripted model of ``bench``)."""

    async def run(self, *, task_status: TaskStatus[None] = ...) -> None: ...
