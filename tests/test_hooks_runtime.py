"""Hooks end to end: a runtime, the real openai client, the simulator, real hook processes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import anyio
import msgspec
import pytest

from actors.hooks import HookDecision, HookInput
from bus import ExitReason, StopSignal, ToolVerdict, nudge_text
from orchestrator.config import load_config, run_settings
from orchestrator.errors import ConfigError
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import expectation_mismatches, run_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}


def scenario(text: str, name: str) -> Scenario:
    return parse_scenario(text, source=f"{name}.toml", name=name)


@pytest.mark.asyncio
async def test_a_blocked_call_reaches_the_model_as_a_tool_error_and_it_adapts() -> None:
    chosen = SHIPPED["hook_blocks"]
    async with Runtime() as runtime:
        result = await run_scenario(runtime, chosen)
        events = runtime.event_log.events(result.run_id)
    assert expectation_mismatches(chosen, result) == []
    blocked, allowed = result.call_log
    assert (blocked.tool, blocked.verdict, allowed.verdict) == ("delete_file", "block", "allow")
    tool_texts = [m.content for m in result.transcript if m.role == "tool"]
    assert tool_texts[0] == (
        "Error: Blocked by hook 'protect_raw_data': raw/plate1.csv is inside the protected "
        "folder raw/: raw data must never be changed or deleted. Leave it alone and work on "
        "other files."
    )
    assert tool_texts[1] == "deleted"
    verdicts = [e for e in events if isinstance(e, ToolVerdict)]
    assert [(v.verdict, v.source) for v in verdicts] == [("block", "hook.protect_raw_data")]
    assert "protected" in result.output


@pytest.mark.asyncio
async def test_a_denied_call_stops_the_run_before_it_runs() -> None:
    chosen = SHIPPED["hook_denied"]
    async with Runtime() as runtime:
        result = await run_scenario(runtime, chosen)
        events = runtime.event_log.events(result.run_id)
    assert expectation_mismatches(chosen, result) == []
    assert (result.exit_reason, result.cause) == (ExitReason.HOOK_STOPPED, "hook.read_only")
    assert result.detail == (
        "The hook 'read_only' denied the call write_file (call_1_0): "
        "write_file is denied: this folder is read-only"
    )
    assert result.hint.startswith("The hook 'read_only' stopped the run")
    read, write = result.call_log
    assert (read.verdict, write.verdict) == ("allow", "not_run")
    stops = [e for e in events if isinstance(e, StopSignal)]
    assert [(s.cause, s.source) for s in stops] == [("hook.read_only", "hook_runner")]


STOP_HOOK = scenario(
    """
task = "Fix the failing test."
[config]
max_turns = 5
[[steps]]
text = "Done."
[[steps]]
text = "I ran the tests: all pass."
[expect]
exit_reason = "completed"
cause = "model.end_turn"
turns = 2
llm_requests = 2
nudges = 1
""",
    name="stop_hook",
)


@pytest.mark.asyncio
async def test_a_stop_hook_vetoes_the_first_final_answer_once(tmp_path: Path) -> None:
    seen = tmp_path / "seen.jsonl"
    hook_script = tmp_path / "ci.py"
    hook_script.write_text(
        textwrap.dedent(
            f"""
            import sys
            with open({str(seen)!r}, "a") as f:
                f.write(sys.stdin.read())
            print("Run the tests before you say you are done.", file=sys.stderr)
            sys.exit(2)
            """
        )
    )
    hooks = [
        {
            "name": "ci",
            "kind": "command",
            "event": "stop",
            "command": ["{python}", str(hook_script)],
        }
    ]
    async with Runtime(scenarios=[STOP_HOOK]) as runtime:
        result = await runtime.run(
            RunSpec(task=STOP_HOOK.task, overrides={"model": "stop_hook", "hooks": hooks})
        )
    assert expectation_mismatches(STOP_HOOK, result) == []
    (call,) = [json.loads(line) for line in seen.read_text().splitlines()]
    assert call == {
        "hook": "ci",
        "event": "stop",
        "run_id": result.run_id,
        "turn": 1,
        "text": "Done.",
    }
    veto = nudge_text("hook.ci", "Run the tests before you say you are done.")
    assert [m.content for m in result.transcript if m.role == "user"][-1] == veto
    assert result.transcript[-1].content == "I ran the tests: all pass."
    assert result.output == "I ran the tests: all pass."  # the vetoed "Done." is not kept


GUARDED = scenario(
    """
