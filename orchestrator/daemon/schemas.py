"""The daemon's API vocabulary: frozen msgspec Structs for every request and response body.

Request bodies forbid unknown fields, so a misspelt key is a 422 that names it rather than
a silently ignored option. The OpenAPI description (:mod:`orchestrator.daemon.openapi`) is
generated from these types, so the document and the decoder cannot disagree.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = [
    "REQUEST_DECODER",
    "ErrorBody",
    "ErrorDetail",
    "Health",
    "PipelineRequest",
    "RunAccepted",
    "RunPage",
    "RunRequest",
    "RunStatus",
    "RunView",
]

RunStatus = Literal["queued", "running", "ended"]
"""``queued``: accepted, waiting for a slot; ``running``: started; ``ended``: has a result."""


class PipelineRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A pipeline run: ``report`` reads the request's ``folder`` and writes a report about
    ``goal`` (scan, explore, draft, reflect, finalize; see ``docs/pipelines.md``)."""

    name: Literal["report"]
    goal: Annotated[str, msgspec.Meta(min_length=1)]
    format: Literal["markdown", "latex"] = "markdown"
    reflect_rounds: Annotated[int, msgspec.Meta(ge=0, le=5)] = 1


class RunRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/runs``: a task for the model, a pipeline on a folder, or a shipped
    scenario by name.

    ``config`` overrides the run's settings by key (the keys of
    :class:`orchestrator.config.RunSettings`: ``max_turns``, ``model``, ``on_crash`` …) as
    far as the operator's ``[daemon.client_overrides]`` allows; a ``folder`` must lie in
    ``daemon.folder_roots`` (``docs/security.md``). A repeated ``idempotency_key`` returns
    the run it first created, also to repeats sent at the same time.
    """

    task: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    scenario: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    pipeline: PipelineRequest | None = None
    system: str | None = None
    folder: str | None = None
    config: dict[str, Any] = {}
    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None


class RunAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """``202`` to ``POST /v1/runs``: the run is stored and will run."""

    id: str
    trace_id: str
    status: RunStatus


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """One run: its status and, once ended, its full result (without the transcript)."""

    id: str
    trace_id: str
    status: RunStatus
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_reason: str | None = None
    cause: str | None = None
    on_crash: Literal["resume", "abort"]
    events: int
    """The id of the last stored event (events are numbered 1, 2, … per run)."""
    events_dropped: int = 0
    request: RunRequest | None = None
    """What was submitted; ``None`` (with ``request_error``) for a request stored by an
    older version in a shape this one no longer reads."""
    request_error: str | None = None
    simulated: bool = False
    """No model is configured: the embedded simulator answered (or answers) this task or
    pipeline run, not a model (the result says so too: ``simulated``, ``note``)."""
    result: dict[str, Any] | None = None


class RunPage(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/runs``: newest first; pass ``next_cursor`` as ``cursor`` for the next page.

    Each run is a summary: its request's ``task``, ``system``, ``folder``, ``scenario`` and
    ``pipeline.goal`` cut to 200 characters, its ``config`` empty, no ``result``
    (``GET /v1/runs/{id}`` has them whole). A page ends before it passes
    ``daemon.max_page_bytes`` (it always holds one run), so it may hold fewer than ``limit``
    runs with a ``next_cursor``."""

    runs: list[RunView]
    next_cursor: str | None = None


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What went wrong: a stable ``code``, a sentence, and the offending key if any."""

    code: str
    message: str
    key: str | None = None


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every 4xx/5xx body."""

    error: ErrorDetail


class Health(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``/healthz`` and ``/readyz``."""

    status: Literal["ok", "draining", "starting"]
    reason: str | None = None


REQUEST_DECODER: Final = msgspec.json.Decoder(RunRequest)
