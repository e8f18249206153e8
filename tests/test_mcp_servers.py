"""Real third-party MCP servers from PyPI through real runs: ``mcp-server-git`` on a
repository the test makes (a commit, then an unstaged change) and ``mcp-server-time``.

A scripted model (the simulator) calls their tools; the tools are listed when the runtime
starts, offered with the servers' schemas, run by the tool executor, and their results
reach the model's transcript.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'loopfuse[mcp]'")
pytest.importorskip("mcp_server_git", reason="needs mcp-server-git (scripts/test installs it)")
pytest.importorskip("mcp_server_time", reason="needs mcp-server-time (scripts/test installs it)")

from bus import ExitReason, ModelRequest, RunStarted, ToolResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import load_scenario
from orchestrator.sim.loader import SCENARIO_DIR
from tests.mcp_support import (
    git,
    git_server,
    make_repository,
    mcp_config,
    run_on,
    scripted,
    time_server,
    tool_answers,
)

GIT_TOOLS = ("git__git_status", "git__git_diff_unstaged", "git__git_log")
MCP_GIT = SCENARIO_DIR / "mcp" / "mcp_git.toml"

GIT_SCRIPT = scripted(
    """
task = "What changed in the repository since the last commit?"
[config]
max_turns = 4
tools = ["git__git_status", "git__git_diff_unstaged"]
[[steps]]
tool_calls = [{ name = "git__git_status", arguments = { repo_path = "." } }]
[[steps]]
tool_calls = [{ name = "git__git_diff_unstaged", arguments = { repo_path = "." } }]
[[steps]]
text = "notes.md now samples every 15 minutes from hour 4."
[expect]
exit_reason = "completed"
turns = 3
tool_calls = 2
""",
    name="git_script",
)


@pytest.mark.asyncio
async def test_the_git_server_answers_a_run_about_a_real_repository(tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    config = mcp_config(git_server(repository), tools=GIT_TOOLS)
    async with Runtime(config, scenarios=[GIT_SCRIPT]) as runtime:
        assert runtime.mcp is not None
        offered = {tool.name for tool in runtime.mcp.tools}
        assert set(GIT_TOOLS) <= offered
        assert all(name.startswith("git__") for name in offered)
        assert runtime.mcp.refused == ()
        handle = await start_scenario(runtime, GIT_SCRIPT)
        events = [event async for event in handle.events()]
        result = await handle.result()
    assert expectation_mismatches(GIT_SCRIPT, result) == []
    status, diff = tool_answers(result)
    assert "modified:   notes.md" in status
    assert "-OD600 every 30 minutes." in diff
    assert "+OD600 every 15 minutes from hour 4." in diff
    results = [event for event in events if isinstance(event, ToolResult)]
    assert [(r.tool, r.is_error, r.executed) for r in results] == [
        ("git__git_status", False, True),
        ("git__git_diff_unstaged", False, True),
    ]
    # The model was offered the server's own schema for each tool, as listed.
    (request, *_) = [event for event in events if isinstance(event, ModelRequest)]
    specs = {spec.name: json.loads(spec.parameters) for spec in request.tools}
    assert set(specs) == {"git__git_status", "git__git_diff_unstaged"}
    assert specs["git__git_status"]["required"] == ["repo_path"]
    assert specs["git__git_diff_unstaged"]["properties"]["context_lines"]["type"] == "integer"
    (started,) = [event for event in events if isinstance(event, RunStarted)]
    assert started.tools == ("git__git_status", "git__git_diff_unstaged")


@pytest.mark.asyncio
async def test_the_git_server_refuses_a_path_outside_its_repository(tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    elsewhere = make_repository(tmp_path / "elsewhere")
    script = scripted(
        f"""