task = "Tidy the folder."
[config]
max_turns = 5
[[tools]]
name = "remove"
parameters = { path = "string" }
results = ["removed"]
[[steps]]
tool_calls = [
  { name = "remove", arguments = { path = "raw/a.csv" } },
  { name = "read_file", arguments = { path = "notes.txt" } },
]
[[steps]]
tool_calls = [{ name = "remove", arguments = { path = "tmp/b.txt" } }]
[[steps]]
text = "Removed tmp/b.txt only."
[folder]
"notes.txt" = "keep raw data"
[expect]
exit_reason = "completed"
turns = 3
tool_calls = 2
""",
    name="guarded",
)


@pytest.mark.asyncio
async def test_python_hooks_registered_on_the_runtime_with_a_tools_filter() -> None:
    seen: list[str] = []

    async def no_raw(call: HookInput) -> HookDecision | None:
        seen.append(f"{call.tool} {call.arguments}")
        if str(call.arguments.get("path", "")).startswith("raw/"):
            return HookDecision(action="block", message="raw/ is read-only")
        return None

    hooks = [{"name": "raw_guard", "kind": "python", "function": "no_raw", "tools": ["remove"]}]
    guarded = msgspec.structs.replace(GUARDED, config={**GUARDED.config, "hooks": hooks})
    async with Runtime(scenarios=[guarded]) as runtime:
        runtime.add_hook_function("no_raw", no_raw)
        result = await run_scenario(runtime, guarded)
    assert expectation_mismatches(GUARDED, result) == []
    # Only calls of "remove" reach the hook; read_file is not judged.
    assert seen == ["remove {'path': 'raw/a.csv'}", "remove {'path': 'tmp/b.txt'}"]
    assert [entry.verdict for entry in result.call_log] == ["block", "allow", "allow"]


@pytest.mark.asyncio
async def test_hook_config_errors_name_the_key() -> None:
    async with Runtime() as runtime:
        with pytest.raises(ConfigError) as missing:
            await runtime.start(
                RunSpec(
                    task="x",
                    overrides={"hooks": [{"name": "g", "kind": "python", "function": "f"}]},
                )
            )
        assert missing.value.key == "config.hooks.0.function"
        assert "no Python hook function registered as 'f'" in str(missing.value)
        with pytest.raises(ConfigError) as bad_kind:
            await runtime.start(
                RunSpec(task="x", overrides={"hooks": [{"name": "g", "kind": "sh"}]})
            )
        assert bad_kind.value.key == "config.hooks.0.kind"


def test_hooks_in_the_config_file_apply_to_every_run(tmp_path: Path) -> None:
    config_file = tmp_path / "loopfuse.toml"
    config_file.write_text(
        textwrap.dedent(
            """
            [[hooks]]
            name = "lint"
            kind = "command"
            command = ["ruff", "check", "."]
            on_error = "allow"
            """
        )
    )
    config = load_config(config_file, environ={})
    (hook,) = run_settings(config).hooks
    assert (hook.name, hook.on_error) == ("lint", "allow")
    assert run_settings(config, {"hooks": []}).hooks == ()  # a run's list replaces it


@pytest.mark.asyncio
async def test_a_run_with_hooks_and_runs_without_run_side_by_side() -> None:
    async with Runtime() as runtime:
        with anyio.fail_after(60):
            results = {}

            async def one(name: str) -> None:
                results[name] = await run_scenario(runtime, SHIPPED[name])

            async with anyio.create_task_group() as tg:
                for name in ("hook_denied", "completed", "hook_blocks", "path_escape"):
                    tg.start_soon(one, name)
        assert runtime.hook_runner.active_runs() == 0
    for name, result in results.items():
        assert expectation_mismatches(SHIPPED[name], result) == [], name


@pytest.mark.asyncio
async def test_command_hooks_do_not_get_loopfuses_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-hooks")
    monkeypatch.setenv("LOOPFUSE_API_TOKENS", "token-not-for-hooks")
    monkeypatch.setenv("LOOPFUSE_TEST_VISIBLE", "yes")
    seen = tmp_path / "env.json"
    dump = tmp_path / "dump_env.py"
    dump.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys
            sys.stdin.read()
            names = ("OPENAI_API_KEY", "LOOPFUSE_API_TOKENS", "LOOPFUSE_TEST_VISIBLE", "PATH")
            json.dump({{name: name in os.environ for name in names}}, open({str(seen)!r}, "w"))
            """
        )
    )
    hooks = [{"name": "env", "kind": "command", "command": ["{python}", str(dump)]}]
    completed = SHIPPED["completed"]
    with_hook = msgspec.structs.replace(completed, config={**completed.config, "hooks": hooks})
    async with Runtime() as runtime:
        result = await run_scenario(runtime, with_hook)
    assert result.exit_reason is ExitReason.COMPLETED
    assert json.loads(seen.read_text()) == {
        "OPENAI_API_KEY": False,
        "LOOPFUSE_API_TOKENS": False,
        "LOOPFUSE_TEST_VISIBLE": True,
        "PATH": True,
    }
