"""The report workflow: checks, scan, the three scenarios end to end, the CLI."""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from pathlib import Path

import anyio
import pytest

from bus import ExitReason, Progress
from orchestrator.cli import Follower, main
from orchestrator.config import Config
from orchestrator.pipeline import Probes
from orchestrator.report import (
    SAMPLE_FOLDER,
    ReportOptions,
    draft_problems,
    leaked_markup,
    scan_folder,
    simulated_models,
    start_report,
)
from orchestrator.report.checks import structure_problems
from orchestrator.report.command import run_report_command
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.sim import Scenario, parse_scenario

GOOD = "# Title\n\n## Method\n" + "Measured things. " * 10 + "\n\n## Results\nIt grew.\n"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("<｜DSML｜function_calls>\n<｜DSML｜invoke name='x'>", "DeepSeek DSML tag"),
        ("</|DSML|invoke>", "DeepSeek DSML tag"),
        ("<｜tool▁calls▁begin｜>", "DeepSeek tool-call token"),
        ('<tool_call>{"name": "read_file"}</tool_call>', "<tool_call> tag"),
        ('{"tool_calls": [{"id": "1"}]}', "tool_calls JSON"),
        ('{"name": "read_file", "arguments": {"path": "a"}}', "function-call JSON"),
    ],
)
def test_leaked_tool_markup_is_named(text: str, kind: str) -> None:
    assert leaked_markup(GOOD + text) == kind


def test_a_clean_report_passes_and_structure_is_checked_per_format() -> None:
    assert leaked_markup(GOOD) is None
    assert draft_problems(GOOD, "markdown") == []
    assert "no '# ' title" in structure_problems(GOOD.replace("# Title", "Title"), "markdown")
    latex = "\\documentclass{article}\n\\begin{document}\n" + "text " * 50 + "\n\\end{document}\n"
    assert structure_problems(latex, "latex") == []
    assert "no \\end{document}" in structure_problems(latex.replace("\\end{document}", ""), "latex")
    assert structure_problems("Sure!\n" + latex, "latex") == ["text before \\documentclass"]


def test_scan_buckets_the_sample_and_summarises_it() -> None:
    scan = scan_folder(SAMPLE_FOLDER)
    buckets = {f.path: f.bucket for f in scan.files}
    assert buckets == {
        "measurements.csv": "data",
        "notes.txt": "documents",
        "parameters.toml": "data",
        "plate_photo.png": "images",
    }
    assert scan.summary().startswith("4 files: 1 documents (")
    assert scan.truncated is None


def test_scan_is_bounded_and_stays_inside_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("no")
    root = tmp_path / "root"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "a" / "b" / "c" / "deep.txt").write_text("x")
    for i in range(5):
        (root / f"f{i}.csv").write_text("1")
    os.symlink(outside, root / "link")
    scan = scan_folder(root)
    assert all("secret" not in f.path for f in scan.files)
    assert scan_folder(root, max_files=3).truncated == "files"
    few = scan_folder(root, max_entries=2)  # entries read of one directory
    assert few.truncated == "entries"
    assert len(few.files) <= 2
    shallow = scan_folder(root, max_depth=1)
    assert shallow.truncated == "depth"
    assert "a/b/c/deep.txt" not in {f.path for f in shallow.files}
    with pytest.raises(NotADirectoryError):
        scan_folder(root / "f0.csv")


