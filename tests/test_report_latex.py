"""LaTeX: the compile stage runs the probed xelatex (a stand-in script here)."""

from __future__ import annotations

import stat
from pathlib import Path

import anyio
import pytest

from bus import ExitReason, Progress
from orchestrator.pipeline import Probes, plan_of
from orchestrator.report import SAMPLE_FOLDER, ReportOptions, report_pipeline, start_report
from orchestrator.report.compile import compile_latex
from orchestrator.runtime import Runtime
from orchestrator.sim import parse_scenario

LATEX = (
    "\\\\documentclass{article}\\n\\\\begin{document}\\n"
    + "Growth. " * 40
    + "\\n\\\\end{document}\\n"
)
SCENARIO = parse_scenario(
    f"""
task = "A LaTeX report."
[pipeline]
name = "report"
[[steps]]
text = "unused"
[[tracks.explore]]
[[tracks.explore.tool_calls]]
name = "finish_exploration"
arguments = {{ experiment = "e", goal = "g", key_findings = ["k"] }}
[[tracks.draft]]
text = "{LATEX}"
[expect]
exit_reason = "completed"
""",
    source="latex_report.toml",
    name="latex_report",
)


def _fake_xelatex(tmp_path: Path, *, works: bool) -> str:
    script = tmp_path / "xelatex"
    body = (
        'for a in "$@"; do tex="$a"; done\ncp "$tex" "${tex%.tex}.pdf"\n'
        if works
        else 'echo "! LaTeX Error: oops"\nexit 1\n'
    )
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


async def _run(tmp_path: Path, xelatex: str) -> tuple[list[Progress], bool, ExitReason]:
    options = ReportOptions(
        goal="g",
        out=str(tmp_path / "out" / "report.tex"),
        format="latex",
        reflect_rounds=0,
        models={"explore": "latex_report/explore", "draft": "latex_report/draft"},
    )
    probes = Probes(xelatex=xelatex)
    assert plan_of(report_pipeline(options, probes))[-1] == "compile"
    async with Runtime(scenarios=[SCENARIO]) as runtime:
        with anyio.fail_after(20):
            handle = await start_report(runtime, SAMPLE_FOLDER, options, probes=probes)
            events = [e async for e in handle.events() if isinstance(e, Progress)]
            result = await handle.result()
    return events, result.degraded, result.exit_reason


@pytest.mark.asyncio
async def test_compile_writes_the_pdf_with_the_probed_xelatex(tmp_path: Path) -> None:
    events, degraded, reason = await _run(tmp_path, _fake_xelatex(tmp_path, works=True))
    assert reason is ExitReason.COMPLETED
    assert not degraded
    assert (events[-1].stage, events[-1].index, events[-1].total) == ("compile", 5, 5)
    assert (tmp_path / "out" / "report.pdf").exists()


@pytest.mark.asyncio
async def test_a_failed_compile_keeps_the_tex_and_degrades(tmp_path: Path) -> None:
    events, degraded, reason = await _run(tmp_path, _fake_xelatex(tmp_path, works=False))
    assert reason is ExitReason.COMPLETED
    assert degraded
    assert "LaTeX Error: oops" in events[-1].detail
    assert (tmp_path / "out" / "report.tex").read_text().startswith("\\documentclass")


@pytest.mark.asyncio
async def test_compile_latex_reports_a_missing_pdf(tmp_path: Path) -> None:
    tex = tmp_path / "r.tex"
    tex.write_text("x")
    pdf, problem = await compile_latex(_fake_xelatex(tmp_path, works=False), tex)
    assert pdf is None
    assert problem is not None
    assert problem.startswith("xelatex exited 1")
