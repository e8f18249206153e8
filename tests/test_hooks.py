"""Hooks without a runtime: the command runner, Python hooks, outcomes, config checks, and
the hook runner actor on a real bus (answers arrive before the settle returns)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from contextlib import ExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import pytest

import actors.hooks
from actors.hooks import (
    CommandHook,
    CommandResult,
    Hook,
    HookDecision,
    HookInput,
    HookRunner,
    PythonHook,
    call_function,
    check_hooks,
    command_outcome,
    run_command,
)
from bus import (
    AbortRequested,
    Bus,
    ExitReason,
    Inbox,
    Message,
    ModelReplied,
    ModelReply,
    Nudge,
    StopSignal,
    ToolCall,
    ToolCallProposed,
    ToolVerdict,
    Usage,
)
from tests.harness import drain, serving
from tests.messages_examples import finished
from tests.started import run_started

PY = sys.executable


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    """A hook script run by this interpreter; returns its argv."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return [PY, str(path)]


def exits(tmp_path: Path, status: int, message: str = "", *, to: str = "stderr") -> list[str]:
    return script(
        tmp_path,
        f"exit_{status}_{to}",
        f"""
        import sys
        sys.stdin.read()
        print({message!r}, file=sys.{to})
        sys.exit({status})
        """,
    )


def test_public_api_is_pinned() -> None:
    assert actors.hooks.__all__ == [
        "ACTIONS",
        "EXIT_ALLOW",
        "EXIT_BLOCK",
        "EXIT_DENY",
        "MAX_OUTPUT_BYTES",
        "PYTHON_PLACEHOLDER",
        "Action",
        "CommandHook",
        "CommandResult",
        "FunctionResult",
        "Hook",
        "HookDecision",
        "HookEvent",
        "HookFunction",
        "HookInput",
        "HookOutcome",
        "HookRunner",
        "OnError",
        "PythonHook",
        "call_function",
        "check_hooks",
        "command_outcome",
        "function_outcome",
        "run_command",
    ]


# --------------------------------------------------------------------------- commands


@pytest.mark.asyncio
async def test_a_command_gets_stdin_and_its_output_is_captured(tmp_path: Path) -> None:
    argv = script(
        tmp_path,
        "echo",
        """
        import sys
        data = sys.stdin.read()
        sys.stdout.write("out:" + data)
        sys.stderr.write("err")
        sys.exit(2)
        """,
    )
    result = await run_command(argv, b"hello", time_limit=20)
    assert result == CommandResult(2, "out:hello", "err", None)


@pytest.mark.asyncio
async def test_python_placeholder_runs_this_interpreter(tmp_path: Path) -> None:
    result = await run_command(
        ["{python}", "-c", "import sys; print(sys.executable)"], b"", time_limit=20
    )
    assert result.returncode == 0
    assert result.stdout.strip() == sys.executable


@pytest.mark.asyncio
async def test_output_is_capped_and_a_chatty_command_does_not_block(tmp_path: Path) -> None:
    argv = script(
        tmp_path,
        "chatty",
        """
        import sys
        sys.stdout.write("x" * 1_000_000)
        sys.stderr.write("y" * 1_000_000)
        """,
    )
    result = await run_command(argv, b"", time_limit=20, max_output=100)
    assert result.returncode == 0
    assert result.stdout == "x" * 100 + "… [999900 more bytes]"
    assert result.stderr.startswith("y" * 100 + "…")


