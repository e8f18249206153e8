"""make_figure's sandbox: the static check, and the process layer on its own."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from actors.tools import ToolContext, default_registry
from actors.tools.errors import ToolError
from actors.tools.figure import MakeFigure, figure_tool, make_figure
from actors.tools.sandbox import (
    SandboxRefused,
    _unshare,
    check_code,
    network_isolation,
    run_process_layer,
    run_sandboxed,
)
from orchestrator.pipeline import AgentStage, Probes
from orchestrator.report import ReportOptions, report_pipeline


@pytest.mark.parametrize(
    ("code", "refused"),
    [
        ("import os", "import of 'os'"),
        ("import sys", "import of 'sys'"),
        ("from subprocess import run", "import of 'subprocess'"),
        ("import importlib\nimportlib.import_module('o' + 's')", "import of 'importlib'"),
        ("open('/etc/passwd')", "name 'open'"),
        ("eval('1')", "name 'eval'"),
        ("exec('x = 1')", "name 'exec'"),
        ("getattr(__builtins__, 'op' + 'en')", "name 'getattr'"),
        ("x = __builtins__", "name '__builtins__'"),
        ("().__class__.__base__.__subclasses__()", "attribute '__subclasses__'"),
        ("f = lambda: 0\nf.__globals__", "attribute '__globals__'"),
        ("import math as _m", "name '_m'"),
        ("from . import x", "relative imports"),
    ],
)
def test_the_static_check_refuses_naming_what(code: str, refused: str) -> None:
    with pytest.raises(SandboxRefused, match=refused):
        check_code(code)


def test_plotting_code_passes_the_static_check() -> None:
    check_code(
        "import matplotlib.pyplot as plt\nimport csv\n"
        "rows = list(csv.reader(read_text('a.csv').splitlines()))\n"
        "plt.plot([float(r[0]) for r in rows])\nsavefig('a.png')\n"
    )


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "a.csv").write_text("1,2\n3,4\n")
    (tmp_path / "secret.txt").write_text("secret")
    return data, out


def test_sandboxed_code_reads_the_data_and_writes_only_the_output(folders) -> None:
    data, out = folders
    result = run_sandboxed("write_text('copy.txt', read_text('a.csv'))", data, out)
    assert result.ok, result.error
    assert result.outputs == ("copy.txt",)
    assert (out / "copy.txt").read_text() == "1,2\n3,4\n"
    assert sorted(p.name for p in data.iterdir()) == ["a.csv"]


# Escapes the static check does not see (string-built names, helper arguments) and what the
# process layer does with them on its own.
@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("read_text('../secret.txt')", "outside the allowed folder"),
        ("write_text('../../escape.txt', 'x')", None),  # basename only: stays in out/
        ("open('/etc/hostname')", "NameError"),
        ("getattr(__builtins__, 'op' + 'en')", "NameError"),
        ("import importlib", "import of 'importlib' is refused"),
        ("__import__('o' + 's')", "import of 'os' is refused"),
        ("eval('1 + 1')", "NameError"),
    ],
)
def test_the_process_layer_alone_stops_what_got_past(folders, code: str, error: str | None):
    data, out = folders
    result = run_process_layer(code, data, out)
    if error is None:
        assert result.ok
        assert result.outputs == ("escape.txt",)
        assert not (data.parent.parent / "escape.txt").exists()
    else:
        assert not result.ok
        assert error in result.error


def test_time_and_memory_are_limited(folders) -> None:
    data, out = folders
    slow = run_process_layer("while True:\n    pass", data, out, timeout_seconds=1)
    assert not slow.ok
    assert "timed out after 1 s" in slow.error
    big = run_process_layer("x = bytearray(400 * 1024 * 1024)", data, out, memory_bytes=200 << 20)
    assert not big.ok
    assert "MemoryError" in big.error


@pytest.mark.skipif(not network_isolation(), reason="unshare -rn does not work here")
def test_the_process_has_no_network() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=False)
        inside = subprocess.run(
            [*_unshare(), sys.executable, "-c", probe], capture_output=True, check=False
        )
    assert outside.returncode == 0
    assert inside.returncode != 0
    assert b"Error" in inside.stderr


def test_make_figure_is_offered_only_with_matplotlib() -> None:
    installed = importlib.util.find_spec("matplotlib") is not None
    assert (figure_tool() is not None) is installed
    assert ("make_figure" in default_registry().names()) is installed
    for matplotlib in (False, True):
        config = report_pipeline(ReportOptions(goal="g", out="r"), Probes(matplotlib=matplotlib))
        explore = config.stages[1]
        assert isinstance(explore, AgentStage)
        assert ("make_figure" in explore.overrides["tools"]) is matplotlib


@pytest.mark.asyncio
async def test_make_figure_answers_a_refusal_as_a_tool_error_naming_it(folders) -> None:
    data, _ = folders
    ctx = ToolContext(run_id="r1", root=data)
    with pytest.raises(ToolError, match="refused by the sandbox: line 1: import of 'os'"):
        await make_figure(MakeFigure(code="import os"), ctx)
    answer = await make_figure(MakeFigure(code="x = 1"), ctx)
    assert answer == "The code ran but saved no figure; call savefig('name.png')."
