"""The closed label sets of loopfuse's metrics, and how an open value is folded into one.

Every label value comes from a set fixed by the code or the configuration, so the number of
series is bounded: a model outside the configured ones, a tool outside the registry, a cause
outside :data:`bus.CAUSE_TABLE` (or ``hook.<name>``) becomes :data:`OTHER`. Run ids never become
labels; they travel as exemplars (:func:`exemplar`).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Final, get_args

from bus import CAUSE_TABLE, MESSAGE_TYPES, ExitReason, ModelErrorKind, ToolResult, is_known_cause

__all__ = [
    "CONTEXT_ACTIONS",
    "EXIT_REASONS",
    "LOOP_DETECTORS",
    "LOOP_LEVELS",
    "MESSAGE_TYPE_NAMES",
    "MODEL_OUTCOMES",
    "NUDGE_KINDS",
    "OTHER",
    "TOKEN_TYPES",
    "TOOL_OUTCOMES",
    "TRUNCATION_STEPS",
    "BoundedLabel",
    "cause_label",
    "exemplar",
    "expected_pairs",
    "loop_detector",
    "nudge_kind",
    "tool_outcome",
    "truncation_step",
]

OTHER: Final = "other"
"""The bucket for any value outside a label's closed set."""

EXIT_REASONS: Final = tuple(reason.value for reason in ExitReason)

MODEL_OUTCOMES: Final[tuple[str, ...]] = ("ok", "aborted", *get_args(ModelErrorKind))
"""One model request (one HTTP attempt): ``ok``, ``aborted`` (cut by a cancel) or the
error kind of :class:`bus.ModelError`."""

TOKEN_TYPES: Final = ("input", "output")
"""As OpenTelemetry's ``gen_ai.token.type``."""

TOOL_OUTCOMES: Final = (
    "ok",
    "cache_hit",
    "error",
    "timeout",
    "invalid_arguments",
    "unknown_tool",
    "aborted",
    "blocked",
)

LOOP_DETECTORS: Final = tuple(
    cause.removeprefix("loop.") for cause in CAUSE_TABLE if cause.startswith("loop.")
)
"""Every ``loop.<name>`` cause: the registered detectors (``actors.loop.registry``) and
the idempotent cache."""

LOOP_LEVELS: Final = ("warning", "critical", "break")

TRUNCATION_RECOVER: Final = "truncation.recover"

NUDGE_KINDS: Final = (
    *(f"loop.{name}" for name in LOOP_DETECTORS),
    TRUNCATION_RECOVER,
    "budget.warning",
    "budget.continue",
)
"""Kinds pre-created at zero; a known cause (``hook.<name>`` included) is also kept."""

TRUNCATION_STEPS: Final = (
    "escalate",
    "recover_1",
    "recover_2",
    "recover_3",
    "recover_more",
    "gave_up",
)
"""Truncation recovery (seed 001): a silent retry with a higher output limit, then up to
three (configurable) recovery nudges, then giving up."""

CONTEXT_ACTIONS: Final = ("collapse", "compact", "silent_truncation")
"""What the context gatekeeper did to a prompt (``silent_truncation``: the endpoint
reported far fewer prompt tokens than estimated)."""

MESSAGE_TYPE_NAMES: Final = tuple(kind.__name__ for kind in MESSAGE_TYPES)

EXEMPLAR_MAX_CHARS: Final = 128
"""OpenMetrics' limit on an exemplar's label names and values together."""


# A pipeline's own cause: its series appears when a pipeline ends with it (as before #31).
_NOT_PRECREATED: Final = frozenset({"stage.output_rejected"})


def expected_pairs() -> tuple[tuple[str, str], ...]:
    """Every ``(exit_reason, cause)`` pair a run can end with, from :data:`bus.CAUSE_TABLE`
    (for pre-creating zero series only; an unexpected pair is still recorded)."""
    return tuple(
        (reason.value, name)
        for name, cause in CAUSE_TABLE.items()
        if name not in _NOT_PRECREATED
        for reason in cause.reasons
    )


class BoundedLabel:
    """An open set of names (models, tools) folded into a bounded one with :data:`OTHER`.

    :param known: names that keep their own value; a live container (a tool registry) is
        consulted at each lookup, so names registered later are kept too.
    """

    def __init__(self, known: Container[str] = ()) -> None:
        self._known = known
        self._extra: set[str] = set()

    def add(self, names: Iterable[str]) -> None:
        """Keep ``names`` as their own values from now on."""
        self._extra.update(names)

    def __call__(self, name: str) -> str:
        return name if name in self._extra or name in self._known else OTHER


def cause_label(cause: str) -> str:
    """``cause`` if it is in the closed set (:func:`bus.is_known_cause`), else ``other``."""
    return cause if is_known_cause(cause) else OTHER


def loop_detector(cause: str | None) -> str:
    """The detector of a ``loop.<detector>`` cause, else ``other``."""
    name = cause.removeprefix("loop.") if cause is not None and cause.startswith("loop.") else ""
    return name if name in LOOP_DETECTORS else OTHER


def nudge_kind(kind: str) -> str:
    """A nudge's kind if it is a known cause or a known kind, else ``other``."""
    return kind if kind in NUDGE_KINDS or is_known_cause(kind) else OTHER


def truncation_step(recovery: int) -> str:
    """The label of the ``recovery``-th recovery nudge of a run (1-based)."""
    return f"recover_{recovery}" if recovery <= 3 else "recover_more"


def tool_outcome(result: ToolResult) -> str:
    """How one tool call ended, as one of :data:`TOOL_OUTCOMES`."""
    if not result.is_error:
        return "cache_hit" if result.cache == "hit" else "ok"
    kind = result.error_kind
    if kind in ("timeout", "invalid_arguments", "unknown_tool", "aborted"):
        return kind
    return "error" if result.executed else "aborted"


def exemplar(run_id: str, trace_id: str | None = None) -> dict[str, str]:
    """The exemplar linking a sample to its run, within OpenMetrics' 128-character limit
    (the trace id is left out, then the run id shortened, when they would not fit)."""
    if trace_id and len("run_idtrace_id") + len(run_id) + len(trace_id) <= EXEMPLAR_MAX_CHARS:
        return {"run_id": run_id, "trace_id": trace_id}
    return {"run_id": run_id[: EXEMPLAR_MAX_CHARS - len("run_id")]}
