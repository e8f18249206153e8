"""The conversation a run keeps: chat messages, tool calls and token usage.

These are plain data (frozen msgspec Structs) shaped like the chat-completions wire format,
so a transcript can be sent to any OpenAI-compatible endpoint and stored as JSON unchanged.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["NUDGE_MARKER", "ChatMessage", "Role", "ToolCall", "ToolSpec", "Usage", "nudge_text"]

Role = Literal["system", "user", "assistant", "tool"]

# Nudges reach the model as user messages that start with this marker, so a scripted model
# (the simulator) can tell which nudge it was given: ``[loopfuse:nudge kind=loop.warning] …``.
NUDGE_MARKER = "[loopfuse:nudge kind="


def nudge_text(kind: str, text: str) -> str:
    """The content of the user message that carries a nudge of ``kind``."""
    return f"{NUDGE_MARKER}{kind}] {text}"


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call the model asked for; ``arguments`` is the raw JSON text it sent."""

    id: str
    name: str
    arguments: str


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as the model sees it: ``parameters`` is its JSON schema, as JSON text."""

    name: str
    description: str
    parameters: str


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of the transcript, in chat-completions shape."""

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token usage; ``estimated`` is true when the endpoint did not report it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            estimated=self.estimated or other.estimated,
        )
