"""Collapse and compaction: what to fold or summarise, and how the transcript changes.

The gatekeeper plans on its ledger (:func:`plan_collapse`, :func:`plan_compaction`); the
conductor, which owns the transcript, carries the plan out with the same functions
(:func:`apply_folds`, :func:`compaction_prompt`, :func:`summary_message`). Both keep the
tool-call pairing valid: a fold changes only a tool result's content, and a compacted
span starts after the task and ends where a kept turn's assistant message begins, so no
call loses its result and no result its call.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from typing import Final, NamedTuple

from actors.context.ledger import PromptLedger
from bus import ChatMessage, Fold, message_images, nudge_text

__all__ = [
    "COMPACT_NUDGE_KIND",
    "MESSAGE_CHARS",
    "SUMMARY_NUDGE_KIND",
    "Span",
    "apply_folds",
    "compaction_prompt",
    "fold_stub",
    "plan_collapse",
    "plan_compaction",
    "summary_message",
    "turns_text",
]

COMPACT_NUDGE_KIND: Final = "context.compact"
"""The compaction request's user message is marked as this nudge kind (scripted models
can answer it on a track of their own)."""
SUMMARY_NUDGE_KIND: Final = "context.summary"
"""The summary that replaces compacted history is marked as this nudge kind."""
MESSAGE_CHARS: Final = 2_000
"""Longest text of one message shown to the summariser."""

_SUMMARY_SYSTEM: Final = (
    "You compress the early part of an AI agent's working session so that it fits the "
    "model's context window. Write a summary of at most about {words} words that the agent "
    "will read instead of these messages: what it learned (facts, file names and numbers "
    "that matter), what it did and decided, what failed, and what is still to do. Plain "
    "text, no preamble, no tool calls."
)


def fold_stub(tool: str | None, chars: int, turn: int) -> str:
    """The text that replaces a folded tool result; says what was folded."""
    return f"[folded: {tool or 'tool'} result, {chars:,} chars, turn {turn}]"


def plan_collapse(
    ledger: PromptLedger, *, min_chars: int, needed: int | None = None
) -> tuple[tuple[Fold, ...], int]:
    """Folds of tool results the model has already answered, oldest first, each at least
    ``min_chars`` long, until ``needed`` tokens are saved (all of them when ``None``).

    Returns the folds and the tokens they save (estimates). The ledger's entries are not
    changed; it remembers how far its entries are folded or never foldable, so the next
    plan starts there (O(new messages) per plan, not O(history)).
    """
    consumed_before = ledger.last_assistant()
    start = ledger.fold_scan_start(min_chars)
    settled = start  # entries before it: folded, or never foldable with min_chars
    folds: list[Fold] = []
    saved = 0
    for index in range(start, consumed_before):
        entry = ledger.entries[index]
        gain = 0
        if entry.role == "tool" and not entry.folded and entry.chars >= min_chars:
            stub = fold_stub(entry.tool, entry.chars, entry.turn)
            after = ledger.estimator.message(
                ChatMessage(role="tool", tool_call_id=entry.call_id, content=stub)
            )
            gain = (entry.estimate - after).tokens
        if gain <= 0:
            if settled == index:
                settled += 1
            continue
        folds.append(Fold(index=index, call_id=entry.call_id or "", stub=stub))
        saved += gain
        if needed is not None and saved >= needed:
            break
    ledger.fold_scan = (min_chars, settled)
    return tuple(folds), saved


class Span(NamedTuple):
    """Transcript messages ``start``..``end`` (exclusive), turns ``first_turn``..``last_turn``."""

    start: int
    end: int
    first_turn: int
    last_turn: int


def plan_compaction(ledger: PromptLedger, *, keep_turns: int) -> Span | None:
    """The early history to summarise: everything after the task up to the start of the
    last ``keep_turns`` turns (an earlier summary included), or ``None`` if there is
    none."""
    head = ledger.first_user() + 1
    if head <= 0:
        return None
    starts = [i for i in range(head, len(ledger)) if ledger.entries[i].role == "assistant"]
    if len(starts) <= keep_turns:
        return None
    end = starts[len(starts) - max(keep_turns, 1)]
    turns = [entry.turn for entry in ledger.entries[head:end]]
    return Span(head, end, min(turns), max(turns))


def apply_folds(transcript: MutableSequence[ChatMessage], folds: Sequence[Fold]) -> list[Fold]:
    """Put each fold's stub in place of its tool result; returns the folds that did not
    match the transcript (wrong index, role or call id), which are left alone."""
    missed: list[Fold] = []
    for fold in folds:
        if 0 <= fold.index < len(transcript):
            message = transcript[fold.index]
            if message.role == "tool" and message.tool_call_id == fold.call_id:
                transcript[fold.index] = ChatMessage(
                    role="tool", tool_call_id=message.tool_call_id, content=fold.stub
                )
                continue
        missed.append(fold)
    return missed


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … [{len(text) - limit:,} more chars]"


def _render(message: ChatMessage, names: dict[str, str]) -> str:
    text, parts = message_images(message)  # image data is no text for a summariser
    content = _clip(text, MESSAGE_CHARS) + (f" [{len(parts)} image(s)]" if parts else "")
    match message.role:
        case "assistant":
            lines = [f"Assistant: {content}"] if content else []
            for call in message.tool_calls:
                names[call.id] = call.name
                lines.append(f"Assistant called {call.name}({_clip(call.arguments, 500)})")
            return "\n".join(lines) or "Assistant: (no text)"
        case "tool":
            name = names.get(message.tool_call_id or "", "a tool")
            return f"Result of {name}: {content}"
        case "system":
            return f"System: {content}"
        case _:
            return f"User: {content}"


def compaction_prompt(
    messages: Sequence[ChatMessage],
    *,
    first_turn: int,
    last_turn: int,
    history_chars: int,
    summary_max_tokens: int,
) -> tuple[ChatMessage, ...]:
    """The request that asks the model to summarise ``messages`` (no tools): a system
    instruction and the history as text, at most ``history_chars`` of it (the middle is
    left out first)."""
    names: dict[str, str] = {}
    lines = [_render(message, names) for message in messages]
    if sum(len(line) + 2 for line in lines) > history_chars:
        head = _fitting(lines, history_chars // 2)
        tail = _fitting(lines[len(head) :][::-1], history_chars // 2)[::-1]
        left_out = len(lines) - len(head) - len(tail)
        lines = [*head, f"[… {left_out} messages left out …]", *tail]
    history = "\n\n".join(lines)
    words = max(summary_max_tokens * 3 // 4, 50)
    turns = turns_text(first_turn, last_turn)
    return (
        ChatMessage(role="system", content=_SUMMARY_SYSTEM.format(words=words)),
        ChatMessage(
            role="user",
            content=nudge_text(
                COMPACT_NUDGE_KIND, f"Summarise {turns} of the session:\n\n{history}"
            ),
        ),
    )


def _fitting(lines: list[str], chars: int) -> list[str]:
    """The first of ``lines`` that fit in ``chars`` (each with its separator)."""
    used = count = 0
    for line in lines:
        used += len(line) + 2
        if used > chars:
            break
        count += 1
    return lines[:count]


def turns_text(first: int, last: int) -> str:
    """``turn 3`` or ``turns 3-5``."""
    return f"turn {first}" if first == last else f"turns {first}-{last}"


def summary_message(text: str, first_turn: int, last_turn: int) -> ChatMessage:
    """The user message that takes the place of compacted history."""
    turns = turns_text(first_turn, last_turn)
    return ChatMessage(
        role="user",
        content=nudge_text(
            SUMMARY_NUDGE_KIND,
            f"Summary of {turns}, compacted to fit the context window (the original "
            f"messages are gone):\n{text.strip()}",
        ),
    )
