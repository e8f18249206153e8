"""Assemble one model reply from streamed pieces, tolerant of server quirks (ecosystem §4.3).

Tool-call fragments are merged by ``index`` (a different id at a known index opens a new
call, for servers that put every call at index 0). The first non-empty ``id`` and ``name`` win (some
servers repeat them in every fragment). An ``arguments`` fragment that starts with the whole
buffer so far, or a complete JSON value arriving after a complete one, replaces the buffer
(servers that send arguments cumulatively, or a final summary chunk). A call repeated at
another index is kept once: the same id, name and arguments (or one copy's arguments not
valid JSON: a cut copy), or no id of its own and the same name and arguments as an earlier
call. Another call under an id already used (servers that number calls per reply, or
repeat one id) is kept with an id of its own, the server's in ``ToolCall.wire_id``. A call
without an id gets one. Nothing here raises on bad model output.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import msgspec

from actors.llm.chunks import Chunk
from bus import ToolCall, Usage

__all__ = ["Assembled", "ReplyAccumulator", "is_json"]

_decode = msgspec.json.Decoder().decode


def is_json(text: str) -> bool:
    """Whether ``text`` is one complete JSON value."""
    try:
        _decode(text)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return False
    return True


def _merge_arguments(buffer: str, fragment: str) -> str:
    if not buffer or fragment.startswith(buffer):
        return fragment
    if (
        buffer.rstrip().endswith(("}", "]"))
        and fragment.lstrip().startswith(("{", "["))
        and is_json(buffer)
        and is_json(fragment)
    ):
        return fragment
    return buffer + fragment


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclasses.dataclass(slots=True, eq=False)
class _Slot:
    id: str = ""
    name: str = ""
    arguments: str = ""
    server_id: bool = False
    unique_id: str = ""  # ours, when another call of the reply has the same id


class Assembled(msgspec.Struct, frozen=True, kw_only=True):
    """The tool calls of a reply, and the ids of those whose arguments are not valid JSON."""

    tool_calls: tuple[ToolCall, ...] = ()
    invalid: tuple[str, ...] = ()


class ReplyAccumulator:
    """Text, tool calls, finish reason and usage of one attempt, fed chunk by chunk."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._chars = 0
        self._slots: list[_Slot] = []
        self._by_index: dict[int, _Slot] = {}
        self._last: _Slot | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.response_id = ""
        """The completion's ``id`` (the first one sent; empty: none)."""
        self.response_model = ""
        """The ``model`` the server says answered (the first one sent; empty: none)."""

    # ---------------------------------------------------------------- feeding

    def add_text(self, text: str) -> None:
        if text:
            self._text.append(text)
            self._chars += len(text)

    def add_tool_fragment(
        self,
        index: int | None,
        *,
        id: str | None = None,
        name: str | None = None,
        arguments: str | None = None,
    ) -> None:
        """One ``delta.tool_calls[]`` entry (``index`` None: servers that omit it)."""
        slot = self._slot_for(index, id or "")
        if id and not slot.id:
            slot.id = id
            slot.server_id = True
        if name and not slot.name:
            slot.name = name
        if arguments:
            slot.arguments = _merge_arguments(slot.arguments, arguments)

    def _slot_for(self, index: int | None, id: str) -> _Slot:
        if id:
            for known in self._slots:
                if known.id == id and (index is None or self._by_index.get(index) is known):
                    self._last = known
                    return known
        slot = self._last if index is None else self._by_index.get(index)
        # A new call: an index seen for the first time, a different id at a known index
        # (servers that put every call at index 0), or a new id without an index.
        if slot is None or (id and slot.server_id and slot.id != id) or (index is None and id):
            slot = _Slot()
            self._slots.append(slot)
        if index is not None:
            self._by_index[index] = slot
        self._last = slot
        return slot

    def feed_chunk(self, chunk: Any) -> str:
        """Feed one ``chat.completion.chunk``; returns its new text (for a delta)."""
        if type(chunk) is Chunk:
            return self._feed_typed(chunk)
        self._identify(getattr(chunk, "id", None), getattr(chunk, "model", None))
        self.set_usage(getattr(chunk, "usage", None))
        new_text = ""
        for choice in getattr(chunk, "choices", None) or ():
            if (getattr(choice, "index", 0) or 0) != 0:
                continue
            delta = getattr(choice, "delta", None)  # None reads as no text and no calls
            for field in ("content", "refusal"):
                piece = getattr(delta, field, None)
                if isinstance(piece, str) and piece:
                    new_text += piece
            for call in getattr(delta, "tool_calls", None) or ():
                self._feed_call(call, getattr(call, "index", None))
            reason = getattr(choice, "finish_reason", None)
            if isinstance(reason, str) and reason:
                self.finish_reason = reason
        self.add_text(new_text)
        return new_text

    def _feed_typed(self, chunk: Chunk) -> str:
        """:meth:`feed_chunk` for a :class:`~actors.llm.chunks.Chunk`: typed, no defaults."""
        if not self.response_id or not self.response_model:
            self._identify(chunk.id, chunk.model)
        if chunk.usage is not None:
            self.set_usage(chunk.usage)
        new_text = ""
        for choice in chunk.choices or ():
            if choice.index:  # another choice (None counts as 0)
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    new_text += delta.content
                if delta.refusal:
                    new_text += delta.refusal
                for call in delta.tool_calls or ():
                    function = call.function
                    self.add_tool_fragment(
                        call.index,
                        id=call.id,
                        name=None if function is None else function.name,
                        arguments=None if function is None else function.arguments,
                    )
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        self.add_text(new_text)
        return new_text

    def feed_completion(self, completion: Any) -> str:
        """Feed a whole (non-streamed) ``chat.completion``; returns its text."""
        self._identify(getattr(completion, "id", None), getattr(completion, "model", None))
        self.set_usage(getattr(completion, "usage", None))
        for choice in getattr(completion, "choices", None) or ():
            if (getattr(choice, "index", 0) or 0) != 0:
                continue
            message = getattr(choice, "message", None)
            content = getattr(message, "content", None) or getattr(message, "refusal", None)
            if isinstance(content, str):
                self.add_text(content)
            for position, call in enumerate(getattr(message, "tool_calls", None) or ()):
                self._feed_call(call, position)
            reason = getattr(choice, "finish_reason", None)
            if isinstance(reason, str) and reason:
                self.finish_reason = reason
            break
        return self.text

    def _identify(self, id: object, model: object) -> None:
        """Keep the first ``id`` and ``model`` the server sent (strings only)."""
        if not self.response_id and isinstance(id, str):
            self.response_id = id
        if not self.response_model and isinstance(model, str):
            self.response_model = model

    def _feed_call(self, call: Any, index: object) -> None:
        function = getattr(call, "function", None)
        self.add_tool_fragment(
            index if isinstance(index, int) else None,
            id=_str(getattr(call, "id", None)),
            name=_str(getattr(function, "name", None)),
            arguments=_str(getattr(function, "arguments", None)),
        )

    def set_usage(self, usage: Any) -> None:
        """Keep ``usage`` if it has both token counts (``None`` has neither)."""
        prompt = getattr(usage, "prompt_tokens", None)
        completion = getattr(usage, "completion_tokens", None)
        if isinstance(prompt, int) and isinstance(completion, int):
            self.usage = Usage(prompt_tokens=prompt, completion_tokens=completion)

    # ---------------------------------------------------------------- reading

    @property
    def text(self) -> str:
        if len(self._text) > 1:
            self._text[:] = ["".join(self._text)]
        return self._text[0] if self._text else ""

    @property
    def completion_chars(self) -> int:
        """Characters the model produced (text, tool names and arguments)."""
        return self._chars + sum(len(s.name) + len(s.arguments) for s in self._slots)

    @property
    def has_output(self) -> bool:
        return bool(self._chars or self._slots)

    def assemble(self, *, partial: bool = False) -> Assembled:
        """The tool calls so far, deduplicated.

        :param partial: the stream was cut off: drop calls that are not complete (no name or
            arguments that are not valid JSON) instead of reporting them as invalid.
        """
        calls: list[ToolCall] = []
        invalid: list[str] = []
        by_id: dict[str, int] = {}
        seen: set[tuple[str, str]] = set()
        for slot in self._slots:
            if not slot.id:
                slot.id = _new_id()
            arguments = slot.arguments
            if not arguments.strip() and not partial:
                arguments = "{}"
            valid = bool(slot.name) and is_json(arguments)
            if partial and not valid:
                continue
            call = ToolCall(id=slot.id, name=slot.name, arguments=arguments)
            earlier = by_id.get(slot.id)
            if earlier is not None:
                kept = calls[earlier]
                if kept.name == slot.name and (
                    kept.arguments == arguments or not valid or kept.id in invalid
                ):
                    # The same call at another index: keep one, the valid one if only one is.
                    if valid and kept.id in invalid:
                        calls[earlier] = call
                        invalid.remove(call.id)
                    continue
                # Another call under the same id: both run, each answered under its own id.
                if not slot.unique_id:
                    slot.unique_id = _new_id()
                call = ToolCall(
                    id=slot.unique_id, name=slot.name, arguments=arguments, wire_id=slot.id
                )
            elif not slot.server_id and (slot.name, arguments) in seen:
                continue
            else:
                by_id[slot.id] = len(calls)
            seen.add((slot.name, arguments))
            calls.append(call)
            if not valid:
                invalid.append(call.id)
        return Assembled(tool_calls=tuple(calls), invalid=tuple(invalid))


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
