"""The folder-to-report workflow: scan → explore → draft → reflect × N → finalize → compile.

:func:`report_pipeline` builds the stages from :class:`ReportOptions` and the one
:class:`~orchestrator.pipeline.Probes` answer (``compile`` is planned only when the format
is LaTeX and ``xelatex`` was found); :func:`report_handlers` runs them.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import anyio
import msgspec

from bus import ChatMessage, ExitReason, message_text
from orchestrator.pipeline import (
    AgentStage,
    CodeStage,
    PipelineConfig,
    Probes,
    Stage,
    StageContext,
    StageHandler,
    StageOutcome,
)
from orchestrator.pipeline.runner import StageFailed
from orchestrator.report import prompts
from orchestrator.report.checks import ReportFormat, draft_problems
from orchestrator.report.compile import compile_latex
from orchestrator.report.figures import place_figures, saved_figures
from orchestrator.report.scan import FolderScan, scan_folder
from orchestrator.result import RunResult

__all__ = [
    "DRAFT_RETRIES",
    "ReportOptions",
    "report_handlers",
    "report_pipeline",
    "simulated_models",
    "with_notice",
]

DRAFT_RETRIES: Final = 3
"""Firmer retries of a rejected draft before the run fails."""

CONVERGED: Final = 0.98
"""A revision at least this similar to the text it revised ends the reflect rounds."""

NOTES_CHARS: Final = 24_000
"""At most this much of what the exploration read goes into the draft prompt."""


class ReportOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What the report run is asked for.

    ``models`` maps ``explore``, ``draft`` and ``reflect`` to model names (missing: the
    run's default model). ``out`` is the report's path; the run summary is written next
    to it as ``NAME.summary.json``. ``explore_vision``: the explore model reads images, so
    explore offers ``read_image``; ``None`` lets :func:`~orchestrator.report.run.start_report`
    decide from the config (``[models."<name>"] vision``). ``notice``: a sentence the
    report file starts with (the daemon's: the embedded simulator answered, not a model).
    """

    goal: str
    out: str
    format: ReportFormat = "markdown"
    reflect_rounds: int = 1
    models: dict[str, str] = {}
    explore_max_turns: int = 20
    explore_loop_preset: str = "strict"
    explore_vision: bool | None = None
    notice: str = ""


def simulated_models(scenario: str) -> dict[str, str]:
    """The per-stage model names that play the tracks of simulator scenario ``scenario``."""
    return {stage: f"{scenario}/{stage}" for stage in ("explore", "draft", "reflect")}


def _model(options: ReportOptions, stage: str) -> dict[str, str]:
    model = options.models.get(stage)
    return {"model": model} if model else {}


def report_pipeline(options: ReportOptions, probes: Probes) -> PipelineConfig:
    """The report's stages, fixed before the run (the plan is their names)."""
    stages: list[Stage] = [
        CodeStage(name="scan"),
        AgentStage(
            name="explore",
            on_stop="degrade",
            overrides={
                **_model(options, "explore"),
                "tools": [
                    "list_dir",
                    "read_file",
                    *(["read_image"] if options.explore_vision else []),
                    *(["make_figure"] if probes.matplotlib else []),
                    "finish_exploration",
                ],
                "max_turns": options.explore_max_turns,
                "loop_preset": options.explore_loop_preset,
            },
        ),
        AgentStage(
            name="draft", on_stop="fail", overrides={**_model(options, "draft"), "tools": []}
        ),
    ]
    stages += [
        AgentStage(
            name=f"reflect.{n}",
            on_stop="degrade",
            overrides={**_model(options, "reflect"), "tools": []},
        )
        for n in range(1, options.reflect_rounds + 1)
    ]
    stages.append(CodeStage(name="finalize"))
    if options.format == "latex" and probes.xelatex is not None:
        stages.append(CodeStage(name="compile"))
    return PipelineConfig(name="report", stages=tuple(stages))


