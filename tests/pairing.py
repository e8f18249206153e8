"""The tests' check that a request's tool calls and results pair up (what collapse and
compaction must keep valid)."""

from __future__ import annotations

from collections.abc import Sequence

from bus import ChatMessage

__all__ = ["pairing_problems"]


def pairing_problems(messages: Sequence[ChatMessage]) -> list[str]:
    """What makes ``messages`` an invalid request as to tool calls: an assistant's calls
    must each be answered by a tool message before any other message, and every tool
    message must answer an open call. Empty when valid."""
    problems: list[str] = []
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id in open_calls:
                open_calls.discard(message.tool_call_id)
            else:
                call_id = message.tool_call_id
                problems.append(f"message {index}: result for no open call {call_id!r}")
            continue
        if open_calls:
            problems.append(f"message {index}: calls {sorted(open_calls)} have no result")
        open_calls = {call.id for call in message.tool_calls}
    if open_calls:
        problems.append(f"end: calls {sorted(open_calls)} have no result")
    return problems
