"""Figures ``make_figure`` saved during explore, moved next to the report and linked.

``make_figure`` writes the files its sandbox passed back into a per-run temporary folder
(the daemon writes them: the sandbox has no writable view of the host) and answers
``Saved: PATH, PATH``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Final

from orchestrator.report.checks import ReportFormat
from orchestrator.result import RunResult

__all__ = ["FIGURE_TOOL", "figures_dir", "place_figures", "saved_figures"]

FIGURE_TOOL: Final = "make_figure"
_SAVED: Final = "Saved: "


def saved_figures(result: RunResult) -> tuple[Path, ...]:
    """The files that successful ``make_figure`` calls of ``result`` saved, in order."""
    calls: set[str] = set()
    failed = {entry.call_id for entry in result.call_log if entry.is_error}
    paths: list[Path] = []
    for message in result.transcript:
        calls.update(call.id for call in message.tool_calls if call.name == FIGURE_TOOL)
        if message.role != "tool" or message.tool_call_id not in calls:
            continue
        content = message.content or ""
        if message.tool_call_id in failed or not content.startswith(_SAVED):
            continue
        for text in content.removeprefix(_SAVED).split(", "):
            path = Path(text.strip())
            if path.is_absolute() and path not in paths:
                paths.append(path)
    return tuple(paths)


def figures_dir(out: Path) -> Path:
    """Where the figures of the report ``out`` go: ``NAME.figures/`` next to it."""
    return out.with_name(f"{out.stem}.figures")


def place_figures(
    report: str, figures: tuple[Path, ...], out: Path, report_format: ReportFormat
) -> tuple[str, tuple[Path, ...]]:
    """Copy ``figures`` into ``NAME.figures/`` next to ``out``; return the report, its
    mentions of their temporary paths pointed at the copies (Markdown: a ``## Figures``
    section links those the text does not show), and the copies.

    A figure that no longer exists, or is not a regular file (a link, a pipe), is left
    out. Runs in a worker thread (file I/O).
    """
    target = figures_dir(out)
    copies: list[Path] = []
    for figure in figures:
        if figure.is_symlink() or not figure.is_file():
            continue
        target.mkdir(parents=True, exist_ok=True)
        copy = target / figure.name
        shutil.copyfile(figure, copy)
        copies.append(copy)
        report = report.replace(str(figure), f"{target.name}/{figure.name}")
    if report_format == "markdown":
        missing = [c for c in copies if f"{target.name}/{c.name}" not in report]
        if missing:
            links = "\n\n".join(f"![{c.stem}]({target.name}/{c.name})" for c in missing)
            report = report.rstrip("\n") + f"\n\n## Figures\n\n{links}\n"
    return report, tuple(copies)
