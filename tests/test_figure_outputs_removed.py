"""make_figure's figures leave the host when the run that made them finishes: a plain
run's at its end, a report pipeline's once the report took its copies (its explore stage
is a run of its own, which ends before the report is finalized).

The real make_figure in the real sandbox (skipped without bubblewrap or matplotlib); the
host's temporary folder is the test's own, so what is left in it is this test's.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import anyio
import pytest

from bus import ExitReason
from orchestrator.pipeline import Probes
from orchestrator.report import SAMPLE_FOLDER, ReportOptions, simulated_models, start_report
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import parse_scenario
from tests.sandbox_support import HAS_MATPLOTLIB, bubblewrap_or_skip

pytestmark = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib (figures extra)")

PLOT = (
    '{ name = "make_figure", arguments = { code = "import matplotlib.pyplot as plt\\n'
    "plt.plot([1, 2, 3], [2, 4, 9])\\nsavefig('growth.png')\" } }"
)

PLAIN = parse_scenario(
    f"""
task = "Plot the data."
[config]
tools = ["make_figure"]
max_turns = 3
[folder]
"a.csv" = "1,2\\n"
[[steps]]
tool_calls = [{PLOT}]
[[steps]]
text = "Done."
[expect]
exit_reason = "completed"
""",
    source="plot.toml",
    name="plot",
)

REPORT = parse_scenario(
    (Path(__file__).parents[1] / "orchestrator" / "scenarios" / "report.toml")
    .read_text()
    .replace('{ name = "read_file", arguments = { path = "notes.txt" } }', PLOT),
    source="figures.toml",
    name="figures",
)


def figure_folders(host_tmp: Path) -> list[Path]:
    return sorted(host_tmp.glob("loopfuse-figures-*"))


@pytest.fixture
def host_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bubblewrap_or_skip()
    folder = tmp_path / "host-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.asyncio
async def test_a_runs_figures_are_removed_when_it_finishes(host_tmp: Path) -> None:
    async with Runtime(scenarios=(PLAIN,)) as runtime:
        handle = await start_scenario(runtime, PLAIN)
        with anyio.fail_after(60):
            result = await handle.result()
        assert result.exit_reason is ExitReason.COMPLETED
        (answer,) = [m.content for m in result.transcript if m.role == "tool"]
        assert answer is not None
        assert answer.startswith(f"Saved: {host_tmp}/loopfuse-figures-")
        assert answer.endswith("/growth.png")
        assert figure_folders(host_tmp) == []  # the runtime is still up: removed at the end


@pytest.mark.asyncio
async def test_a_reports_figures_outlive_its_explore_stage_and_no_longer(
    host_tmp: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "folder"
    shutil.copytree(SAMPLE_FOLDER, folder)
    out = tmp_path / "out" / "report.md"
    options = ReportOptions(goal="g", out=str(out), models=simulated_models("figures"))
    async with Runtime(scenarios=(REPORT,)) as runtime:
        with anyio.fail_after(120):
            handle = await start_report(runtime, folder, options, probes=Probes(matplotlib=True))
            result = await handle.result()
        assert result.exit_reason is ExitReason.COMPLETED
        copy = out.parent / "report.figures" / "growth.png"
        assert copy.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")  # copied after explore ended
        assert figure_folders(host_tmp) == []