@pytest.mark.asyncio
async def test_a_command_that_times_out_is_killed_with_its_children(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    os.mkfifo(alive)  # the grandchild holds its write end for as long as it lives
    grandchild = f"import time; f = open({str(alive)!r}, 'w'); print('up', flush=True); " + (
        "time.sleep(60)"
    )
    argv = script(
        tmp_path,
        "sleepy",
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {grandchild!r}], stdout=subprocess.PIPE)
        child.stdout.readline()  # the grandchild is up and holds the pipe
        print(os.getpid(), flush=True)
        time.sleep(60)
        """,
    )
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            # Reading to the end returns once every writer is gone: the grandchild died.
            read_to_the_end = partial(anyio.to_thread.run_sync, alive.read_bytes)
            tg.start_soon(partial(read_to_the_end, abandon_on_cancel=True))
            result = await run_command(argv, b"", time_limit=2.0)
    assert result.returncode is None
    assert result.failure == "timed out after 2 s"
    with pytest.raises(ProcessLookupError):
        os.kill(int(result.stdout), 0)  # the hook itself: killed and reaped


@pytest.mark.asyncio
async def test_a_missing_program_is_a_failure_not_an_exception() -> None:
    result = await run_command(["/nonexistent/loopfuse-hook"], b"", time_limit=5)
    assert result.returncode is None
    assert result.failure is not None
    assert result.failure.startswith("cannot start '/nonexistent/loopfuse-hook'")


@pytest.mark.asyncio
async def test_a_command_that_ignores_its_input_still_counts(tmp_path: Path) -> None:
    argv = [PY, "-c", "import sys; sys.exit(3)"]
    result = await run_command(argv, b"x" * 1_000_000, time_limit=20)
    assert result.returncode == 3


HOOK = CommandHook(name="guard", command=("x",), on_error="deny")


@pytest.mark.parametrize(
    ("result", "action", "message", "failure"),
    [
        (CommandResult(0, "fine", ""), "allow", "fine", None),
        (CommandResult(2, "out", " because \n"), "block", "because", None),
        (CommandResult(2, "only stdout", ""), "block", "only stdout", None),
        (CommandResult(3, "", "no"), "deny", "no", None),
        (CommandResult(1, "", "Traceback"), "deny", "", "exited with status 1: Traceback"),
        (CommandResult(None, failure="timed out after 1 s"), "deny", "", "timed out after 1 s"),
    ],
)
def test_exit_statuses_map_to_actions_and_failures_to_on_error(
    result: CommandResult, action: str, message: str, failure: str | None
) -> None:
    outcome = command_outcome(HOOK, result)
    assert (outcome.action, outcome.message, outcome.failure) == (action, message, failure)


# --------------------------------------------------------------------------- Python hooks

PAYLOAD = HookInput(hook="h", event="pre_tool", run_id="r", turn=1, tool="t", arguments={})


@pytest.mark.asyncio
async def test_python_hooks_async_sync_and_none() -> None:
    async def coroutine(call: HookInput) -> HookDecision:
        return HookDecision(action="block", message=f"no {call.tool}")

    def plain(call: HookInput) -> HookDecision:
        return HookDecision(action="deny", message="never")

    def silent(call: HookInput) -> None:
        return None

    assert (await call_function(coroutine, PAYLOAD, time_limit=5)).decision == HookDecision(
        action="block", message="no t"
    )
    assert (await call_function(plain, PAYLOAD, time_limit=5)).decision == HookDecision(
        action="deny", message="never"
    )
    assert (await call_function(silent, PAYLOAD, time_limit=5)).decision == HookDecision()


@pytest.mark.asyncio
async def test_python_hook_faults_are_failures() -> None:
    async def raises(call: HookInput) -> None:
        raise ValueError("bad hook")

    async def hangs(call: HookInput) -> None:
        await anyio.sleep_forever()

    def answers_nonsense(call: HookInput) -> Any:
        return "allow"

    def bad_action(call: HookInput) -> HookDecision:
        return HookDecision(action="maybe")  # type: ignore[arg-type]

    failures = [
        (await call_function(f, PAYLOAD, time_limit=0.2)).failure
        for f in (raises, hangs, answers_nonsense, bad_action)
    ]
    assert failures == [
        "raised ValueError('bad hook')",
        "timed out after 0.2 s",
        "returned str, expected a HookDecision or None",
        "answered the unknown action 'maybe'",
    ]


# --------------------------------------------------------------------------- config


def test_config_checks_name_the_key() -> None:
    hooks: tuple[Hook, ...] = (
        CommandHook(name="a", command=("x",)),
        CommandHook(name="a", command=("",)),
        PythonHook(name="b", function="missing", event="stop", tools=("read_file",)),
    )
    assert check_hooks(hooks, {"present"}) == [
        ("1.name", "duplicate hook name 'a'"),
        ("1.command", "the program (first element) is empty"),
        ("2.tools", "only pre_tool hooks filter by tool"),
        ("2.function", "no Python hook function registered as 'missing'"),
    ]


def test_hooks_decode_as_a_tagged_list_with_defaults() -> None:
    decoded = msgspec.convert(
        [
            {"name": "lint", "kind": "command", "command": ["ruff", "check"]},
            {"name": "py", "kind": "python", "function": "f", "event": "stop"},
        ],
        tuple[Hook, ...],
    )
    assert decoded == (
        CommandHook(name="lint", command=("ruff", "check")),
        PythonHook(name="py", function="f", event="stop"),
    )
    assert decoded[0].timeout_seconds == 10.0
    assert decoded[0].on_error == "block"
    assert decoded[0].applies_to("pre_tool", "anything")
    assert not decoded[1].applies_to("pre_tool", "anything")


# --------------------------------------------------------------------------- the actor


@asynccontextmanager
async def hooked(
    hooks: Sequence[Hook], functions: dict[str, Any] | None = None, *, runs: Sequence[str] = ("r",)
) -> AsyncIterator[tuple[Bus, HookRunner, dict[str, Inbox]]]:
    """A bus with a hook runner, and ``runs`` started, each with its control inbox."""
    bus = Bus()
    runner = HookRunner(bus, hooks, functions)
    async with serving(bus, runner):
        with anyio.fail_after(30), ExitStack() as stack:
            inboxes = {run_id: stack.enter_context(bus.open_inbox(run_id)) for run_id in runs}
            for run_id in runs:
                await bus.publish(run_started(run_id=run_id, trace_id="t", task="x", model="m"))
            yield bus, runner, inboxes
            for run_id in runs:
                await bus.publish_settled(finished(run_id))


def propose(run_id: str, tool: str, arguments: str = "{}", n: int = 1) -> ToolCallProposed:
    call = ToolCall(id=f"{run_id}-{n}", name=tool, arguments=arguments)
    return ToolCallProposed(run_id=run_id, turn=n, call=call, fingerprint="f", index=0)


def answers_in(inbox: Inbox) -> list[Message]:
    """The answers in ``inbox`` (the replies the test itself published left out)."""
    return [msg for msg in drain(inbox) if not isinstance(msg, ModelReply)]


@pytest.mark.asyncio
async def test_stdin_is_the_proposed_call_as_json(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    argv = script(
        tmp_path,
        "record",
        f"""
        import sys
        open({str(seen)!r}, "w").write(sys.stdin.read())
        """,
    )
    hook = CommandHook(name="record", command=tuple(argv))
    async with hooked([hook]) as (bus, _, inboxes):
        await bus.publish_settled(propose("r", "write_file", '{"path": "a.txt", "n": 1}'))
        assert answers_in(inboxes["r"]) == []  # exit 0 allows: no answer at all
    assert seen.read_text().endswith("\n")
    assert json.loads(seen.read_text()) == {
        "hook": "record",
        "event": "pre_tool",
        "run_id": "r",
        "turn": 1,
        "tool": "write_file",
        "call_id": "r-1",
        "arguments": {"path": "a.txt", "n": 1},
    }


@pytest.mark.asyncio
async def test_block_deny_and_the_tools_filter(tmp_path: Path) -> None:
    blocker = CommandHook(
        name="no_delete", command=tuple(exits(tmp_path, 2, "raw data is protected"))
    )
    blocker = msgspec.structs.replace(blocker, tools=("delete_file",))
    denier = CommandHook(
        name="no_write", command=tuple(exits(tmp_path, 3, "read-only")), tools=("write_file",)
    )
    async with hooked([blocker, denier]) as (bus, runner, inboxes):
        await bus.publish_settled(propose("r", "read_file", n=1))
        assert answers_in(inboxes["r"]) == []  # no hook judges read_file
        await bus.publish_settled(propose("r", "delete_file", n=2))
        (verdict,) = answers_in(inboxes["r"])
        assert verdict == ToolVerdict(
            run_id="r",
            turn=2,
            call_id="r-2",
            verdict="block",
            source="hook.no_delete",
            message="Blocked by hook 'no_delete': raw data is protected",
            cause="hook.no_delete",  # a block names its cause (#30 item 12)
        )
        await bus.publish_settled(propose("r", "write_file", n=3))
        (stop,) = answers_in(inboxes["r"])
        assert isinstance(stop, StopSignal)
        assert (stop.reason, stop.cause) == (ExitReason.HOOK_STOPPED, "hook.no_write")
        assert stop.detail == "The hook 'no_write' denied the call write_file (r-3): read-only"
        await bus.publish_settled(propose("r", "write_file", n=4))
        assert answers_in(inboxes["r"]) == []  # a stopped run is not judged again
        assert runner.active_runs() == 1
    assert runner.active_runs() == 0  # dropped at RunFinished


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("on_error", "expected"),
    [("allow", None), ("block", "block"), ("deny", "hook.broken")],
)
@pytest.mark.parametrize("fault", ["timeout", "crash", "missing"])
async def test_a_failing_hook_follows_its_on_error_policy(
    tmp_path: Path, fault: str, on_error: str, expected: str | None
) -> None:
    command = {
        "timeout": (PY, "-c", "import time; time.sleep(60)"),
        "crash": (PY, "-c", "raise SystemExit('boom')"),
        "missing": ("/nonexistent/loopfuse-hook",),
    }[fault]
    hook = msgspec.convert(
        {
            "name": "broken",
            "kind": "command",
            "command": command,
            "timeout_seconds": 0.5 if fault == "timeout" else 20,
            "on_error": on_error,
        },
        CommandHook,
    )
    async with hooked([hook]) as (bus, _, inboxes):
        await bus.publish_settled(propose("r", "write_file"))
        answers = answers_in(inboxes["r"])
    why = {
        "timeout": "timed out after 0.5 s",
        "crash": "exited with status 1: boom",
        "missing": "cannot start '/nonexistent/loopfuse-hook'",
    }[fault]
    if expected is None:
        assert answers == []  # fail open: the call goes ahead
    elif expected == "block":
        (verdict,) = answers
        assert isinstance(verdict, ToolVerdict)
        assert verdict.verdict == "block"
        assert f"the hook 'broken' failed ({why}" in verdict.message
        assert "on_error policy is 'block'" in verdict.message
    else:
        (stop,) = answers
        assert isinstance(stop, StopSignal)
        assert stop.cause == expected
        assert why in stop.detail
        assert "on_error policy is 'deny'" in stop.detail


@pytest.mark.asyncio
async def test_python_hooks_by_name_see_decoded_arguments() -> None:
    seen: list[HookInput] = []

    async def guard(call: HookInput) -> HookDecision | None:
        seen.append(call)
        if call.arguments.get("path", "").startswith("raw/"):
            return HookDecision(action="block", message="raw data is read-only")
        return None

    hook = PythonHook(name="raw_guard", function="guard")
    async with hooked([hook], {"guard": guard}) as (bus, _, inboxes):
        await bus.publish_settled(propose("r", "delete_file", '{"path": "raw/a"}', n=1))
        await bus.publish_settled(propose("r", "delete_file", '{"path": "tmp/a"}', n=2))
        await bus.publish_settled(propose("r", "delete_file", "not json", n=3))
        answers = answers_in(inboxes["r"])
    assert [call.arguments for call in seen] == [{"path": "raw/a"}, {"path": "tmp/a"}, "not json"]
    first, last = answers  # the call to tmp/ was allowed
    assert isinstance(first, ToolVerdict)
    assert (first.call_id, first.message) == (
        "r-1",
        "Blocked by hook 'raw_guard': raw data is read-only",
    )
    # Undecodable arguments reach the hook as text; this hook then raised: blocked by policy.
    assert isinstance(last, ToolVerdict)
    assert last.call_id == "r-3"
    assert "the hook 'raw_guard' failed (raised AttributeError" in last.message


@pytest.mark.asyncio
async def test_stop_hooks_veto_once_with_a_continuing_nudge() -> None:
    calls: list[str | None] = []

    def picky(call: HookInput) -> HookDecision:
        calls.append(call.text)
        return HookDecision(action="block", message="Run the tests before you finish.")

    hook = PythonHook(name="ci", function="picky", event="stop")

    async def final_answer(bus: Bus, n: int, text: str) -> None:
        await bus.publish(ModelReply(run_id="r", turn=n, text=text))
        await bus.publish_settled(
            ModelReplied(
                run_id="r",
                turn=n,
                text_chars=len(text),
                tool_calls=0,
                finish_reason="stop",
                usage=Usage(),
                total_usage=Usage(),
            )
        )

    async with hooked([hook], {"picky": picky}) as (bus, _, inboxes):
        await final_answer(bus, 1, "Done.")
        (nudge,) = answers_in(inboxes["r"])
        assert nudge == Nudge(
            run_id="r",
            kind="hook.ci",
            text="Run the tests before you finish.",
            source="hook_runner",
            continues=True,
        )
        await final_answer(bus, 2, "Tests pass. Done.")
        assert answers_in(inboxes["r"]) == []  # the second final answer is accepted
    assert calls == ["Done."]


@pytest.mark.asyncio
async def test_a_stop_hook_can_deny_the_answer() -> None:
    def never(call: HookInput) -> HookDecision:
        return HookDecision(action="deny", message="answers need a reviewer")

    hook = PythonHook(name="review", function="never", event="stop")
    async with hooked([hook], {"never": never}) as (bus, _, inboxes):
        await bus.publish(ModelReply(run_id="r", turn=1, text="Done."))
        await bus.publish_settled(
            ModelReplied(
                run_id="r",
                turn=1,
                text_chars=5,
                tool_calls=0,
                finish_reason="stop",
                usage=Usage(),
                total_usage=Usage(),
            )
        )
        (stop,) = answers_in(inboxes["r"])
    assert isinstance(stop, StopSignal)
    assert stop.cause == "hook.review"
    assert stop.detail == "The hook 'review' denied the final answer: answers need a reviewer"


@pytest.mark.asyncio
async def test_one_runs_slow_hook_does_not_hold_up_another_run() -> None:
    release = anyio.Event()
    entered = anyio.Event()

    async def slow(call: HookInput) -> None:
        if call.run_id == "slow":
            entered.set()
            await release.wait()

    hook = PythonHook(name="slow", function="slow", timeout_seconds=30)
    done = anyio.Event()
    async with (
        hooked([hook], {"slow": slow}, runs=("slow", "fast")) as (bus, _, _inboxes),
        anyio.create_task_group() as tg,
    ):

        async def slow_run() -> None:
            await bus.publish_settled(propose("slow", "t"))
            done.set()

        tg.start_soon(slow_run)
        await entered.wait()
        await bus.publish_settled(propose("fast", "t"))  # returns while "slow" waits
        assert not done.is_set()
        release.set()
    assert done.is_set()


@pytest.mark.asyncio
async def test_an_abort_kills_the_running_hook_at_once(tmp_path: Path) -> None:
    pid_pipe = tmp_path / "pid"
    os.mkfifo(pid_pipe)
    argv = script(
        tmp_path,
        "stuck",
        f"""
        import os, time
        with open({str(pid_pipe)!r}, "w") as pipe:
            pipe.write(str(os.getpid()))
        time.sleep(60)
        """,
    )
    hook = CommandHook(name="stuck", command=tuple(argv), timeout_seconds=60)
    async with hooked([hook]) as (bus, runner, inboxes):
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.publish_settled, propose("r", "t"))
            # Reading the pipe waits until the hook process runs and writes its pid.
            pid = int(await anyio.to_thread.run_sync(pid_pipe.read_text))
            assert runner.running() == 1
            await bus.publish(AbortRequested(run_id="r", source="caller"))
        # the settle returned long before the hook's 60 s: it was cancelled
        answers = answers_in(inboxes["r"])
        assert [type(a) for a in answers] == [AbortRequested]
        assert runner.running() == 0
        await bus.publish_settled(propose("r", "t", n=2))  # an aborted run runs no hooks
        assert answers_in(inboxes["r"]) == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
