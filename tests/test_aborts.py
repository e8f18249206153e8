"""Aborts end to end: the shipped abort scenarios, a model that is down for good, aborts
that repeat or come during a hook, and no task or per-run state outliving its run."""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path
from types import CodeType
from typing import Final, cast

import anyio
import anyio.to_thread
import msgspec
import pytest

from bus import (
    AbortRequested,
    ExitReason,
    Message,
    ModelError,
    ModelTextDelta,
    ToolCallProposed,
    ToolsCancel,
)
from orchestrator.errors import ScenarioError
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, run_scenario, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}
ROOT = Path(__file__).resolve().parent.parent
PACKAGES = tuple(str(ROOT / name) + os.sep for name in ("actors", "bus", "orchestrator"))
SIMULATOR = str(ROOT / "orchestrator" / "sim") + os.sep
ANYIO = os.sep + "anyio" + os.sep


def _task_code(task: asyncio.Task[object]) -> CodeType | None:
    """The code of the function a task runs (under anyio's wrapper coroutine)."""
    coro: object = task.get_coro()
    while coro is not None:
        code = getattr(coro, "cr_code", None)
        if code is None:
            return None
        if ANYIO not in code.co_filename:
            return cast(CodeType, code)
        coro = getattr(coro, "cr_await", None)
    return None


# The tool executor's worker pool keeps idle workers between runs (that is its purpose);
# a worker still busy with a run's calls shows in the executor's statistics instead.
POOLED: Final = "Workers._work"
WATCHER: Final = "Deadlines._watch"
"""An actor's deadline watcher: shared by every run's calls, it holds no run's state once
they end (each ends by forgetting its scope) and sleeps at most one time limit before it
ends (``actors/deadlines.py``; ``tests/test_deadlines.py``)."""


def _ours(task: asyncio.Task[object]) -> str | None:
    """The qualified name of the loopfuse function ``task`` runs, or None when it is not
    loopfuse's own (the simulator's tasks, the idle pool workers and the actors' deadline
    watchers left out)."""
    code = _task_code(task)
    if code is None:
        return None
    path = code.co_filename
    if not path.startswith(PACKAGES) or path.startswith(SIMULATOR):
        return None
    if code.co_qualname in (POOLED, WATCHER):
        return None
    return code.co_qualname


def loopfuse_tasks() -> list[str]:
    """The running tasks whose function is loopfuse's own, by name."""
    return sorted(name for task in asyncio.all_tasks() if (name := _ours(task)) is not None)


def our_tasks() -> set[asyncio.Task[object]]:
    return {task for task in asyncio.all_tasks() if _ours(task) is not None}


async def settle_tasks(baseline: set[asyncio.Task[object]]) -> None:
    """Wait until every loopfuse task started since ``baseline`` has ended, then check that
    the runtime's own tasks are those of the baseline (fails naming the difference).

    Waits on the tasks themselves: ``wait_all_tasks_blocked`` can poll for the whole
    timeout on a loaded machine while some unrelated task is always runnable."""
    try:
        with anyio.fail_after(30):  # generous: a loaded CI machine is slow to wind down
            while extra := our_tasks() - baseline:
                await asyncio.wait(extra)
    except TimeoutError:
        pytest.fail(f"tasks left behind: {sorted(_ours(t) or '' for t in our_tasks() - baseline)}")
    expected = sorted(name for task in baseline if (name := _ours(task)) is not None)
    assert loopfuse_tasks() == expected, "a runtime task ended with a run"


def scenario(text: str, name: str) -> Scenario:
    return parse_scenario(text, source=f"{name}.toml", name=name)


async def run_shipped(name: str) -> tuple[RunResult, list[Message]]:
    async with Runtime() as runtime:
        result = await run_scenario(runtime, SHIPPED[name])
        events = list(runtime.event_log.events(result.run_id))
    assert expectation_mismatches(SHIPPED[name], result) == []
    return result, events


