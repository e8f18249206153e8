"""Cutting a tool result the model has not read yet down to what the window leaves room for.

The context gatekeeper decides how much room a new result may take
(``ContextPolicy.tool_result_share``); this module makes the cut text: the result's head,
cut at a line end where one is near, and a note saying how much was left out and how to
read the rest (``read_file`` reads on from a line; other tools need a narrower question).
"""

from __future__ import annotations

import json
from typing import Final

__all__ = ["CUT_MARKER", "NOTE_CHARS", "cut_result", "next_offset"]

CUT_MARKER: Final = "[result cut to fit the context window"
NOTE_CHARS: Final = 400
"""Characters kept free for the note (it is about 300)."""
_LINE_SLACK: Final = 0.1
"""A cut moves back to a line end found within this share of the kept text."""


def cut_result(content: str, keep: int, *, tool: str | None, offset: int | None) -> str:
    """``content``'s first ``keep`` characters (fewer, to end on a whole line) and a note.

    ``offset``: for ``read_file``, the line its call started at; the note then names the
    ``offset`` that reads on."""
    keep = max(0, min(keep, len(content)))
    line_end = content.rfind("\n", int(keep * (1 - _LINE_SLACK)), keep)
    if line_end > 0:
        keep = line_end + 1
    head = content[:keep]
    left = len(content) - keep
    note = (
        f"{CUT_MARKER}: the first {keep:,} of {len(content):,} characters are shown, "
        f"{left:,} were left out."
    )
    if tool == "read_file" and offset is not None:
        lines = head.count("\n")
        note += (
            f" To read on, call read_file again with offset={offset + lines} and a limit "
            "(in lines) small enough to fit.]"
        )
    else:
        note += (
            " To see the rest, ask for it in smaller pieces (read_file takes offset and "
            "limit in lines) or ask a narrower question.]"
        )
    return f"{head}\n{note}" if head else note


def next_offset(tool: str | None, arguments: str | None) -> int | None:
    """The line a ``read_file`` call started at (its ``offset``, 0 if none), else ``None``."""
    if tool != "read_file" or arguments is None:
        return None
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return None
    offset = parsed.get("offset", 0) if isinstance(parsed, dict) else None
    return offset if isinstance(offset, int) and not isinstance(offset, bool) else None
