"""``[mcp]`` in the config: decoding, errors that name the key, start-up errors that name
the server and why, and loopfuse without the ``mcp`` extra (a clear error for ``[mcp]``,
nothing changed otherwise)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from actors.tools.mcp import McpServer
from orchestrator.config import Config, load_config
from orchestrator.errors import ConfigError
from orchestrator.runtime import Runtime
from tests.mcp_support import fault_server, mcp_config

ROOT = Path(__file__).resolve().parent.parent

GIT_AND_TIME = """
[tools]
enabled = ["list_dir", "git__git_status", "clock_get_current_time"]

[[mcp.servers]]
name = "git"
command = "python3"
args = ["-m", "mcp_server_git", "--repository", "."]
cwd = "/srv/repo"
env = { GIT_AUTHOR_NAME = "loopfuse" }
pass_env = ["GIT_TOKEN"]
tools = ["git_status", "git_diff_unstaged"]
idempotent_tools = ["git_status"]
timeout_seconds = 20

[[mcp.servers]]
name = "time"
transport = "http"
url = "http://127.0.0.1:8000/mcp"
headers_env = { Authorization = "TIME_AUTH" }
prefix = "clock_"
max_restarts = 0
"""


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "loopfuse.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ={})


def test_servers_decode_with_their_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, GIT_AND_TIME)
    git, time = config.mcp.servers
    assert (git.transport, git.command, git.cwd, git.tool_prefix) == (
        "stdio",
        "python3",
        "/srv/repo",
        "git__",
    )
    assert (git.tools, git.idempotent_tools, git.timeout_seconds) == (
        ("git_status", "git_diff_unstaged"),
        ("git_status",),
        20.0,
    )
    assert (git.start_timeout_seconds, git.max_restarts, git.restart_backoff_seconds) == (
        30.0,
        3,
        1.0,
    )
    assert (time.transport, time.url, time.tool_prefix, time.max_restarts) == (
        "http",
        "http://127.0.0.1:8000/mcp",
        "clock_",
        0,
    )
    assert time.headers_env == {"Authorization": "TIME_AUTH"}


@pytest.mark.parametrize(
    ("table", "key", "reason"),
    [
        ('name = "git"', "mcp.servers.0", "`command` is required for transport 'stdio'"),
        ('name = "git"\ncomand = "x"', "mcp.servers.0.comand", "unknown key"),
        ('name = "g.t"\ncommand = "x"', "mcp.servers.0.name", "matching regex"),
        ('name = "t"\ntransport = "http"', "mcp.servers.0", "`url` is required"),
        ('name = "t"\ntransport = "http"\nurl = "file:///x"', "mcp.servers.0.url", "regex"),
        ('name = "t"\ntransport = "ws"', "mcp.servers.0.transport", "one of: 'stdio', 'http'"),
        (
            'name = "t"\ncommand = "x"\nurl = "http://h/mcp"',
            "mcp.servers.0",
            "for transport 'http'",
        ),
        ('name = "t"\ncommand = "x"\nprefix = "t."', "mcp.servers.0.prefix", "regex"),
        ('name = "t"\ncommand = "x"\nmax_restarts = 101', "mcp.servers.0.max_restarts", "0 to 100"),
        ('name = "t"\ncommand = "x"\ntimeout_seconds = 0', "mcp.servers.0.timeout_seconds", ">"),
        ('name = "t"\ncommand = "x"\npass_env = ["A-B"]', "mcp.servers.0.pass_env.0", "regex"),
        (
            'name = "t"\ncommand = "x"\ntools = ["a"]\nidempotent_tools = ["b"]',
            "mcp.servers.0",
            "`idempotent_tools` names tools not in `tools`: ['b']",
        ),
    ],
)
def test_a_bad_server_names_the_key(tmp_path: Path, table: str, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"[[mcp.servers]]\n{table}\n")
    assert caught.value.key == key
    assert reason in caught.value.reason


def test_two_servers_may_not_share_a_name(tmp_path: Path) -> None:
    table = '[[mcp.servers]]\nname = "a"\ncommand = "x"\n'
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, table + table)
    assert caught.value.key == "mcp"
    assert "server names must be unique; used more than once: ['a']" in caught.value.reason


async def start(*servers: McpServer) -> None:
    with anyio.fail_after(60):
        async with Runtime(mcp_config(*servers)):
            pass


async def start_error(server: McpServer) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        await start(server)
    return caught.value


def exits_at_once(message: str) -> McpServer:
    code = f"import sys; sys.stderr.write({message!r}); sys.exit(2)"
    return McpServer(name="broken", command=sys.executable, args=("-c", code))


@pytest.mark.asyncio
async def test_a_command_that_cannot_run_is_a_config_error() -> None:
    error = await start_error(McpServer(name="ghost", command="/nonexistent/mcp-server"))
    assert error.key == "mcp.servers.0.command"
    assert error.reason == (
        "server 'ghost': cannot run '/nonexistent/mcp-server': No such file or directory"
    )


@pytest.mark.asyncio
async def test_a_missing_working_directory_is_named_not_the_command(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-repository")
    error = await start_error(McpServer(name="git", command=sys.executable, cwd=missing))
    assert error.key == "mcp.servers.0.cwd"
    assert error.reason == f"server 'git': no such directory {missing!r}"


@pytest.mark.asyncio
async def test_a_server_that_exits_at_start_is_named_with_its_stderr() -> None:
    pytest.importorskip("mcp")
    error = await start_error(exits_at_once("no repository configured\n"))
    assert error.key == "mcp.servers.0"
    assert error.reason == (
        "server 'broken': it went away during start-up: the server process closed its output "
        "or exited; its stderr ended with: no repository configured"
    )


@pytest.mark.asyncio
async def test_a_server_that_never_answers_times_out_at_start() -> None:
    pytest.importorskip("mcp")
    silent = McpServer(
        name="silent",
        command=sys.executable,
        args=("-c", "import time; time.sleep(600)"),
        start_timeout_seconds=0.5,
    )
    error = await start_error(silent)
    assert error.key == "mcp.servers.0.start_timeout_seconds"
    assert "server 'silent': no answer to the MCP handshake and tool listing within 0.5 s" in (
        error.reason
    )


@pytest.mark.asyncio
async def test_naming_a_tool_the_server_does_not_offer_fails_the_start() -> None:
    pytest.importorskip("mcp")
    missing = await start_error(fault_server(tools=("echo", "teleport")))
    assert missing.key == "mcp.servers.0.tools"
    assert "the server lists no tool 'teleport' (it lists: calls, crash, dotted.name" in (
        missing.reason
    )
    refused = await start_error(fault_server(tools=("echo", "recursive_schema")))
    assert refused.key == "mcp.servers.0.tools"
    assert "tool 'recursive_schema' cannot be offered: recursive schema reference" in (
        refused.reason
    )


@pytest.mark.asyncio
async def test_a_tool_name_taken_twice_is_a_config_error() -> None:
    pytest.importorskip("mcp")
    first = fault_server(prefix="lab_")
    second = McpServer(
        name="again", command=first.command, args=first.args, prefix="lab_", tools=("echo",)
    )
    with pytest.raises(ConfigError) as caught:
        await start(first, second)
    assert caught.value.key == "mcp.servers.1.prefix"
    assert "its tool 'lab_echo' has the name of a tool already registered" in caught.value.reason


@pytest.mark.asyncio
async def test_secrets_come_from_the_environment_or_the_start_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("mcp")
    monkeypatch.delenv("FAULTS_TOKEN", raising=False)
    monkeypatch.delenv("FAULTS_AUTH", raising=False)
    passed = await start_error(fault_server(pass_env=("FAULTS_TOKEN",)))
    assert (passed.key, passed.reason) == (
        "mcp.servers.0.pass_env",
        "server 'faults': environment variable(s) FAULTS_TOKEN not set",
    )
    http = McpServer(
        name="remote",
        transport="http",
        url="http://127.0.0.1:9/mcp",
        headers_env={"Authorization": "FAULTS_AUTH"},
    )
    header = await start_error(http)
    assert (header.key, header.reason) == (
        "mcp.servers.0.headers_env",
        "server 'remote': environment variable FAULTS_AUTH (header Authorization) not set",
    )


WITHOUT_THE_EXTRA = textwrap.dedent(
    """
    import sys
    sys.modules["mcp"] = None  # as if the mcp extra were not installed

    import anyio
    from orchestrator.config import McpSettings, Config, load_config
    from orchestrator.errors import ConfigError
    from orchestrator.runtime import Runtime
    from orchestrator.scenarios.runs import run_scenario
    from orchestrator.sim import find_scenario
    from actors.tools.mcp import McpServer

    try:
        load_config(sys.argv[1], environ={})
    except ConfigError as exc:
        print("load:", exc)

    async def main() -> None:
        server = McpServer(name="git", command="python3")
        try:
            async with Runtime(Config(mcp=McpSettings(servers=(server,)))):
                pass
        except ConfigError as exc:
            print("start:", exc)
        async with Runtime() as runtime:
            result = await run_scenario(runtime, find_scenario("completed"))
        print("run:", result.exit_reason.value, result.cause)

    anyio.run(main)
    loaded = sorted(name for name in sys.modules if name.startswith(("mcp", "actors.tools.mcp")))
    print("loaded:", " ".join(loaded))
    """
)


def test_without_the_extra_mcp_is_a_clear_error_and_nothing_else_changes(
    tmp_path: Path,
) -> None:
    config = tmp_path / "loopfuse.toml"
    config.write_text('[[mcp.servers]]\nname = "git"\ncommand = "python3"\n', "utf-8")
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_EXTRA, str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    hint = "MCP servers need the mcp extra: pip install 'loopfuse[mcp]'"
    assert done.stdout.splitlines() == [
        f"load: {config}: config key 'mcp.servers': {hint}",
        f"start: config key 'mcp.servers': {hint}",
        "run: completed model.end_turn",
        "loaded: actors.tools.mcp actors.tools.mcp.spec mcp",
    ]
