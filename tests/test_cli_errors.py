"""The command line's one error path (issue #30): every subcommand, against every kind of
start-up failure, as a real ``loopfuse`` process: no traceback on stderr, one line naming
what to change, and the documented exit status (docs/cli.md, "Exit status").

The table :data:`CASES` holds, for each failure kind and each subcommand, the command line
that meets that failure, or why the kind cannot reach that command (``NOT_REACHED``); a
test checks the table covers every subcommand the parser has, so a new command must be
placed in it.
"""

from __future__ import annotations

import argparse
import http.server
import socket
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import pytest

from orchestrator import cli
from tests.cli_support import free_port, loopfuse

KINDS = ("no_daemon", "bad_port", "bad_config", "missing_extra", "unreachable_endpoint")

BAD_CONFIG = "[model]\nmax_attempts = 0\n"  # out of range: config key model.max_attempts
MCP_SERVER = '[[mcp.servers]]\nname = "git"\ncommand = "python3"\nargs = ["-m", "mcp_server_git"]\n'
NO_OTEL = "opentelemetry.sdk,opentelemetry.exporter"
TRACED = {"LOOPFUSE_TRACING__ENABLED": "true"}


class Case(NamedTuple):
    argv: tuple[str, ...]
    status: int
    """The documented exit status."""
    env: Mapping[str, str] = MappingProxyType({})
    block: str = ""
    """Packages hidden from the process (a missing extra)."""
    config: str = ""
    """A config file's text (given as --config FILE)."""
    says: str = ""
    """What the one line on stderr names (status 2), or a text of stdout (other status)."""


NOT_REACHED = str


def _cases() -> dict[str, dict[str, Case | NOT_REACHED]]:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sample = str(Path(__file__).resolve().parent.parent / "orchestrator" / "report" / "sample")
    model = ("--base-url", f"{dead}/v1", "--model", "m")
    usual = {  # each subcommand's plain command line
        "demo": ("demo",),
        "run": ("run", "--scenario", "completed"),
        "sim": ("sim", "--port", "0"),
        "scenarios": ("scenarios",),
        "report": ("report", sample, "--goal", "g", "--out", "{tmp}/r.md", *model),
        "serve": ("serve", "--port", "0"),
        "runs": ("runs", "--url", dead),
        "watch": ("watch", "0123456789abcdef", "--url", dead),
    }
    no_network = "talks to no daemon (demo starts its own)"
    return {
        "no_daemon": {
            "runs": Case(("runs", "--url", dead), 2, says="`loopfuse serve`"),
            "watch": Case(usual["watch"], 2, says="`loopfuse serve`"),
            "demo": no_network,
            "run": no_network,
            "sim": no_network,
            "scenarios": no_network,
            "report": no_network,
            "serve": "is the daemon",
        },
        "bad_port": {
            "serve": Case(("serve", "--port", "99999"), 2, says="--port"),
            "sim": Case(("sim", "--port", "99999"), 2, says="--port"),
            **{
                command: Case(argv, 2, env={"LOOPFUSE_DAEMON__PORT": "99999"}, says="daemon.port")
                for command, argv in usual.items()
                if command not in ("serve", "sim")
            },
        },
        "bad_config": {
            command: Case(argv, 2, config=BAD_CONFIG, says="model.max_attempts")
            for command, argv in usual.items()
        },
        "missing_extra": {
            **{  # [[mcp.servers]] without the mcp extra: refused when the config is read
                command: Case(argv, 2, config=MCP_SERVER, block="mcp", says="loopfuse[mcp]")
                for command, argv in usual.items()
                if command not in ("demo", "run", "serve", "report")
            },
            # tracing on without the otel extra: refused when the runtime starts
            **{
                command: Case(usual[command], 2, env=TRACED, block=NO_OTEL, says="loopfuse[otel]")
                for command in ("demo", "run", "serve", "report")
            },
        },
        "unreachable_endpoint": {
            # the model's endpoint: the run starts, fails and says why (status 1)
            "run": Case(
                ("run", "--task", "x", *model),
                1,
                env={"LOOPFUSE_MODEL__MAX_ATTEMPTS": "1"},
                says="model.unavailable",
            ),
            "report": Case(
                usual["report"],
                1,
                env={"LOOPFUSE_MODEL__MAX_ATTEMPTS": "1"},
                says="model.unavailable",
            ),
            # the trace backend: the run ends as usual, one warning line at most
            "demo": Case(
                ("demo", "--json"),
                0,
                env={**TRACED, "OTEL_EXPORTER_OTLP_ENDPOINT": dead},
                says='"matches":true',
            ),
            # the daemon's URL: as no daemon
            "runs": Case(("runs", "--url", "ftp://127.0.0.1:1"), 2, says="--url"),
            "watch": Case(("watch", "0123456789abcdef", "--url", dead), 2, says="--url"),
            # the fleet's NATS
            "serve": Case(
                ("serve", "--port", "0", "--nats", f"nats://127.0.0.1:{free_port()}"),
                2,
                says="cluster.nats_url",
            ),
            "sim": "reaches no endpoint: it is one",
            "scenarios": "reaches no endpoint",
        },
    }


CASES = _cases()


def _params() -> Iterator[object]:
    for kind, by_command in CASES.items():
        for command, case in sorted(by_command.items()):
            if isinstance(case, Case):
                yield pytest.param(case, id=f"{kind}-{command}")


def test_every_subcommand_meets_every_failure_kind() -> None:
    parser = cli._parser()
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands = set(action.choices)
    assert set(CASES) == set(KINDS)
    for kind, by_command in CASES.items():
        assert set(by_command) == commands, kind
    tried = sum(isinstance(case, Case) for cases in CASES.values() for case in cases.values())
    assert tried >= 30


@pytest.mark.parametrize("case", list(_params()))
def test_a_failure_is_one_line_and_the_documented_status(case: Case, tmp_path: Path) -> None:
    argv = tuple(arg.replace("{tmp}", str(tmp_path)) for arg in case.argv)
    if case.config:
        config = tmp_path / "loopfuse.toml"
        config.write_text(case.config)
        argv = ("--config", str(config), *argv)
    done = loopfuse(*argv, env=case.env, block=case.block, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    assert "Exception Group" not in done.stderr, done.stderr
    assert done.returncode == case.status, done.stderr
    if case.status == 2:
        assert done.stderr.count("\n") == 1, done.stderr  # one line
        assert done.stderr.startswith("loopfuse"), done.stderr
        assert case.says in done.stderr
        assert done.stdout == ""
    else:
        assert "opentelemetry" not in done.stderr  # the SDK's retry records
        assert case.says in done.stdout


def test_a_busy_port_is_one_line_naming_the_option(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        for command in ("serve", "sim"):
            env = {"LOOPFUSE_DAEMON__STORE_PATH": str(tmp_path / "d.db")}
            done = loopfuse(command, "--port", port, env=env)
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
            assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
            assert "--port" in done.stderr


class _NotADaemon(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)  # an HTML page

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("command", [("runs",), ("watch", "0123456789abcdef")])
def test_a_url_where_no_daemon_answers_is_one_line(command: tuple[str, ...]) -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotADaemon) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            done = loopfuse(*command, "--url", url)
        finally:
            server.shutdown()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"no daemon at {url} (what answers there is not a loopfuse daemon)" in done.stderr
