"""The chat-completions wire format: replies, stream chunks, usage and error bodies.

Shapes follow the OpenAI API as the ``openai`` SDK parses it (``notes/ecosystem.md`` §4);
context-overflow errors can also take the DeepSeek, vLLM and llama.cpp shapes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any, Final, NamedTuple

import msgspec

from orchestrator.sim.scenario import Fault, Step, StreamShape
from orchestrator.sim.script import Position, filler, render_arguments

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DONE",
    "KEEP_ALIVE",
    "Call",
    "Frames",
    "Reply",
    "build_reply",
    "completion",
    "context_error",
    "encode",
    "error_body",
    "estimate_tokens",
    "fault_error",
]

DONE: Final = b"data: [DONE]\n\n"
KEEP_ALIVE: Final = b": keep-alive\n\n"
CHARS_PER_TOKEN: Final = 4
DEFAULT_CONTEXT_WINDOW: Final = 8192

_ENCODER: Final = msgspec.json.Encoder()
encode: Final = _ENCODER.encode

_DEFAULTS: Final[dict[int, tuple[str, str | None, str]]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    413: ("invalid_request_error", "request_too_large", "Request entity too large."),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for requests. Please try again later.",
    ),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", "server_is_overloaded", "The server is overloaded or not ready yet."),
}


def estimate_tokens(chars: int) -> int:
    """Tokens for ``chars`` characters: one per four, at least one."""
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


class Call(NamedTuple):
    """A tool call as sent: id, function name and the JSON arguments text."""

    id: str
    name: str
    arguments: str


class Reply(NamedTuple):
    """One assistant reply ready to send (whole or in chunks)."""

    text: str
    text_chars: int
    chunk_size: int
    calls: tuple[Call, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    def pieces(self) -> Iterator[str]:
        """The text in chunks of ``chunk_size`` characters."""
        buffer = ""
        for part in filler(self.text, self.text_chars):
            buffer += part
            while len(buffer) >= self.chunk_size:
                yield buffer[: self.chunk_size]
                buffer = buffer[self.chunk_size :]
        if buffer:
            yield buffer

    def full_text(self) -> str:
        return "".join(filler(self.text, self.text_chars))

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }


def build_reply(
    step: Step, position: Position, *, prompt_tokens: int, max_tokens: int | None
) -> Reply:
    """The reply ``step`` gives at ``position`` (``{n}``: the step), cut at ``max_tokens``."""
    text = step.text.replace("{n}", str(position.step))
    chars = step.text_tokens * CHARS_PER_TOKEN if step.text_tokens else len(text)
    calls = tuple(
        Call(
            id=call.id or f"call_{position.replies}_{j}",
            name=call.name,
            arguments=call.raw_arguments
            if call.raw_arguments is not None
            else _ENCODER.encode(render_arguments(call.arguments, position.step)).decode(),
        )
        for j, call in enumerate(step.tool_calls)
    )
    scripted = step.usage
    if scripted is not None and scripted.prompt_tokens is not None:
        prompt_tokens = scripted.prompt_tokens
    if scripted is not None and scripted.completion_tokens is not None:
        completion = scripted.completion_tokens
    elif step.text_tokens:
        completion = step.text_tokens
    else:
        completion = estimate_tokens(chars + sum(len(c.arguments) for c in calls))
    finish = step.finish_reason or ("tool_calls" if calls else "stop")
    if step.honor_max_tokens and max_tokens is not None and completion > max_tokens:
        chars = min(chars, max_tokens * CHARS_PER_TOKEN)
        calls, finish, completion = (), "length", max_tokens
    return Reply(text, chars, step.chunk_size, calls, finish, prompt_tokens, completion)


class Frames:
    """Encodes the SSE frames of one streamed completion."""

    def __init__(self, completion_id: str, model: str, created: int, include_usage: bool) -> None:
        self._head = _head(completion_id, "chat.completion.chunk", created, model)
        self.include_usage = include_usage

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        body: dict[str, Any] = {**self._head, "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return _frame(body)

    def tool_call_chunks(self, reply: Reply, shape: StreamShape | None) -> Iterator[bytes]:
        """Per call: a first fragment with id, type, name and ``""``, then argument pieces
        (OpenAI's shape); ``shape`` may repeat the head in every fragment, send the
        arguments cumulatively and choose where fragments end."""
        shape = shape or StreamShape()
        for index, call in enumerate(reply.calls):
            head = {"index": index, "id": call.id, "type": "function"}
            yield self.chunk(
                {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}
            )
            text = call.arguments
            ends = (
                [*(end for end in shape.splits if end < len(text)), len(text)]
                if shape.splits is not None
                else [*range(reply.chunk_size, len(text), reply.chunk_size), len(text)]
            )
            for start, end in itertools.pairwise([0, *ends]) if text else ():
                piece = text[:end] if shape.arguments == "cumulative" else text[start:end]
                if shape.repeat_head:
                    fragment = {**head, "function": {"name": call.name, "arguments": piece}}
                else:
                    fragment = {"index": index, "function": {"arguments": piece}}
                yield self.chunk({"tool_calls": [fragment]})

    def usage(self, reply: Reply) -> bytes:
        return _frame({**self._head, "choices": [], "usage": reply.usage()})


def completion(completion_id: str, model: str, created: int, reply: Reply) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` body for ``reply``."""
    text = reply.full_text()
    message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.calls
        ]
    finish = reply.finish_reason
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    head = _head(completion_id, "chat.completion", created, model)
    return {**head, "choices": [choice], "usage": reply.usage()}


