"""Checks of a drafted document: required structure per format, no leaked tool markup.

A draft that fails is not patched; the draft stage retries it with a firmer instruction.
"""

from __future__ import annotations

import re
from typing import Final, Literal

__all__ = ["ReportFormat", "draft_problems", "leaked_markup", "structure_problems"]

ReportFormat = Literal["markdown", "latex"]

# Tool-call markup models leak into text when they "call" a tool they do not have.
_MARKUP: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    # DeepSeek's DSML tags, with ASCII or fullwidth bars: <｜DSML｜function_calls>
    ("DeepSeek DSML tag", re.compile(r"<\s*/?\s*[|｜]\s*DSML\s*[|｜]", re.IGNORECASE)),
    ("DeepSeek tool-call token", re.compile(r"<[|｜]tool[▁_ ]?calls?[▁_ ]?(begin|end)[|｜]>")),
    ("<tool_call> tag", re.compile(r"<\s*/?\s*(tool_call|function_call|invoke)\b", re.I)),
    ("tool_calls JSON", re.compile(r"[\"']tool_calls[\"']\s*:\s*\[")),
    (
        "function-call JSON",
        re.compile(
            r"\{\s*\"(name|function)\"\s*:\s*\"[^\"]+\"\s*,\s*\"(arguments|parameters)\"\s*:"
        ),
    ),
)


def leaked_markup(text: str) -> str | None:
    """The kind of tool markup found in ``text``, or ``None`` when it is clean."""
    for name, pattern in _MARKUP:
        if pattern.search(text):
            return name
    return None


def structure_problems(text: str, fmt: ReportFormat) -> list[str]:
    """What the document lacks for ``fmt`` (empty when the structure is fine)."""
    problems: list[str] = []
    stripped = text.strip()
    if len(stripped) < 200:
        problems.append(f"the document is too short ({len(stripped)} characters)")
    if fmt == "markdown":
        if not re.search(r"^# \S", stripped, re.MULTILINE):
            problems.append("no '# ' title")
        if len(re.findall(r"^## \S", stripped, re.MULTILINE)) < 2:
            problems.append("fewer than two '## ' sections")
    else:
        for required in (r"\documentclass", r"\begin{document}", r"\end{document}"):
            if required not in stripped:
                problems.append(f"no {required}")
        if not stripped.startswith(r"\documentclass"):
            problems.append(r"text before \documentclass")
    return problems


def draft_problems(text: str, fmt: ReportFormat) -> list[str]:
    """Every reason to reject ``text`` as the report (empty: accept it)."""
    markup = leaked_markup(text)
    leaked = [f"leaked tool markup ({markup})"] if markup else []
    return leaked + structure_problems(text, fmt)
