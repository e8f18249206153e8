"""Checks of a drafted document: required structure per format, no leaked tool markup.

A draft that fails is not patched; the draft stage retries it with a firmer instruction.
"""

from __future__ import annotations

from typing import Final, Literal

import re2

__all__ = ["ReportFormat", "draft_problems", "leaked_markup", "structure_problems"]

ReportFormat = Literal["markdown", "latex"]

# Tool-call markup models leak into text when they "call" a tool they do not have. RE2
# (linear time): the text is the model's.
_MARKUP: Final = (
    # DeepSeek's DSML tags, with ASCII or fullwidth bars: <｜DSML｜function_calls>
    ("DeepSeek DSML tag", re2.compile(r"(?i)<\s*/?\s*[|｜]\s*DSML\s*[|｜]")),
    ("DeepSeek tool-call token", re2.compile(r"<[|｜]tool[▁_ ]?calls?[▁_ ]?(begin|end)[|｜]>")),
    ("<tool_call> tag", re2.compile(r"(?i)<\s*/?\s*(tool_call|function_call|invoke)\b")),
    ("tool_calls JSON", re2.compile(r"[\"']tool_calls[\"']\s*:\s*\[")),
    (
        "function-call JSON",
        re2.compile(
            r"\{\s*\"(name|function)\"\s*:\s*\"[^\"]+\"\s*,\s*\"(arguments|parameters)\"\s*:"
        ),
    ),
)

_TITLE: Final = re2.compile(r"(?m)^# \S")
_SECTIONS: Final = re2.compile(r"(?m)^## \S")


def leaked_markup(text: str) -> str | None:
    """The kind of tool markup found in ``text``, or ``None`` when it is clean."""
    return next((name for name, pattern in _MARKUP if pattern.search(text)), None)


def structure_problems(text: str, fmt: ReportFormat) -> list[str]:
    """What the document lacks for ``fmt`` (empty when the structure is fine)."""
    problems: list[str] = []
    stripped = text.strip()
    if len(stripped) < 200:
        problems.append(f"the document is too short ({len(stripped)} characters)")
    if fmt == "markdown":
        if not _TITLE.search(stripped):
            problems.append("no '# ' title")
        if len(_SECTIONS.findall(stripped)) < 2:
            problems.append("fewer than two '## ' sections")
    else:
        required = (r"\documentclass", r"\begin{document}", r"\end{document}")
        problems += [f"no {part}" for part in required if part not in stripped]
        if not stripped.startswith(r"\documentclass"):
            problems.append(r"text before \documentclass")
    return problems


def draft_problems(text: str, fmt: ReportFormat) -> list[str]:
    """Every reason to reject ``text`` as the report (empty: accept it)."""
    markup = leaked_markup(text)
    return ([f"leaked tool markup ({markup})"] if markup else []) + structure_problems(text, fmt)