@pytest.mark.asyncio
async def test_abort_streaming_keeps_the_text_received_so_far() -> None:
    result, events = await run_shipped("abort_streaming")
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_STREAMING, "abort.caller")
    assert result.detail.startswith("Aborted by the scenario: ")
    assert "characters of text had streamed" in result.detail
    streamed = "".join(e.text for e in events if isinstance(e, ModelTextDelta))
    assert len(streamed) >= 200
    assert 200 <= len(result.output) < 500 * 4  # cut well before the 2000-character answer
    assert result.output.startswith(streamed[:200])
    assert result.transcript[-1].role == "assistant"
    assert result.transcript[-1].content == result.output
    assert [type(e) for e in events].count(AbortRequested) == 1


@pytest.mark.asyncio
async def test_abort_tools_honours_the_grace_period_and_keeps_finished_results() -> None:
    result, events = await run_shipped("abort_tools")
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_TOOLS, "abort.caller")
    quick, medium, slow = result.call_log
    assert [(c.tool, c.verdict, c.is_error) for c in (quick, medium)] == [
        ("count_rows", "allow", False),
        ("check_units", "allow", False),
    ]
    assert (slow.tool, slow.verdict, slow.error_kind) == ("fit_growth_model", "not_run", "aborted")
    # It had started before the abort and was cancelled only when the grace period ended.
    assert slow.duration_seconds >= 1.0
    (cancel,) = [e for e in events if isinstance(e, ToolsCancel)]
    assert (cancel.grace_seconds, cancel.reason) == (1.0, "abort.caller")
    tool_texts = [m.content for m in result.transcript if m.role == "tool"]
    assert tool_texts[:2] == ["3 files, 1240 rows", "all columns in OD600"]
    assert tool_texts[2] is not None
    assert "cancelled after a grace of 1 s" in tool_texts[2]


@pytest.mark.asyncio
async def test_api_down_gives_up_after_the_configured_attempts() -> None:
    result, events = await run_shipped("api_down")
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_STREAMING, "model.unavailable")
    errors = [e for e in events if isinstance(e, ModelError)]
    assert [(e.attempt, e.final, e.status, e.kind) for e in errors] == [
        (1, False, 500, "server_error"),
        (2, False, 500, "server_error"),
        (3, False, 500, "server_error"),
        (4, True, 500, "server_error"),
    ]
    assert errors[0].retry_after == 0.01  # the server's retry-after-ms keeps the demo quick
    assert result.detail.startswith("server_error after 4 attempt(s): ")
    assert "gave up after 4 attempts" in result.detail
    assert result.llm_requests == 1


SLOW_STREAM = scenario(
    """
task = "Write a long essay."
[[steps]]
text_tokens = 400
chunk_size = 8
chunk_latency = 0.02
[expect]
exit_reason = "aborted_streaming"
""",
    name="slow_stream_aborts",
)


@pytest.mark.asyncio
async def test_an_abort_is_idempotent() -> None:
    async with Runtime(scenarios=[SLOW_STREAM]) as runtime:
        handle = await start_scenario(runtime, SLOW_STREAM)
        with anyio.fail_after(20):
            async for event in handle.events():
                if isinstance(event, ModelTextDelta):
                    async with anyio.create_task_group() as tg:
                        for n in range(3):
                            tg.start_soon(handle.abort, f"abort {n}")
                    await handle.abort("once more")
                    break
            result = await handle.result()
        await handle.abort("after the end")
        events = runtime.event_log.events(handle.run_id)
    aborts = [e for e in events if isinstance(e, AbortRequested)]
    assert [a.detail for a in aborts] == ["abort 0"]
    assert result.exit_reason is ExitReason.ABORTED_STREAMING
    assert result.detail == "abort 0"


