"""The last piece of the report workflow next to read_image: figures that make_figure saved
in its temporary folder end up next to the report, and the report links them.

matplotlib is not needed: a stand-in ``make_figure`` answers as the real one does
(``Saved: PATH``), so the test runs wherever the suite runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from actors.tools import Tool, ToolContext, default_registry
from actors.tools.figure import MakeFigure
from bus import ExitReason
from orchestrator.pipeline import Probes
from orchestrator.report import SAMPLE_FOLDER, ReportOptions, simulated_models, start_report
from orchestrator.report.figures import figures_dir, place_figures
from orchestrator.runtime import Runtime
from orchestrator.sim import parse_scenario

PHOTO = (SAMPLE_FOLDER / "plate_photo.png").read_bytes()

FIGURES = parse_scenario(
    (Path(__file__).parents[1] / "orchestrator" / "scenarios" / "report.toml")
    .read_text()
    .replace(  # explore's second step plots instead of reading the notes
        '{ name = "read_file", arguments = { path = "notes.txt" } }',
        '{ name = "make_figure", arguments = { code = "plot" } }',
    ),
    source="figures.toml",
    name="figures",
)


def _stand_in(folder: Path) -> Tool[MakeFigure]:
    async def make_figure(params: MakeFigure, ctx: ToolContext) -> str:
        (folder / "growth.png").write_bytes(PHOTO)
        return f"Saved: {folder / 'growth.png'}"

    return Tool("make_figure", "stand-in", MakeFigure, make_figure)


@pytest.mark.asyncio
async def test_figures_are_moved_next_to_the_report_and_linked(tmp_path: Path) -> None:
    temporary = tmp_path / "sandbox-out"
    temporary.mkdir()
    registry = default_registry()
    if "make_figure" not in registry:  # the real one when matplotlib is installed
        registry.add(_stand_in(temporary))
    else:
        pytest.skip("matplotlib is installed: the real make_figure is registered")
    folder = tmp_path / "folder"
    shutil.copytree(SAMPLE_FOLDER, folder)
    out = tmp_path / "out" / "report.md"
    options = ReportOptions(goal="g", out=str(out), models=simulated_models("figures"))
    async with Runtime(tools=registry, scenarios=(FIGURES,)) as runtime:
        with anyio.fail_after(30):
            handle = await start_report(runtime, folder, options, probes=Probes(matplotlib=True))
            result = await handle.result()
    assert result.exit_reason is ExitReason.COMPLETED
    copy = out.parent / "report.figures" / "growth.png"
    assert copy.read_bytes() == PHOTO
    report = out.read_text()
    assert report.endswith("\n## Figures\n\n![growth](report.figures/growth.png)\n")
    assert result.output == report
    summary = json.loads(out.with_name("report.summary.json").read_text())
    assert summary["figures"] == [str(copy)]


def test_a_path_the_report_mentions_is_pointed_at_the_copy(tmp_path: Path) -> None:
    made = tmp_path / "tmp" / "fit.png"
    made.parent.mkdir()
    made.write_bytes(PHOTO)
    gone = tmp_path / "tmp" / "gone.png"
    out = tmp_path / "r.md"
    report = f"# R\n\n## Results\n\n![fit]({made})\n"
    placed, copies = place_figures(report, (made, gone), out, "markdown")
    assert placed == "# R\n\n## Results\n\n![fit](r.figures/fit.png)\n"  # no extra section
    assert copies == (figures_dir(out) / "fit.png",)
    latex, _ = place_figures(f"\\includegraphics{{{made}}}", (made,), out, "latex")
    assert latex == "\\includegraphics{r.figures/fit.png}"
    assert place_figures("# R\n", (), out, "markdown") == ("# R\n", ())
