"""Semantic checks of a decoded scenario: what the types alone cannot say.

:func:`check_scenario` yields ``(key path, reason)`` for each problem, in file order.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Final

from actors.tools.schema import argument_checker, inline_refs
from bus import is_known_cause
from orchestrator.sim.scenario import MAIN_TRACK, Expect, Fault, Scenario, Step

__all__ = ["check_scenario"]

Problem = tuple[str, str]

_NAME: Final = re.compile(r"^[A-Za-z0-9_.-]+$")
_TOOL_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_RESULT_SIZE: Final = 100_000_000
"""The largest ``size`` of a scripted tool result (characters)."""
PARAMETER_TYPES: Final = frozenset({"string", "integer", "number", "boolean", "array", "object"})


def check_scenario(scenario: Scenario) -> Iterator[Problem]:
    """Every semantic problem of ``scenario``."""
    if not _NAME.match(scenario.name):
        yield "name", f"{scenario.name!r} is not a model name (letters, digits, _ . -)"
    if not scenario.task.strip():
        yield "task", "must not be empty"
    if scenario.context_window is not None and scenario.context_window < 1:
        yield "context_window", "must be at least 1"
    for key in scenario.folder:
        path = PurePosixPath(key)
        if not key or path.is_absolute() or ".." in path.parts or "\\" in key:
            yield f"folder.{key!r}", "must be a relative path inside the folder"
    seen: set[str] = set()
    for i, tool in enumerate(scenario.tools):
        at = f"tools[{i}]"
        if not _TOOL_NAME.match(tool.name):
            yield f"{at}.name", f"{tool.name!r} is not a tool name (1-64 of A-Z a-z 0-9 _ -)"
        if tool.name in seen:
            yield f"{at}.name", f"duplicate tool {tool.name!r}"
        seen.add(tool.name)
        if tool.has_json_schema:
            try:
                argument_checker(inline_refs(tool.json_schema()))
            except ValueError as exc:
                yield f"{at}.parameters", str(exc)
        else:
            for arg, kind in tool.parameters.items():
                if not isinstance(kind, str) or kind.removesuffix("?") not in PARAMETER_TYPES:
                    allowed = ", ".join(sorted(PARAMETER_TYPES))
                    yield f"{at}.parameters.{arg}", f"expected a type name ({allowed}), or a schema"
        for j, case in enumerate(tool.cases):
            if not case.results:
                yield f"{at}.cases[{j}].results", "must not be empty"
        replies = [*tool.results, *(r for case in tool.cases for r in case.results)]
        if any(not isinstance(r, str) and not 0 <= r.size <= MAX_RESULT_SIZE for r in replies):
            yield f"{at}.results", f"size must be between 0 and {MAX_RESULT_SIZE:,}"
        yield from _out_of_range(at, tool, ("delay_seconds",))
    yield from _check_track("steps", scenario.steps)
    for name, steps in scenario.tracks.items():
        if name == MAIN_TRACK or not _NAME.match(name):
            yield f"tracks.{name}", "invalid track name (not 'main'; letters, digits, _ . -)"
        yield from _check_track(f"tracks.{name}", steps)
    known = {MAIN_TRACK, *scenario.tracks}
    known_names = ", ".join(sorted(known))
    targets = {branch.track for branch in scenario.branches}
    for i, branch in enumerate(scenario.branches):
        at = f"branches[{i}]"
        if not branch.nudge:
            yield f"{at}.nudge", "must name a nudge kind"
        if branch.track not in known:
            yield f"{at}.track", f"unknown track {branch.track!r} (known: {known_names})"
        if branch.from_track is not None and branch.from_track not in known:
            yield f"{at}.from_track", f"unknown track {branch.from_track!r}"
        if branch.nth is not None and branch.nth < 1:
            yield f"{at}.nth", "must be at least 1"
    for name in scenario.tracks:
        # a pipeline's stages play tracks; loop checks play `loop_check`
        if name not in targets and scenario.pipeline is None and name != "loop_check":
            yield f"tracks.{name}", "no branch switches to this track"
    if (abort := scenario.abort) is not None:
        conditions = (abort.after_text_chars, abort.after_tool_result)
        if sum(condition is not None for condition in conditions) != 1:
            yield "abort", "set exactly one of after_text_chars, after_tool_result"
        if abort.after_text_chars is not None and abort.after_text_chars < 1:
            yield "abort.after_text_chars", "must be at least 1"
        if abort.after_tool_result is not None and not _TOOL_NAME.match(abort.after_tool_result):
            yield "abort.after_tool_result", f"{abort.after_tool_result!r} is not a tool name"
    yield from _check_expect("expect", scenario.expect)
    labels: set[str] = set()
    for i, run in enumerate(scenario.runs):
        at = f"runs[{i}]"
        if not _TOOL_NAME.match(run.label):  # a label takes a tool name's characters
            yield f"{at}.label", f"{run.label!r} is not a label (letters, digits, _ -)"
        if run.label in labels:
            yield f"{at}.label", f"duplicate label {run.label!r}"
        labels.add(run.label)
        if run.task is not None and not run.task.strip():
            yield f"{at}.task", "must not be empty"
        if run.expect is not None:
            yield from _check_expect(f"{at}.expect", run.expect)


def _out_of_range(at: str, spec: object, keys: tuple[str, ...]) -> Iterator[Problem]:
    """``must not be negative`` for each of ``keys`` set to a negative number, ``must be
    finite`` for one set to ``inf`` or ``nan`` (TOML has both)."""
    for key in keys:
        if (value := getattr(spec, key)) is None:
            continue
        if value < 0:
            yield f"{at}.{key}", "must not be negative"
        elif not value < math.inf:
            yield f"{at}.{key}", "must be finite"


def _check_track(at: str, steps: tuple[Step, ...]) -> Iterator[Problem]:
    if not steps:
        yield at, "must have at least one step"
    for i, step in enumerate(steps):
        yield from _check_step(f"{at}[{i}]", step, last=i == len(steps) - 1)


def _check_step(at: str, step: Step, *, last: bool) -> Iterator[Problem]:
    yield from _out_of_range(
        at, step, ("text_tokens", "latency", "chunk_latency", "keep_alive", "require_images")
    )
    if step.chunk_size < 1:
        yield f"{at}.chunk_size", "must be at least 1"
    for key in ("repeat", "cycle"):
        if getattr(step, key) and not last:
            yield f"{at}.{key}", f"only the last step of a track can {key}"
    if step.cycle and step.repeat:
        yield f"{at}.cycle", "set repeat or cycle, not both"
    if step.stream is not None and step.stream.splits is not None:
        splits = step.stream.splits
        if any(b <= a for a, b in itertools.pairwise(splits)) or min(splits, default=1) < 1:
            yield f"{at}.stream.splits", "must be increasing offsets of at least 1"
    always_fails = any(f.forever for f in step.faults)
    if not (step.text or step.text_tokens or step.tool_calls or always_fails):
        yield at, "a step needs text, text_tokens, tool_calls or a fault that is forever"
    if step.finish_reason == "tool_calls" and not step.tool_calls:
        yield f"{at}.finish_reason", "'tool_calls' needs tool_calls"
    for j, call in enumerate(step.tool_calls):
        if not _TOOL_NAME.match(call.name):
            yield f"{at}.tool_calls[{j}].name", f"{call.name!r} is not a tool name"
        if call.arguments and call.raw_arguments is not None:
            yield f"{at}.tool_calls[{j}]", "set arguments or raw_arguments, not both"
    if step.usage is not None:
        yield from _out_of_range(f"{at}.usage", step.usage, ("prompt_tokens", "completion_tokens"))
    for j, fault in enumerate(step.faults):
        yield from _check_fault(f"{at}.faults[{j}]", fault, last=j == len(step.faults) - 1)


def _check_fault(at: str, fault: Fault, *, last: bool) -> Iterator[Problem]:
    if fault.times < 1:
        yield f"{at}.times", "must be at least 1"
    if fault.forever and not last:
        yield f"{at}.forever", "only the last fault of a step can be forever"
    yield from _out_of_range(at, fault, ("after_chunks", "retry_after", "retry_after_ms"))
    status = fault.status
    if fault.kind == "status" and status is None:
        yield f"{at}.status", "missing required key for kind 'status'"
    elif fault.kind == "drop" and status is not None:
        yield f"{at}.status", "a dropped connection has no status"
    elif fault.kind in ("empty_stream", "interrupt") and status is not None:
        yield f"{at}.status", f"a fault of kind {fault.kind!r} is a 200 stream: no status"
    elif status is not None and not 400 <= status <= 599:
        yield f"{at}.status", f"{status} is not an error status (400-599)"


def _check_expect(at: str, expect: Expect) -> Iterator[Problem]:
    if expect.cause is not None and not is_known_cause(expect.cause):
        yield f"{at}.cause", f"unknown cause {expect.cause!r}"
    yield from _out_of_range(
        at, expect, ("turns", "llm_requests", "tool_calls", "max_llm_requests", "nudges")
    )
    for i, call in enumerate(expect.calls):
        if call.call < 1:
            yield f"{at}.calls[{i}].call", "must be at least 1 (the first call is 1)"
        if call.verdict is None and call.tool is None:
            yield f"{at}.calls[{i}]", "set verdict or tool"
