"""The scenario format: frozen msgspec Structs for one scripted model and the run around it.

A scenario is a TOML file; ``docs/scenarios.md`` says what each key means. The simulator
plays its ``steps`` (the ``main`` track) and ``tracks``; the runtime sets the run up from the
rest, and tests compare the run with ``expect``. Struct constructors do not validate:
:func:`orchestrator.sim.loader.load_scenario` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from bus import ExitReason

__all__ = [
    "MAIN_TRACK",
    "AbortTrigger",
    "Branch",
    "CallExpectation",
    "ErrorShape",
    "Expect",
    "Fault",
    "FaultKind",
    "FinishReason",
    "RunVariant",
    "Scenario",
    "ScriptedCall",
    "ScriptedUsage",
    "ServerProfile",
    "Step",
    "StreamShape",
    "ToolCase",
    "ToolDef",
    "ToolReply",
]

MAIN_TRACK: Final = "main"

FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]
FaultKind = Literal["status", "context_length", "stream_error", "drop", "empty_stream", "interrupt"]
ErrorShape = Literal["openai", "deepseek", "vllm", "vllm_old", "llama_cpp", "llama_cpp_python"]
ServerProfile = Literal["openai", "llama_cpp_python"]
ArgumentStream = Literal["delta", "cumulative"]
CallVerdict = Literal["allow", "warn", "block", "not_run"]


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every scenario Struct: immutable, and unknown keys are errors."""


class ScriptedCall(_Spec, frozen=True, kw_only=True):
    """A tool call the model makes. ``{n}`` in a string argument becomes the reply index.

    ``raw_arguments`` is sent verbatim instead of ``arguments`` (e.g. malformed JSON).
    """

    name: str
    arguments: dict[str, Any] = {}
    raw_arguments: str | None = None
    id: str | None = None


class ScriptedUsage(_Spec, frozen=True, kw_only=True):
    """Token usage to report; a missing count is estimated (characters / 4)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Fault(_Spec, frozen=True, kw_only=True):
    """How the first ``times`` attempts of a step fail (every attempt when ``forever``)."""

    kind: FaultKind = "status"
    status: int | None = None
    shape: ErrorShape = "openai"
    message: str | None = None
    type: str | None = None
    code: str | None = None
    retry_after: float | None = None
    retry_after_ms: int | None = None
    after_chunks: int = 1
    times: int = 1
    forever: bool = False


class StreamShape(_Spec, frozen=True, kw_only=True):
    """How a streamed reply's tool calls are cut into chunks (servers differ)."""

    arguments: ArgumentStream = "delta"
    repeat_head: bool = False
    splits: tuple[int, ...] | None = None


class Step(_Spec, frozen=True, kw_only=True):
    """One model reply: text and/or tool calls, how it is streamed, and how attempts fail."""

    text: str = ""
    text_tokens: int = 0
    tool_calls: tuple[ScriptedCall, ...] = ()
    finish_reason: FinishReason | None = None
    usage: ScriptedUsage | None = None
    latency: float = 0.0
    chunk_latency: float = 0.0
    chunk_size: int = 16
    keep_alive: float = 0.0
    repeat: bool = False
    honor_max_tokens: bool = True
    faults: tuple[Fault, ...] = ()
    require_images: int = 0
    cycle: bool = False
    stream: StreamShape | None = None


class Branch(_Spec, frozen=True, kw_only=True):
    """On a nudge of kind ``nudge`` (its ``nth`` one, if set), switch to ``track``.

    ``from_track`` limits the switch to runs currently on that track.
    """

    nudge: str
    track: str
    nth: int | None = None
    from_track: str | None = None


