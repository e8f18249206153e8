"""The prompts of the report stages."""

from __future__ import annotations

from typing import Final

from orchestrator.report.checks import ReportFormat

__all__ = [
    "EXPLORE_SYSTEM",
    "EXPLORE_VISION",
    "FIRMER",
    "draft_system",
    "draft_task",
    "explore_task",
    "reflect_task",
]

EXPLORE_SYSTEM: Final = (
    "You explore a data folder you have never seen, with list_dir and read_file, to learn "
    "what experiment it holds. Read what matters, not everything. When you know enough, "
    "call finish_exploration with the experiment, its goal and the key findings."
)

EXPLORE_VISION: Final = (
    " You can also look at images with read_image: do so when an image may hold data (a "
    "plot, a photo of a plate or a gel, a scanned table), and put what you read from it in "
    "the key findings, since the later stages do not see the images."
)
"""Added to :data:`EXPLORE_SYSTEM` when the explore model reads images."""

FIRMER: Final = (
    "Your previous output was rejected: {problems}. You have no tools; output the complete "
    "document only, with no tool calls, no markup for tools and no commentary."
)

_FORMAT: Final[dict[ReportFormat, str]] = {
    "markdown": "Markdown: a '# ' title and at least two '## ' sections",
    "latex": "a complete LaTeX document starting with \\documentclass",
}


def explore_task(goal: str, scan_summary: str, listing: str) -> str:
    return (
        f"Goal of the report: {goal}\n\nThe folder holds {scan_summary}.\n\n{listing}\n\n"
        "Explore it and finish with finish_exploration."
    )


def draft_system(fmt: ReportFormat) -> str:
    return (
        "You write a report from exploration notes. You have no tools. Output the complete "
        f"document only, as {_FORMAT[fmt]}."
    )


def draft_task(goal: str, notes: str) -> str:
    return f"Goal of the report: {goal}\n\nWhat the exploration found:\n\n{notes}"


def reflect_task(goal: str, report: str | None) -> str:
    if report is None:
        return (
            "Critique your revision once more against the goal and output the complete "
            "revised document only (unchanged if nothing needs to change)."
        )
    return (
        f"Goal of the report: {goal}\n\nCritique the report below against the goal (accuracy, "
        "structure, missing findings), then output the complete revised document only.\n\n"
        f"{report}"
    )