def test_scan_follows_links_only_inside_and_skips_special_files(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("no")
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.csv").write_text("12345")
    (root / "file_link.txt").symlink_to("sub/a.csv")
    (root / "dir_link").symlink_to("sub")
    (root / "abs_out").symlink_to(outside)
    (root / "rel_out.txt").symlink_to("../outside/secret.txt")
    (root / "dangling").symlink_to("nowhere")
    os.mkfifo(root / "pipe")
    scan = scan_folder(root)
    assert {(f.path, f.size) for f in scan.files} == {
        ("sub/a.csv", 5),
        ("file_link.txt", 5),
        ("dir_link/a.csv", 5),
    }
    assert scan.truncated is None
    (root / "sub" / "loop").symlink_to("..")  # a loop inside stops at the depth bound
    looped = scan_folder(root, max_depth=3)
    assert looped.truncated == "depth"
    assert "dir_link/loop/file_link.txt" in {f.path for f in looped.files}


async def _report(
    tmp_path: Path, scenario: str, *, rounds: int = 1, runtime_scenarios: tuple[Scenario, ...] = ()
) -> tuple[list[Progress], RunResult, Runtime, str]:
    options = ReportOptions(
        goal="Lag time and growth rate",
        out=str(tmp_path / "out" / "report.md"),
        reflect_rounds=rounds,
        models=simulated_models(scenario),
    )
    async with Runtime(scenarios=runtime_scenarios) as runtime:
        with anyio.fail_after(30):
            handle = await start_report(runtime, SAMPLE_FOLDER, options, probes=Probes())
            events = [e async for e in handle.events()]
            result = await handle.result()
    return [e for e in events if isinstance(e, Progress)], result, runtime, handle.run_id


@pytest.mark.asyncio
async def test_the_report_is_written_with_a_plan_known_at_the_first_event(tmp_path: Path) -> None:
    progress, result, _, _ = await _report(tmp_path, "report", rounds=2)
    plan = ("scan", "explore", "draft", "reflect.1", "reflect.2", "finalize")
    assert progress[0].total == len(plan)
    assert progress[0].index == 1
    assert [(p.stage, p.index) for p in progress if p.status != "started"] == [
        (stage, i) for i, stage in enumerate(plan, start=1)
    ]
    # reflect.1 converged: reflect.2 is reported skipped, finalize keeps its own name
    assert [p.status for p in progress if p.stage == "reflect.2"] == ["skipped"]
    # the first event is the scan's end, and its detail is the scan's summary
    assert (progress[0].stage, progress[0].status) == ("scan", "finished")
    assert progress[0].detail.startswith("4 files: 1 documents")
    assert progress[-1].stage == "finalize"
    assert progress[-1].index == progress[-1].total
    assert result.exit_reason is ExitReason.COMPLETED
    assert not result.degraded
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("# Yeast growth")
    assert result.output == report
    summary = json.loads((tmp_path / "out" / "report.summary.json").read_text())
    assert summary["plan"] == list(plan)
    assert [r["run_id"].rsplit(".", 1)[-1] for r in summary["stage_runs"]] == [
        "explore",
        "draft",
        "1",
    ]


@pytest.mark.asyncio
async def test_a_leaked_draft_is_retried_with_a_firmer_instruction(tmp_path: Path) -> None:
    progress, _result, runtime, run_id = await _report(tmp_path, "report_dsml_leak")
    draft = [p.detail for p in progress if p.stage == "draft" and p.status == "finished"]
    assert draft == [
        "accepted after 1 retries (leaked tool markup (DeepSeek DSML tag), no '# ' title, "
        "fewer than two '## ' sections)"
    ]
    retry_handle = runtime.handle(f"{run_id}.draft.2")
    assert retry_handle is not None
    retry = await retry_handle.result()
    firm = retry.transcript[-2]
    assert firm.role == "user"
    assert "You have no tools" in (firm.content or "")
    assert "DSML" not in (tmp_path / "out" / "report.md").read_text()
    # a stage run reports its own progress (1 of 1), never the pipeline's later stages
    own = [e for e in runtime.event_log.events(f"{run_id}.draft") if isinstance(e, Progress)]
    assert own
    assert {(p.stage, p.total) for p in own} == {("draft", 1)}
    assert own[-1].status == "finished"


@pytest.mark.asyncio
async def test_a_collapsing_exploration_degrades_but_the_report_is_written(tmp_path) -> None:
    progress, result, _, _ = await _report(tmp_path, "report_explore_loop")
    assert result.degraded
    assert result.exit_reason is ExitReason.COMPLETED
    explore = [p.detail for p in progress if p.stage == "explore" and p.status == "finished"]
    assert explore[0].endswith("hook_stopped (loop.cache_hits)")
    assert (tmp_path / "out" / "report.md").exists()


REPORT_TOML = Path(__file__).parents[1] / "orchestrator" / "scenarios" / "report.toml"
LEAKER = parse_scenario(
    REPORT_TOML.read_text().replace(
        '[[tracks.draft]]\ntext = """', '[[tracks.draft]]\nrepeat = true\ntext = """<tool_call>'
    ),
    source="leaker.toml",
    name="leaker",
)


@pytest.mark.asyncio
async def test_a_draft_rejected_every_time_fails_the_run_and_writes_nothing(tmp_path) -> None:
    progress, result, _, _ = await _report(tmp_path, "leaker", runtime_scenarios=(LEAKER,))
    assert result.exit_reason is ExitReason.HOOK_STOPPED
    assert result.cause == "stage.output_rejected"
    assert result.llm_requests == 4 + 4
    assert [(p.stage, p.status) for p in progress][-2:] == [
        ("reflect.1", "skipped"),
        ("finalize", "skipped"),
    ]
    assert not (tmp_path / "out" / "report.md").exists()


REVISER = parse_scenario(  # a first draft without its conclusion: reflect.1 revises it,
    REPORT_TOML.read_text()  # reflect.2 converges (the same text again)
    .replace(
        "The replicates agree; the strain grows as expected in rich medium.",
        "To be written: a conclusion, with the figures and a discussion of the replicates.",
        1,  # the draft's, not the reflection's
    )
    .replace('[[tracks.reflect]]\ntext = """', '[[tracks.reflect]]\nrepeat = true\ntext = """'),
    source="reviser.toml",
    name="reviser",
)


@pytest.mark.asyncio
async def test_a_convergence_skips_the_later_rounds_in_plan_order(tmp_path: Path) -> None:
    """Eleven rounds, converged at the second: rounds 3 to 11 are skipped, 10 and 11 too
    (a comparison of the stage names as text put "reflect.10" before "reflect.2")."""
    progress, result, _, _ = await _report(
        tmp_path, "reviser", rounds=11, runtime_scenarios=(REVISER,)
    )
    assert result.exit_reason is ExitReason.COMPLETED
    ends = {p.stage: p.status for p in progress if p.status != "started"}
    assert [ends[f"reflect.{n}"] for n in range(1, 12)] == ["finished"] * 2 + ["skipped"] * 9
    assert result.llm_requests == 4 + 1 + 2  # explore, draft, two reflections


def test_loopfuse_report_writes_the_sample_report_with_plain_progress_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.md"
    args = argparse.Namespace(
        folder=str(SAMPLE_FOLDER), goal="growth", format="markdown", out=str(out), reflect=1
    )
    args.json = False
    # The command line refuses without a model (tests/test_cli_exit_status.py); here the
    # simulator's report tracks play the stages, as the report scenario's do.
    status = anyio.run(
        partial(run_report_command, models=simulated_models("report")),
        Config(),
        args,
        Follower(),
    )
    captured = capsys.readouterr()
    assert status == 0
    assert out.read_text().startswith("# Yeast growth")
    lines = captured.err.splitlines()
    assert lines[0].startswith("1/5 scan finished  20%")
    assert lines[0].endswith("4 files: 1 documents (364 B), 1 images (1.2 KB), 2 data (928 B)")
    assert lines[-1].startswith("5/5 finalize finished 100%")
    assert f"Report written to {out}" in captured.out


def test_loopfuse_report_refuses_a_missing_folder(tmp_path, capsys) -> None:
    endpoint = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    assert main(["report", str(tmp_path / "nope"), "--goal", "g", *endpoint]) == 2
    assert "is not a directory" in capsys.readouterr().err