def report_handlers(options: ReportOptions, probes: Probes) -> Mapping[str, StageHandler]:
    """One handler per stage of :func:`report_pipeline` (same options, same probes)."""
    workflow = _Workflow(options, probes)
    reflect = (f"reflect.{n}" for n in range(1, options.reflect_rounds + 1))
    return {
        "scan": workflow.scan,
        "explore": workflow.explore,
        "draft": workflow.draft,
        "finalize": workflow.finalize,
        "compile": workflow.compile,
        **dict.fromkeys(reflect, workflow.reflect),
    }


class _Workflow:
    def __init__(self, options: ReportOptions, probes: Probes) -> None:
        self._o = options
        self._probes = probes
        self._scan: FolderScan | None = None
        self._notes = ""
        self._figures: tuple[Path, ...] = ()
        self._report = ""
        self._reflections: list[ChatMessage] = []

    async def scan(self, ctx: StageContext) -> StageOutcome:
        folder = ctx.run.folder
        if folder is None:
            raise StageFailed("internal.error", "no folder to scan")
        self._scan = await anyio.to_thread.run_sync(scan_folder, folder)
        return StageOutcome(detail=self._scan.summary())

    async def explore(self, ctx: StageContext) -> StageOutcome:
        assert self._scan is not None
        task = prompts.explore_task(self._o.goal, self._scan.summary(), self._scan.listing())
        vision = prompts.EXPLORE_VISION if self._o.explore_vision else ""
        result = await ctx.run_agent(task, system=prompts.EXPLORE_SYSTEM + vision)
        self._notes = _notes(result) or f"(nothing was read)\n{self._scan.listing()}"
        self._figures = saved_figures(result)
        stopped = result if result.exit_reason is not ExitReason.COMPLETED else None
        detail = f"{result.tool_calls} tool calls, {result.exit_reason.value} ({result.cause})"
        return StageOutcome(detail=detail, stopped=stopped)

    async def draft(self, ctx: StageContext) -> StageOutcome:
        system = prompts.draft_system(self._o.format)
        task = prompts.draft_task(self._o.goal, self._notes)
        history: tuple[ChatMessage, ...] = ()
        rejections: list[str] = []
        for attempt in range(DRAFT_RETRIES + 1):
            result = await ctx.run_agent(task, system=system, history=history)
            if result.exit_reason is not ExitReason.COMPLETED:
                return StageOutcome(detail="the draft run stopped", stopped=result)
            problems = draft_problems(result.output, self._o.format)
            if not problems:
                self._report = result.output.strip() + "\n"
                retried = f" after {attempt} retries ({'; '.join(rejections)})" if attempt else ""
                return StageOutcome(detail=f"accepted{retried}")
            rejections.append(", ".join(problems))
            history = (*history, *_exchange(task, result.output))
            task = prompts.FIRMER.format(problems="; ".join(problems))
        raise StageFailed(
            "stage.output_rejected",
            f"every draft was rejected ({DRAFT_RETRIES + 1} attempts): {' | '.join(rejections)}",
        )

    async def reflect(self, ctx: StageContext) -> StageOutcome:
        task = prompts.reflect_task(self._o.goal, None if self._reflections else self._report)
        system = prompts.draft_system(self._o.format)
        result = await ctx.run_agent(task, system=system, history=tuple(self._reflections))
        if result.exit_reason is not ExitReason.COMPLETED:
            return StageOutcome(detail="kept the previous version", stopped=result)
        revision = result.output.strip() + "\n"
        self._reflections += _exchange(task, result.output)
        if problems := draft_problems(revision, self._o.format):
            return StageOutcome(detail=f"revision rejected ({'; '.join(problems)}), kept previous")
        similarity = difflib.SequenceMatcher(None, self._report, revision).ratio()
        self._report = revision
        if similarity >= CONVERGED:
            plan = ctx.run.plan  # the rounds after this one, in plan order
            after = plan[plan.index(ctx.stage.name) + 1 :]
            later = tuple(s for s in after if s.startswith("reflect."))
            return StageOutcome(detail=f"converged (similarity {similarity:.2f})", skip=later)
        return StageOutcome(detail=f"revised (similarity {similarity:.2f})")

    async def finalize(self, ctx: StageContext) -> StageOutcome:
        out = Path(self._o.out)
        figures: tuple[Path, ...] = ()
        if self._figures:  # out of make_figure's temporary folder, next to the report
            self._report, figures = await anyio.to_thread.run_sync(
                place_figures, self._report, self._figures, out, self._o.format
            )
        ctx.run.output = self._report
        summary: dict[str, object] = {
            "run_id": ctx.run.run_id,
            "goal": self._o.goal,
            "format": self._o.format,
            "report": str(out),
            "plan": list(ctx.run.plan),
            "scan": self._scan.summary() if self._scan else None,
            "figures": [str(f) for f in figures],
            "degraded_by": list(ctx.run.degraded_by),
            "stage_runs": [
                {
                    "run_id": r.run_id,
                    "exit_reason": r.exit_reason.value,
                    "cause": r.cause,
                    "turns": r.turns,
                    "tool_calls": r.tool_calls,
                    "tokens": r.usage.total_tokens,
                }
                for r in ctx.run.results
            ],
            "tokens": ctx.run.usage.total_tokens,
        }
        if self._o.notice:
            summary["note"] = self._o.notice
        text = with_notice(self._report, self._o.notice, self._o.format)
        await anyio.to_thread.run_sync(_write_outputs, out, text, summary)
        return StageOutcome(detail=f"wrote {out} ({len(self._report)} characters)")

    async def compile(self, ctx: StageContext) -> StageOutcome:
        assert self._probes.xelatex is not None, "compile is planned only when xelatex exists"
        pdf, problem = await compile_latex(self._probes.xelatex, Path(self._o.out))
        if problem is not None:
            ctx.run.degraded_by.append(f"compile ({problem})")
            return StageOutcome(detail=f"no PDF: {problem}")
        return StageOutcome(detail=f"wrote {pdf}")