class ToolReply(_Spec, frozen=True, kw_only=True):
    """What a scripted tool returns: ``text`` (repeated to ``size`` characters if set), or a
    tool error when ``error`` is set."""

    text: str = ""
    error: str | None = None
    size: int = 0

    def content(self) -> str:
        """The result's text, repeated to ``size`` characters if set."""
        if not self.size or not self.text:
            return self.text
        return (self.text * (self.size // len(self.text) + 1))[: self.size]


class ToolCase(_Spec, frozen=True, kw_only=True):
    """Results for calls whose arguments include every key/value of ``arguments``."""

    arguments: dict[str, Any]
    results: tuple[str | ToolReply, ...]


class ToolDef(_Spec, frozen=True, kw_only=True):
    """A fake tool the runtime registers for the run; the simulator never executes it.

    ``parameters`` is a JSON schema (a table with ``type = "object"``) or a simple map
    ``{arg = "string" | "integer" | …}``; a type ending in ``?`` makes the argument optional.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = {}
    idempotent: bool = False
    results: tuple[str | ToolReply, ...] = ()
    cases: tuple[ToolCase, ...] = ()
    delay_seconds: float = 0.0

    @property
    def has_json_schema(self) -> bool:
        """True when ``parameters`` is a JSON schema (``type = "object"`` and a
        ``properties`` table, or nothing else) rather than a simple map."""
        parameters = self.parameters
        if parameters.get("type") != "object":
            return False
        return isinstance(parameters.get("properties"), dict) or len(parameters) == 1

    def json_schema(self) -> dict[str, Any]:
        """The parameters as a JSON schema object."""
        if self.has_json_schema:
            return dict(self.parameters)
        kinds = {arg: str(kind) for arg, kind in self.parameters.items()}
        properties = {arg: {"type": kind.removesuffix("?")} for arg, kind in kinds.items()}
        required = [arg for arg, kind in kinds.items() if not kind.endswith("?")]
        return {"type": "object", "properties": properties, "required": required}

    def match(self, arguments: Mapping[str, Any]) -> int:
        """Index of the first case matching ``arguments``, or -1 for the default results."""
        for index, case in enumerate(self.cases):
            if all(k in arguments and arguments[k] == v for k, v in case.arguments.items()):
                return index
        return -1

    def reply(self, arguments: Mapping[str, Any], nth: int) -> ToolReply:
        """The reply to the ``nth`` (0-based) call that matched the same case as ``arguments``;
        ``{n}`` in its text becomes ``nth``."""
        case = self.match(arguments)
        results = self.results if case < 0 else self.cases[case].results
        if not results:
            return ToolReply(error=f"no scripted result for {self.name} with these arguments")
        result = results[min(nth, len(results) - 1)]
        reply = ToolReply(text=result) if isinstance(result, str) else result
        error = reply.error.replace("{n}", str(nth)) if reply.error is not None else None
        return ToolReply(text=reply.text.replace("{n}", str(nth)), error=error, size=reply.size)


class CallExpectation(_Spec, frozen=True, kw_only=True):
    """What became of the run's ``call``-th (1-based) proposed tool call: the loop verdict
    (``allow``, ``warn``, ``block``, ``not_run``) and, if set, the tool it called."""

    call: int
    verdict: CallVerdict | None = None
    tool: str | None = None


class Expect(_Spec, frozen=True, kw_only=True):
    """How a run of this scenario must end; every unset count is not checked."""

    exit_reason: ExitReason
    cause: str | None = None
    turns: int | None = None
    llm_requests: int | None = None
    tool_calls: int | None = None
    max_llm_requests: int | None = None
    incomplete: bool | None = None
    degraded: bool | None = None
    nudges: int | None = None
    calls: tuple[CallExpectation, ...] = ()
    detail_contains: tuple[str, ...] = ()
    hint_contains: tuple[str, ...] = ()


class AbortTrigger(_Spec, frozen=True, kw_only=True):
    """Abort the run (as its caller would) once this happens; exactly one condition is set.
    The simulator ignores it; the scenario runner watches the run's events."""

    after_text_chars: int | None = None
    after_tool_result: str | None = None
    detail: str = ""


class PipelineSpec(_Spec, frozen=True, kw_only=True):
    """``[pipeline]``: the pipeline a scenario runs (``name``) and its ``options``."""

    name: str
    options: dict[str, Any] = {}


class RunVariant(_Spec, frozen=True, kw_only=True):
    """One of several runs a file starts concurrently (``[[runs]]``): the same script under
    its own ``config`` (merged over the file's, table by table at the top level) and its
    own ``expect``. It is the scenario ``NAME.LABEL``."""

    label: str
    config: dict[str, Any] = {}
    task: str | None = None
    expect: Expect | None = None
    """Default: the file's ``[expect]``."""


class Scenario(_Spec, frozen=True, kw_only=True):
    """One scripted model plus the run around it; ``name`` is the model name to request.

    A file with ``runs`` stands for one scenario per run (:meth:`expand`)."""

    name: str = ""
    description: str = ""
    task: str
    system: str | None = None
    config: dict[str, Any] = {}
    folder: dict[str, str] = {}
    tools: tuple[ToolDef, ...] = ()
    steps: tuple[Step, ...]
    tracks: dict[str, tuple[Step, ...]] = {}
    branches: tuple[Branch, ...] = ()
    context_window: int | None = None
    context_error: ErrorShape = "openai"
    server: ServerProfile = "openai"
    """How the simulator answers where servers differ (:mod:`orchestrator.sim.llama`)."""
    abort: AbortTrigger | None = None
    pipeline: PipelineSpec | None = None
    """Run this pipeline instead of one agent run; each agent stage asks for model
    ``NAME/STAGE`` and plays the track named after the stage."""
    wire: bool = False
    """Play the model over HTTP even when nothing in the scenario needs it."""
    runs: tuple[RunVariant, ...] = ()
    expect: Expect
    """With ``runs`` and no ``[expect]`` of its own: the first run's (the loader sets it)."""

    def expand(self) -> tuple[Scenario, ...]:
        """One scenario per run of ``runs`` (named ``NAME.LABEL``), or this one alone."""
        if not self.runs:
            return (self,)
        return tuple(
            msgspec.structs.replace(
                self,
                name=f"{self.name}.{run.label}",
                task=run.task if run.task is not None else self.task,
                config=_merged(self.config, run.config),
                expect=run.expect or self.expect,
                runs=(),
            )
            for run in self.runs
        )


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``; a table in both is merged one level down (``loop``)."""
    merged = dict(base)
    for key, value in override.items():
        below = merged.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            merged[key] = {**below, **value}
        else:
            merged[key] = value
    return merged
