"""make_figure's sandbox: the static check (an early error), the driver's own restrictions
(defence in depth), the result channel, failing closed without bubblewrap, the config key
and the start-up warning. The OS boundary itself: tests/test_figure_sandbox_escapes.py."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from actors.tools import ToolContext, ToolRegistry, default_registry
from actors.tools.errors import ToolError
from actors.tools.figure import (
    MakeFigure,
    figure_tool,
    make_figure,
    warn_about_figure_sandbox,
)
from actors.tools.registry import Tool
from actors.tools.sandbox import (
    SandboxRefused,
    SandboxUnavailable,
    check_code,
    run_process_layer,
    sandbox_warning,
)
from actors.tools.sandbox.outputs import HEADER, OutputsUnreadable, read_outputs
from actors.tools.sandbox.seccomp import no_new_processes
from bench.scripted_model import ScriptedModel
from bus import ModelReply, ModelRequest, ToolCall
from orchestrator.config import Config, ToolSettings, load_config
from orchestrator.daemon import open_daemon
from orchestrator.errors import ConfigError
from orchestrator.pipeline import AgentStage, Probes
from orchestrator.report import ReportOptions, report_pipeline
from orchestrator.runtime import RunSpec, Runtime
from tests.daemon_support import daemon_config
from tests.sandbox_support import HAS_MATPLOTLIB, bubblewrap_or_skip


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
        ("x = (", "syntax error at line 1"),
    ],
)
def test_the_static_check_refuses_naming_what(code: str, refused: str) -> None:
    with pytest.raises(SandboxRefused, match=refused):
        check_code(code)


def test_plotting_code_passes_the_static_check() -> None:
    imported = check_code(
        "import matplotlib.pyplot as plt\nimport csv\n"
        "rows = list(csv.reader(read_text('a.csv').splitlines()))\n"
        "plt.plot([float(r[0]) for r in rows])\nsavefig('a.png')\n"
    )
    assert imported == ("csv", "matplotlib.pyplot")


def test_the_static_check_is_no_boundary() -> None:
    # The escapes the sandbox has to stop pass the check: it only gives early errors.
    assert check_code("import statistics\nstatistics.sys.modules['os'].system('id')") == (
        "statistics",
    )
    assert check_code("import json\njson.decoder.re.enum.sys.modules['os']") == ("json",)


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "a.csv").write_text("1,2\n3,4\n")
    (tmp_path / "secret.txt").write_text("secret")
    return data, out


@pytest.fixture(scope="module")
def bwrap() -> str:
    return bubblewrap_or_skip()


def test_sandboxed_code_reads_the_data_and_passes_back_its_files(folders, bwrap) -> None:
    data, out = folders
    result = run_process_layer("write_text('copy.txt', read_text('a.csv'))", data, out)
    assert (result.ok, result.outputs) == (True, ("copy.txt",))
    assert (out / "copy.txt").read_text() == "1,2\n3,4\n"
    assert sorted(p.name for p in data.iterdir()) == ["a.csv"]


# The driver's restricted builtins and import hook, with no static check before them:
# defence in depth (the escapes test shows code getting around them).
@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("read_text('../secret.txt')", "outside the allowed folder"),
        ("write_text('../../escape.txt', 'x')", None),  # basename only: stays in out/
        ("write_text('no good.txt', 'x')", "a file name of letters"),
        ("open('/etc/hostname')", "NameError"),
        ("getattr(__builtins__, 'op' + 'en')", "NameError"),
        ("import importlib", "import of 'importlib' is refused"),
        ("__import__('o' + 's')", "import of 'os' is refused"),
        ("eval('1 + 1')", "NameError"),
    ],
)
def test_the_drivers_restrictions(folders, bwrap, code: str, error: str | None) -> None:
    data, out = folders
    result = run_process_layer(code, data, out)
    if error is None:
        assert (result.ok, result.outputs) == (True, ("escape.txt",))
        assert not (data.parent.parent / "escape.txt").exists()
    else:
        assert not result.ok
        assert error in result.error


def test_a_missing_bubblewrap_refuses_saying_what_to_do(folders) -> None:
    data, out = folders
    missing = str(data.parent / "no-such-bwrap")
    with pytest.raises(SandboxUnavailable) as refused:
        run_process_layer("write_text('a.txt', 1)", data, out, bwrap=missing)
    message = str(refused.value)
    assert message.startswith(f"{missing} was not found or is not executable")
    assert "install bubblewrap" in message
    assert 'tools.figure_sandbox = "unsafe-process"' in message
    assert not out.exists()


def test_a_bubblewrap_that_cannot_make_namespaces_refuses(folders) -> None:
    data, out = folders
    fake = data.parent / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable, match="could not start a sandbox here") as refused:
        run_process_layer("write_text('a.txt', 1)", data, out, bwrap=str(fake))
    assert "No permissions to create new namespace" in str(refused.value)
    assert not out.exists()


def test_the_unsafe_mode_runs_without_bubblewrap(folders) -> None:
    data, out = folders
    missing = str(data.parent / "no-such-bwrap")
    code = "write_text('a.txt', read_text('a.csv'))"
    result = run_process_layer(code, data, out, sandbox="unsafe-process", bwrap=missing)
    assert (result.ok, result.outputs) == (True, ("a.txt",))


@pytest.mark.parametrize(
    ("channel", "problem"),
    [
        (b"", "no header"),
        (b"junk" + HEADER + b"end\n", "no header"),
        (HEADER + b"../x 1\nx" + b"end\n", "malformed entry"),
        (HEADER + b".hidden 1\nx" + b"end\n", "malformed entry"),
        (HEADER + b"a/b 1\nx" + b"end\n", "malformed entry"),
        (HEADER + b"a.png 10\nx" + b"end\n", "cut short"),
        (HEADER + b"a.png 1\nx" + b"a.png 1\ny" + b"end\n", "twice"),
        (HEADER + b"a.png 1\nx" + b"end\nmore", "after the end marker"),
        (HEADER + b"a.png 1\nx", "malformed entry"),
        (HEADER + b"a.png 999\n" + b"x" * 999 + b"end\n", "more than 1000 bytes"),
        (HEADER + b"".join(b"f%d 0\n" % n for n in range(33)) + b"end\n", "more than 32 files"),
    ],
)
def test_the_result_channel_is_untrusted(channel: bytes, problem: str) -> None:
    with pytest.raises(OutputsUnreadable, match=problem):
        read_outputs(io.BytesIO(channel), 1000)


def test_the_result_channel_as_the_driver_writes_it() -> None:
    channel = HEADER + b"a.png 3\nPNG" + b"b.txt 0\n" + b"end\n"
    assert read_outputs(io.BytesIO(channel), 100) == {"a.png": b"PNG", "b.txt": b""}
    most = HEADER + b"".join(b"f%d 0\n" % n for n in range(32)) + b"end\n"
    assert len(read_outputs(io.BytesIO(most), 1000)) == 32  # MAX_FILES


def test_the_seccomp_filter_exists_for_the_usual_machines() -> None:
    for machine in ("x86_64", "amd64", "aarch64", "arm64"):
        program = no_new_processes(machine)
        assert program is not None
        assert len(program) % 8 == 0  # struct sock_filter: 8 bytes each
    assert no_new_processes("sparc") is None


def test_make_figure_is_offered_only_with_matplotlib() -> None:
    assert (figure_tool() is not None) is HAS_MATPLOTLIB
    assert ("make_figure" in default_registry().names()) is HAS_MATPLOTLIB
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


@pytest.mark.asyncio
async def test_make_figure_says_when_nothing_was_saved(folders, bwrap) -> None:
    data, _ = folders
    answer = await make_figure(MakeFigure(code="x = 1"), ToolContext(run_id="r1", root=data))
    assert answer == "The code ran but saved no figure; call savefig('name.png')."


@pytest.mark.asyncio
async def test_make_figure_without_bubblewrap_is_a_tool_error(folders, monkeypatch) -> None:
    data, _ = folders
    monkeypatch.setenv("PATH", str(data))  # no bwrap on it
    with pytest.raises(ToolError) as refused:
        await make_figure(MakeFigure(code="x = 1"), ToolContext(run_id="r1", root=data))
    assert refused.value.kind == "unavailable"
    assert refused.value.message.startswith("bubblewrap (bwrap) is not installed")
    assert "install bubblewrap" in refused.value.message


def _calls_make_figure(code: str) -> Any:
    def script(request: ModelRequest) -> ModelReply:
        if request.turn == 1:
            arguments = MakeFigure(code=code)
            call = ToolCall(id="call_1", name="make_figure", arguments=_json(arguments))
            return ModelReply(
                run_id=request.run_id,
                turn=1,
                text="",
                tool_calls=(call,),
                finish_reason="tool_calls",
            )
        return ModelReply(run_id=request.run_id, turn=request.turn, text="done")

    return script


def _json(arguments: MakeFigure) -> str:
    return msgspec.json.encode(arguments).decode()


async def _figure_answer(config: Config, folder: Path) -> str:
    tools = ToolRegistry([Tool("make_figure", "plot", MakeFigure, make_figure)])
    code = "write_text('a.txt', read_text('a.csv'))"
    runtime = Runtime(
        config, tools=tools, model_actor=lambda bus: ScriptedModel(bus, _calls_make_figure(code))
    )
    async with runtime:
        with anyio.fail_after(60):
            result = await runtime.run(
                RunSpec(task="t", folder=str(folder), overrides={"tools": ["make_figure"]})
            )
    return next(m.content or "" for m in result.transcript if m.role == "tool")


@pytest.mark.asyncio
async def test_the_config_key_reaches_make_figure(folders, monkeypatch) -> None:
    data, _ = folders
    monkeypatch.setenv("PATH", str(data))  # no bwrap: refused unless the operator opts out
    refused = await _figure_answer(Config(), data)
    assert "bubblewrap (bwrap) is not installed" in refused
    unsafe = Config(tools=ToolSettings(figure_sandbox="unsafe-process"))
    answer = await _figure_answer(unsafe, data)
    assert answer.startswith("Saved: ")
    assert answer.endswith("/a.txt")
    # the run's figures are removed when it finishes (tests/test_figure_outputs_removed.py)
    assert not await anyio.Path(answer.removeprefix("Saved: ")).exists()


def test_a_bad_sandbox_setting_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "loopfuse.toml"
    path.write_text('[tools]\nfigure_sandbox = "container"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(path, environ={})
    assert refused.value.key == "tools.figure_sandbox"
    assert refused.value.reason == (
        "Invalid enum value 'container' (one of: 'bubblewrap', 'unsafe-process')"
    )


def test_the_start_up_warning_says_what_the_setting_means(monkeypatch, tmp_path) -> None:
    assert "without an OS sandbox" in (sandbox_warning("unsafe-process") or "")
    monkeypatch.setenv("PATH", str(tmp_path))
    missing = sandbox_warning("bubblewrap") or ""
    assert missing.startswith("make_figure will refuse every call: bubblewrap (bwrap) is not")


@pytest.mark.asyncio
async def test_no_warning_when_make_figure_is_not_offered(caplog) -> None:
    caplog.set_level(logging.WARNING)
    logger = logging.getLogger("loopfuse.test")
    assert await warn_about_figure_sandbox(logger, ["read_file"], "unsafe-process") is None
    assert caplog.records == []


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="make_figure is offered only with matplotlib")
@pytest.mark.asyncio
async def test_the_daemon_warns_at_start_when_figures_run_unsandboxed(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="loopfuse")
    config = daemon_config(tmp_path)
    config = Config(daemon=config.daemon, tools=ToolSettings(figure_sandbox="unsafe-process"))
    async with open_daemon(config):
        pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("make_figure runs model-written code" in w for w in warnings), warnings
