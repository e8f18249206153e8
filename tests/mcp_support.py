"""What the MCP tests share: the servers they start (two real ones from PyPI and the fault
server in tests/mcp_fault_server.py), a git repository to point the git server at, and a
run of a scripted model against a runtime that has those servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec

from actors.tools.mcp import McpServer
from orchestrator.config import Config, McpSettings, ToolSettings
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario, parse_scenario

FAULT_SERVER = Path(__file__).resolve().parent / "mcp_fault_server.py"
RUN_TIMEOUT = 60.0


def fault_server(**settings: Any) -> McpServer:
    """The fault server over stdio, restarted at once when it dies."""
    values: dict[str, Any] = {"restart_backoff_seconds": 0.0, **settings}
    return McpServer(name="faults", command=sys.executable, args=(str(FAULT_SERVER),), **values)


def time_server(**settings: Any) -> McpServer:
    """``mcp-server-time`` from PyPI, over stdio."""
    return McpServer(
        name="time", command=sys.executable, args=("-m", "mcp_server_time"), **settings
    )


def git_server(repository: Path, **settings: Any) -> McpServer:
    """``mcp-server-git`` from PyPI over stdio, confined to ``repository`` and started in it
    (so a call's ``repo_path = "."`` is that repository)."""
    return McpServer(
        name="git",
        command=sys.executable,
        args=("-m", "mcp_server_git", "--repository", "."),
        cwd=str(repository),
        **settings,
    )


def git(repository: Path, *args: str) -> str:
    """Run ``git`` in ``repository`` as a fixed test identity; its output."""
    identity = ("-c", "user.name=loopfuse tests", "-c", "user.email=tests@loopfuse.invalid")
    done = subprocess.run(
        ["git", *identity, *args], cwd=repository, check=True, capture_output=True, text=True
    )
    return done.stdout


def make_repository(root: Path) -> Path:
    """A git repository with one commit of ``notes.md`` and an unstaged change to it."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "--quiet", "--initial-branch=main")
    (root / "notes.md").write_text("# Growth\n\nOD600 every 30 minutes.\n", encoding="utf-8")
    git(root, "add", "notes.md")
    git(root, "commit", "--quiet", "-m", "Record the sampling interval")
    (root / "notes.md").write_text(
        "# Growth\n\nOD600 every 15 minutes from hour 4.\n", encoding="utf-8"
    )
    return root


def mcp_config(*servers: McpServer, tools: tuple[str, ...] = (), **tool_settings: Any) -> Config:
    """A config with ``servers`` under ``[mcp]`` and ``tools`` as every run's tools."""
    return Config(
        mcp=McpSettings(servers=servers),
        tools=msgspec.structs.replace(ToolSettings(), enabled=tools, **tool_settings),
    )


def scripted(text: str, name: str = "mcp_script") -> Scenario:
    """A scenario (a scripted model and its run) from TOML ``text``."""
    return parse_scenario(text, source=f"{name}.toml", name=name)


async def run_on(runtime: Runtime, scenario: Scenario) -> RunResult:
    """Run ``scenario`` on ``runtime`` to its end."""
    handle = await start_scenario(runtime, scenario)
    with anyio.fail_after(RUN_TIMEOUT):
        return await handle.result()


def tool_answers(result: RunResult) -> list[str]:
    """The tool results the model read, in order."""
    return [message.content or "" for message in result.transcript if message.role == "tool"]