task = "Status of the other repository."
[config]
max_turns = 3
tools = ["git__git_status"]
[[steps]]
tool_calls = [{{ name = "git__git_status", arguments = {{ repo_path = "{elsewhere}" }} }}]
[[steps]]
text = "I may not read that repository."
[expect]
exit_reason = "completed"
""",
        name="git_elsewhere",
    )
    config = mcp_config(git_server(repository), tools=GIT_TOOLS)
    async with Runtime(config, scenarios=[script]) as runtime:
        result = await run_on(runtime, script)
    (entry,) = result.call_log
    assert (entry.is_error, entry.error_kind) == (True, "mcp_error")
    (answer,) = tool_answers(result)
    assert "outside the allowed repository" in answer
    assert result.exit_reason is ExitReason.COMPLETED


@pytest.mark.asyncio
async def test_the_shipped_mcp_git_scenario_runs_end_to_end(tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    git(repository, "add", "notes.md")
    git(repository, "commit", "--quiet", "-m", "Sample every 15 minutes")
    (repository / "notes.md").write_text("# Growth\n\nOD600 every 10 minutes.\n", "utf-8")
    scenario = load_scenario(MCP_GIT)
    config = mcp_config(git_server(repository), tools=GIT_TOOLS)
    async with Runtime(config, scenarios=[scenario]) as runtime:
        result = await run_on(runtime, scenario)
    assert expectation_mismatches(scenario, result) == []
    assert [entry.tool for entry in result.call_log] == [
        "git__git_status",
        "git__git_diff_unstaged",
        "git__git_log",
    ]
    status, diff, log = tool_answers(result)
    assert "modified:   notes.md" in status
    assert "+OD600 every 10 minutes." in diff
    assert "Sample every 15 minutes" in log
    assert "Record the sampling interval" in log


@pytest.mark.asyncio
async def test_the_time_server_tells_the_time_in_a_timezone() -> None:
    script = scripted(
        """
task = "What time is it in Tokyo?"
[config]
max_turns = 4
tools = ["time__get_current_time"]
[[steps]]
tool_calls = [{ name = "time__get_current_time", arguments = { timezone = "Asia/Tokyo" } }]
[[steps]]
tool_calls = [{ name = "time__get_current_time", arguments = { timezone = "Nowhere/Atlantis" } }]
[[steps]]
text = "It is evening in Tokyo."
[expect]
exit_reason = "completed"
tool_calls = 2
""",
        name="tokyo_time",
    )
    config = mcp_config(time_server(), tools=("time__get_current_time",))
    async with Runtime(config, scenarios=[script]) as runtime:
        result = await run_on(runtime, script)
    assert expectation_mismatches(script, result) == []
    tokyo, atlantis = tool_answers(result)
    answer = json.loads(tokyo)
    assert answer["timezone"] == "Asia/Tokyo"
    assert answer["datetime"].endswith("+09:00")
    assert "Invalid timezone" in atlantis
    ok, bad = result.call_log
    assert (ok.is_error, bad.is_error, bad.error_kind) == (False, True, "mcp_error")
    # Its annotations say read-only and idempotent, but its answer changes every second:
    # an MCP tool is cached only when the operator lists it in idempotent_tools.
    assert (ok.cache, bad.cache) == ("none", "none")


@pytest.mark.asyncio
async def test_an_operator_marked_idempotent_tool_is_answered_from_the_cache(
    tmp_path: Path,
) -> None:
    repository = make_repository(tmp_path / "repo")
    script = scripted(
        """
task = "Check the status twice."
[config]
max_turns = 4
tools = ["git__git_status"]
[[steps]]
tool_calls = [{ name = "git__git_status", arguments = { repo_path = "." } }]
[[steps]]
tool_calls = [{ name = "git__git_status", arguments = { repo_path = "." } }]
[[steps]]
text = "Unchanged."
[expect]
exit_reason = "completed"
""",
        name="status_twice",
    )
    server = git_server(repository, idempotent_tools=("git_status",), timeout_seconds=20.0)
    async with Runtime(mcp_config(server, tools=GIT_TOOLS), scenarios=[script]) as runtime:
        result = await run_on(runtime, script)
    assert [entry.cache for entry in result.call_log] == ["miss", "hit"]
    first, second = tool_answers(result)
    assert first == second
    assert "modified:   notes.md" in first