@pytest.mark.asyncio
async def test_an_abort_while_a_hook_runs_ends_the_run_and_kills_the_hook(
    tmp_path: Path,
) -> None:
    pid_pipe = tmp_path / "pid"
    os.mkfifo(pid_pipe)
    stuck = tmp_path / "stuck.py"
    stuck.write_text(
        textwrap.dedent(
            f"""
            import os, time
            with open({str(pid_pipe)!r}, "w") as pipe:
                pipe.write(str(os.getpid()))
            time.sleep(60)
            """
        )
    )
    hooked = msgspec.structs.replace(
        SHIPPED["completed"],
        config={
            **SHIPPED["completed"].config,
            "hooks": [
                {
                    "name": "stuck",
                    "kind": "command",
                    "command": ["{python}", str(stuck)],
                    "timeout_seconds": 60,
                }
            ],
        },
    )
    async with Runtime() as runtime:
        handle = await start_scenario(runtime, hooked)
        with anyio.fail_after(20):
            pid = int(await anyio.to_thread.run_sync(pid_pipe.read_text))  # the hook runs
            await handle.abort("stop now")
            result = await handle.result()
        assert runtime.hook_runner.running() == 0
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_TOOLS, "abort.caller")
    assert [(c.tool, c.verdict) for c in result.call_log] == [("list_dir", "not_run")]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.asyncio
async def test_no_task_and_no_per_run_state_outlive_their_run() -> None:
    before = len(asyncio.all_tasks())
    names = ("abort_streaming", "abort_tools", "api_down", "hook_denied", "hook_blocks")
    async with Runtime() as runtime:
        baseline = our_tasks()
        for name in names:  # one at a time, so each run's leftovers would show
            result = await run_scenario(runtime, SHIPPED[name])
            assert expectation_mismatches(SHIPPED[name], result) == [], name
            await settle_tasks(baseline)
            assert runtime.hook_runner.active_runs() == 0, name
            assert runtime.bus.active_inboxes() == 0, name
            assert runtime.active_runs == 0, name
            assert runtime.tool_executor.statistics() == (0, 0, 0), name
            assert runtime.tool_executor.workers_busy() == 0, name
    assert len(asyncio.all_tasks()) == before


@pytest.mark.asyncio
async def test_a_hook_waiting_on_a_proposed_call_is_judged_before_the_call_runs() -> None:
    """The proposal checkpoint waits for the hook: the denied call never reaches the tools."""
    async with Runtime() as runtime:
        result = await run_scenario(runtime, SHIPPED["hook_denied"])
        events = runtime.event_log.events(result.run_id)
    proposed = [e.call.name for e in events if isinstance(e, ToolCallProposed)]
    assert proposed == ["read_file", "write_file"]
    assert result.tool_calls == 1  # only read_file ran


@pytest.mark.parametrize(
    ("abort", "message"),
    [
        ("{}", "abort: set exactly one of after_text_chars, after_tool_result"),
        (
            '{ after_text_chars = 5, after_tool_result = "x" }',
            "abort: set exactly one of after_text_chars, after_tool_result",
        ),
        ("{ after_text_chars = 0 }", "abort.after_text_chars: must be at least 1"),
        ('{ after_tool_result = "no such" }', "abort.after_tool_result: 'no such' is not a"),
        ("{ after_chars = 5 }", "abort.after_chars: unknown key"),
    ],
)
def test_bad_abort_triggers_name_the_key(abort: str, message: str) -> None:
    text = (
        f'task = "x"\nabort = {abort}\n[[steps]]\ntext = "y"\n[expect]\nexit_reason = "completed"\n'
    )
    with pytest.raises(ScenarioError, match="^x.toml: " + message.replace("(", r"\(")):
        scenario(text, "x")


def test_a_negative_tool_delay_is_refused() -> None:
    text = (
        'task = "x"\n[[tools]]\nname = "t"\ndelay_seconds = -1\n'
        '[[steps]]\ntext = "y"\n[expect]\nexit_reason = "completed"\n'
    )
    with pytest.raises(ScenarioError, match=r"tools\[0\]\.delay_seconds: must not be negative"):
        scenario(text, "x")