_LATEX_SPECIALS: Final = str.maketrans(
    {c: "\\" + c for c in "&%$#_{}"} | {"~": r"\textasciitilde{}", "^": r"\^{}"}
)


def with_notice(report: str, notice: str, fmt: ReportFormat) -> str:
    r"""``report`` as its file is written: starting with ``notice`` when there is one (a
    quoted line in Markdown; in LaTeX a comment before ``\documentclass`` and the same
    words as the document's first paragraph)."""
    if not notice:
        return report
    if fmt == "markdown":
        return f"> **Note:** {notice}\n\n{report}"
    visible = f"\\noindent\\textbf{{Note:}} {notice.translate(_LATEX_SPECIALS)}\\par\n"
    begin = r"\begin{document}"
    body = report.replace(begin, f"{begin}\n{visible}", 1) if begin in report else report
    return f"% Note: {notice}\n{body}"


def _exchange(task: str, answer: str) -> tuple[ChatMessage, ChatMessage]:
    """A stage's task and the model's answer, as the history of its next attempt or round."""
    return ChatMessage(role="user", content=task), ChatMessage(role="assistant", content=answer)


def _write_outputs(out: Path, report: str, summary: dict[str, object]) -> None:
    """The report, and the run summary next to it (``NAME.summary.json``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report, encoding="utf-8")
    summary_path = out.with_name(out.stem + ".summary.json")
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def _notes(result: RunResult) -> str:
    """What the exploration read and concluded, as text for the draft prompt."""
    parts: list[str] = []
    names: dict[str, str] = {}
    for message in result.transcript:
        for call in message.tool_calls:
            names[call.id] = f"{call.name}({call.arguments})"
            if call.name == "finish_exploration":
                parts.append(f"Conclusion of the exploration: {call.arguments}")
        if message.role == "tool" and message.tool_call_id in names:
            text = message_text(message)  # an image's data is no note for the draft
            parts.append(f"--- {names[message.tool_call_id]}\n{text[:6000]}")
    return "\n\n".join(parts)[:NOTES_CHARS]
