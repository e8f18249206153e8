"""The cause table (bus/causes.py) is the one place a stop's meaning is declared.

These tests read the product's source and the docs, so a cause used anywhere but declared
nowhere, a stop or a result built around the table, or a doc naming a (reason, cause) pair
the table does not declare, fails here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus import (
    CAUSE_TABLE,
    ENCODER,
    MESSAGE_TYPES,
    ExitReason,
    StopSignal,
    is_known_cause,
    reason_of,
    stop_signal,
)
from bus.causes import HOOK, cause_of
from orchestrator.daemon.recovery import phase_of
from orchestrator.daemon.store import StoredEvent
from tests.messages_examples import examples

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bus", "actors", "orchestrator")
# Calls whose first argument is a cause.
CAUSE_CALLS = {"stop_signal", "StageFailed", "reason_of", "cause_hint", "end_result"}
REASONS = "|".join(reason.value for reason in ExitReason)
# The docs' way of naming an ending: `max_turns` / `budget.max_turns`.
DOC_PAIR = re.compile(rf"`({REASONS})` ?/ ?`([a-z_]+\.[a-z_<>.]+)`")


def product_files() -> Iterator[tuple[Path, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def causes_used(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every string constant the code uses as a cause: a cause call's first argument, a
    ``cause=`` keyword, a comparison with ``.cause``, a ``*_CAUSE`` constant."""
    for node in ast.walk(tree):
        values: list[ast.expr] = []
        if isinstance(node, ast.Call):
            if _name(node.func) in CAUSE_CALLS and node.args:
                cause_arg = 3 if _name(node.func) == "end_result" else 0
                values += node.args[cause_arg : cause_arg + 1]
            values += [kw.value for kw in node.keywords if kw.arg == "cause"]
        elif isinstance(node, ast.Compare) and _name(node.left) == "cause":
            values += node.comparators
        elif isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_name(t).endswith("CAUSE") for t in targets):
                values.append(node.value)
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield value.lineno, value.value
            elif isinstance(value, ast.JoinedStr):  # f"hook.{name}": the open family
                head = value.values[0]
                assert isinstance(head, ast.Constant)
                assert isinstance(head.value, str)
                yield value.lineno, f"{head.value}<name>"


def test_every_cause_the_code_uses_is_declared() -> None:
    undeclared = []
    seen = set()
    for path, tree in product_files():
        for line, cause in causes_used(tree):
            seen.add(cause)
            if cause_of(cause) is None and cause != HOOK.name:
                undeclared.append(f"{path.relative_to(ROOT)}:{line}: {cause}")
    assert undeclared == []
    assert {"loop.cache_hits", "model.end_turn", "internal.error", HOOK.name} <= seen


def test_only_the_cause_table_builds_a_stop_and_only_end_result_a_run_result() -> None:
    """Every StopSignal takes its reason and flags from the table (bus.stop_signal); every
    RunResult its outcome and hint (orchestrator.result.end_result / finished_result)."""
    allowed = {"StopSignal": {"bus/causes.py"}, "RunResult": {"orchestrator/result.py"}}
    outside = []
    for path, tree in product_files():
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            name = _name(node.func) if isinstance(node, ast.Call) else ""
            if isinstance(node, ast.Call) and name in allowed and where not in allowed[name]:
                outside.append(f"{where}:{node.lineno}: {name}(...)")
    assert outside == []


def test_every_ending_the_docs_name_is_declared() -> None:
    pairs = {
        (match[1], match[2], path.name)
        for path in sorted((ROOT / "docs").glob("*.md"))
        for match in DOC_PAIR.finditer(path.read_text())
    }
    assert len(pairs) > 10
    wrong = [
        f"{doc}: `{reason}` / `{cause}`"
        for reason, cause, doc in sorted(pairs)
        if (declared := cause_of(cause) or (HOOK if cause == HOOK.name else None)) is None
        or ExitReason(reason) not in declared.reasons
    ]
    assert wrong == []


def test_every_declared_cause_is_documented() -> None:
    docs = "\n".join(path.read_text() for path in (ROOT / "docs").glob("*.md"))
    assert [cause for cause in CAUSE_TABLE if f"`{cause}`" not in docs] == []
    assert "bus/causes.py" in (ROOT / "docs" / "architecture.md").read_text()


def test_a_stop_takes_its_reason_and_flags_from_the_table() -> None:
    loop = stop_signal("loop.cycle", run_id="r", source="s", detail="d")
    assert loop == StopSignal(
        run_id="r",
        reason=ExitReason.HOOK_STOPPED,
        cause="loop.cycle",
        source="s",
        detail="d",
        answerable=True,
        per_call=True,
    )
    hook = stop_signal("hook.lint", run_id="r", source="hooks")
    assert (hook.reason, hook.answerable, hook.per_call) == (ExitReason.HOOK_STOPPED, False, True)
    budget = stop_signal("budget.max_tool_calls", run_id="r", source="budget_monitor")
    assert (budget.reason, budget.answerable, budget.per_call) == (ExitReason.MAX_TURNS, True, True)
    turns = stop_signal("budget.max_turns", run_id="r", source="budget_monitor")
    assert (turns.answerable, turns.per_call) == (True, False)
    abort = stop_signal("abort.caller", run_id="r", source="api", reason=ExitReason.ABORTED_TOOLS)
    assert abort.reason is ExitReason.ABORTED_TOOLS
    assert reason_of("abort.crash") is ExitReason.ABORTED_STREAMING