def _head(completion_id: str, kind: str, created: int, model: str) -> dict[str, Any]:
    """The fields every completion and chunk starts with."""
    return {
        "id": completion_id,
        "object": kind,
        "created": created,
        "model": model,
        "system_fingerprint": "fp_loopfuse_sim",
    }


def error_body(
    status: int, message: str | None = None, type_: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An OpenAI-shaped error body, with defaults for ``status``."""
    default_type = "server_error" if status >= 500 else "invalid_request_error"
    d_type, d_code, d_message = _DEFAULTS.get(status, (default_type, None, f"Error {status}."))
    error = {
        "message": message or d_message,
        "type": type_ or d_type,
        "param": None,
        "code": code if code is not None else d_code,
    }
    return {"error": error}


def fault_error(fault: Fault) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Status (500 unless set), headers and body of an HTTP error fault."""
    status = fault.status or 500
    headers: dict[str, str] = {}
    if fault.retry_after is not None:
        after = fault.retry_after
        headers["retry-after"] = str(int(after)) if after == int(after) else str(after)
    if fault.retry_after_ms is not None:
        headers["retry-after-ms"] = str(fault.retry_after_ms)
    return status, headers, error_body(status, fault.message, fault.type, fault.code)


def context_error(fault: Fault, prompt_tokens: int, window: int) -> tuple[int, dict[str, Any]]:
    """Status and body of a context overflow in the shape ``fault.shape``."""
    status = fault.status or 400
    too_long = f"This model's maximum context length is {window} tokens. However, "
    requested = (
        f"{too_long}you requested {prompt_tokens} tokens ({prompt_tokens} in the messages, 0 "
        "in the completion). Please reduce the length of the messages or completion."
    )
    match fault.shape:
        case "openai" | "llama_cpp_python":  # (streamed: B answers it with an empty 200)
            message = (
                f"{too_long}your messages resulted in {prompt_tokens} tokens. "
                "Please reduce the length of the messages."
            )
            error = _error(fault, message, "invalid_request_error", "context_length_exceeded")
            return status, {"error": {**error, "param": "messages"}}
        case "deepseek":
            error = _error(fault, requested, "invalid_request_error", "invalid_request_error")
            return status, {"error": error}
        case "vllm" | "vllm_old":
            error = {**_error(fault, requested, "BadRequestError", None), "code": status}
            if fault.shape == "vllm":
                return status, {"error": error}
            return status, {"object": "error", **error}
        case "llama_cpp":
            message = "the request exceeds the available context size, try increasing it"
            error = {
                "code": status,
                "message": fault.message or message,
                "type": fault.type or "exceed_context_size_error",
                "n_prompt_tokens": prompt_tokens,
                "n_ctx": window,
            }
            return status, {"error": error}


def _error(fault: Fault, message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {
        "message": fault.message or message,
        "type": fault.type or type_,
        "param": None,
        "code": fault.code if fault.code is not None else code,
    }


def _frame(body: dict[str, Any]) -> bytes:
    return b"data: " + _ENCODER.encode(body) + b"\n\n"
