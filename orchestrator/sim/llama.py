"""The ``llama_cpp_python`` server profile: the simulator answering as llama-cpp-python 0.3.36's
server (``python -m llama_cpp.server --chat_format chatml-function-calling``) does where it
differs from OpenAI, for tests that cannot run the real server (facts: notes/interop.md).
What differs is listed in ``docs/scenarios.md`` ("Server profiles"); a whole completion with
one call carries the legacy ``function_call`` too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Literal

import msgspec

from orchestrator.sim import wire
from orchestrator.sim.scenario import StreamShape

__all__ = [
    "LlamaFrames",
    "completion",
    "internal_error",
    "shape_reply",
    "validation_error",
]

APP_TRAILER: Final = (
    '\n\n  File "/llama_cpp/server/app.py", line 455, in create_chat_completion\n'
    "    POST /v1/chat/completions"
)
"""What FastAPI appends to a validation dump: where the endpoint is defined."""

# The members of the server's message union, in its order: (role, required fields).
_MEMBERS: Final = (
    ("system", ()),
    ("user", ()),
    ("assistant", ()),
    ("tool", ("tool_call_id",)),
    ("function", ("name",)),
)
_decode = msgspec.json.Decoder().decode


def _member_errors(index: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """pydantic's entries for one message that fits no member of the union."""
    role = message.get("role")
    entries: list[dict[str, Any]] = []
    for name, required in _MEMBERS:
        at = ("body", "messages", index, f"ChatCompletionRequest{name.capitalize()}Message")
        if role != name:
            expected = f"'{name}'"
            wrong = _entry("literal_error", (*at, "role"), f"Input should be {expected}", role)
            entries.append({**wrong, "ctx": {"expected": expected}})
        if name == "assistant" and "content" in message and message["content"] is None:
            entries.append(
                _entry("string_type", (*at, "content"), "Input should be a valid string", None)
            )
        for field in required:
            if field not in message:
                entries.append(_entry("missing", (*at, field), "Field required", message))
    return entries


def _entry(kind: str, loc: tuple[Any, ...], msg: str, value: Any) -> dict[str, Any]:
    return {"type": kind, "loc": loc, "msg": msg, "input": value}


def _fits(message: dict[str, Any]) -> bool:
    role = message.get("role")
    if role == "assistant":
        return message.get("content", "") is not None
    return any(role == name and all(f in message for f in required) for name, required in _MEMBERS)


def validation_error(body: bytes) -> dict[str, Any] | None:
    """The 500 body the server answers a request whose messages it cannot validate, or
    ``None`` when they are valid (the body is a chat request, messages an array of objects
    with a string ``role``: the caller decoded it already)."""
    entries: list[dict[str, Any]] = []
    for index, message in enumerate(_decode(body)["messages"]):
        if not _fits(message):
            entries += _member_errors(index, message)
    if not entries:
        return None
    lines = "".join(f"\n  {entry!r}" for entry in entries)
    noun = "error" if len(entries) == 1 else "errors"
    return internal_error(f"{len(entries)} validation {noun}:{lines}{APP_TRAILER}")


def internal_error(message: str = "") -> dict[str, Any]:
    """The server's 500 body; with no message, that of its failed ``assert``
    (``tool_choice: "required"``)."""
    error = {"message": message, "type": "internal_server_error", "param": None, "code": None}
    return {"error": error}


def shape_reply(
    reply: wire.Reply,
    *,
    offers_tools: bool,
    tool_choice: Any,
    stream: bool,
    completion_id: str,
) -> wire.Reply | Literal["empty_stream", "failed_assertion"]:
    """``reply`` as the server gives it for this ``tool_choice``, or how it refuses."""
    if not offers_tools or tool_choice is None or tool_choice == "none":
        finish = "stop" if reply.finish_reason == "tool_calls" else reply.finish_reason
        return reply._replace(calls=(), finish_reason=finish)
    if tool_choice == "auto":
        if stream:
            return "empty_stream"
        calls = reply.calls
    elif tool_choice == "required":
        return "failed_assertion"
    else:
        name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else ""
        scripted = [call for call in reply.calls if call.name == name]
        calls = (scripted[0] if scripted else wire.Call("", str(name), "{}"),)
        reply = reply._replace(text="", text_chars=0, finish_reason="tool_calls")
    cmpl = completion_id.removeprefix("chat")
    return reply._replace(
        calls=tuple(
            call._replace(id=f"call__{i}_{call.name}_{cmpl}") for i, call in enumerate(calls)
        )
    )


def completion(completion_id: str, model: str, created: int, reply: wire.Reply) -> dict[str, Any]:
    """The whole ``chat.completion``: as OpenAI's, with ``function_call`` beside one call."""
    result = wire.completion(completion_id, model, created, reply)
    if len(reply.calls) == 1:
        call = reply.calls[0]
        message = result["choices"][0]["message"]
        message["function_call"] = {"name": call.name, "arguments": call.arguments}
    return result


class LlamaFrames(wire.Frames):
    """Frames in the server's shape: every tool-call chunk repeats the call's head, next to
    the legacy ``function_call``. The app builds them without usage: the server sends no
    usage chunk, whatever the request asked."""

    def tool_call_chunks(self, reply: wire.Reply, shape: StreamShape | None) -> Iterator[bytes]:
        size = reply.chunk_size
        for index, call in enumerate(reply.calls):
            text = call.arguments
            pieces = [text[start : start + size] for start in range(0, len(text), size)] or [""]
            pieces.insert(1, "")  # the server sends empty fragments too
            for piece in pieces:
                function = {"name": call.name, "arguments": piece}
                head = {"index": index, "id": call.id, "type": "function", "function": function}
                yield self.chunk(
                    {"role": None, "content": None, "function_call": function, "tool_calls": [head]}
                )