@pytest.mark.parametrize(
    ("cause", "reason"),
    [("made.up", None), ("hook.", None), ("loop.cycle", ExitReason.COMPLETED)],
)
def test_an_undeclared_cause_or_reason_is_refused(cause: str, reason: ExitReason | None) -> None:
    assert not is_known_cause(cause) or reason is not None
    with pytest.raises(ValueError, match=r"bus/causes\.py"):
        stop_signal(cause, run_id="r", source="s", reason=reason)


def test_the_flags_are_those_the_stop_sites_set_before_the_table() -> None:
    """Pinned from the publishers before #31: budgets and loops are answerable; a loop, a
    hook and the tool-call budget are decided per call; nothing else is either."""
    for name, cause in CAUSE_TABLE.items():
        family = name.split(".")[0]
        assert cause.answerable is (family in ("budget", "loop")), name
        assert cause.per_call is (family == "loop" or name == "budget.max_tool_calls"), name
    assert HOOK.per_call
    assert not HOOK.answerable


# ------------------------------------------------- no meaning read from text or type names

MESSAGE_NAMES = {kind.__name__ for kind in MESSAGE_TYPES}
STR_METHODS = {"startswith", "endswith", "split", "rsplit", "partition", "rpartition", "find"}
STR_METHODS |= {"rfind", "index", "removeprefix", "removesuffix", "count", "splitlines"}
# ``.detail`` that is not a message's text: an image part's detail level (a Literal).
NOT_A_TEXT = {"image_url.detail"}


def _is_detail(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "detail"
        and ast.unparse(node) not in NOT_A_TEXT
    )


def detail_parses(tree: ast.Module) -> Iterator[int]:
    """Lines that read meaning from a ``detail`` text: a comparison with it, a string
    method on it, a regular expression run on it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            _is_detail(side) for side in (node.left, *node.comparators)
        ):
            yield node.lineno
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in STR_METHODS and _is_detail(node.func.value):
                yield node.lineno
            if node.func.attr in {"match", "search", "fullmatch", "findall", "finditer"} and any(
                _is_detail(arg) for arg in node.args
            ):
                yield node.lineno


def test_no_product_code_parses_a_detail_text() -> None:
    """A detail is for people: the recorder folds a turn's progress by its ``turn`` field,
    recovery and metrics read the cause table, nobody parses ``Progress.detail`` (or a
    stop's)."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path, tree in product_files()
        for line in detail_parses(tree)
    ]
    assert found == []


def test_the_guard_finds_a_detail_parse() -> None:
    parsed = ast.parse('if p.detail.startswith("turn 3"): pass\nok = p.detail == f"turn {n}"')
    assert list(detail_parses(parsed)) == [1, 2]
    assert list(detail_parses(ast.parse('image_url.detail != "auto"'))) == []


def message_names(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in MESSAGE_NAMES:
            yield node.lineno, node.value


def test_no_abort_reason_is_picked_by_a_message_type_name() -> None:
    """Whether an abort (a crash's too) is ``aborted_streaming`` or ``aborted_tools`` is
    the cause table's (bus.abort_reason_after, on typed messages): a module outside it that
    names ``aborted_tools`` names no message type as a string."""
    found = []
    for path, tree in product_files():
        where = str(path.relative_to(ROOT))
        if where == "bus/causes.py" or "ABORTED_TOOLS" not in ast.unparse(tree):
            continue
        found += [f"{where}:{line}: {name!r}" for line, name in message_names(tree)]
    assert found == []
    assert list(message_names(ast.parse('TOOLS = {"ToolResult", "TurnEnded"}'))) != []


def test_a_crash_s_reason_follows_the_newest_step_of_a_turn() -> None:
    by_kind = {type(msg).__name__: msg for msg in examples()}

    def tail(*kinds: str) -> list[StoredEvent]:
        return [StoredEvent(n, k, ENCODER.encode(by_kind[k])) for n, k in enumerate(kinds, 1)]

    tools, streaming = ExitReason.ABORTED_TOOLS, ExitReason.ABORTED_STREAMING
    assert phase_of(tail("RunStarted", "TurnStarted", "ModelRequest")) is streaming
    assert phase_of(tail("TurnStarted", "ModelReplied", "ToolExecute", "Progress")) is tools
    assert phase_of(tail("ToolResult", "TurnEnded", "TurnStarted", "Nudge")) is streaming
    assert phase_of(tail("Progress", "Notice")) is streaming
    assert phase_of([]) is streaming
    # the type column is not read: an event's own data says what it is
    assert (
        phase_of([StoredEvent(1, "ModelRequest", ENCODER.encode(by_kind["ToolResult"]))]) is tools
    )
    assert phase_of([*tail("ToolResult"), StoredEvent(2, "Gone", b'{"type": "Gone"}')]) is tools
