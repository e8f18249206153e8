"""OpenAI chat-format transcripts (from other systems) as recordings.

A transcript is ``{"messages": [...], "tools": [...]}`` (``tools`` as a chat-completions
request sends them) or a bare list of messages. The first ``system`` message is the system
prompt and the first ``user`` message the task; every ``assistant`` message is one model
answer (its ``content`` and ``tool_calls``), every ``tool`` message the result of the call
its ``tool_call_id`` names. Tools not listed get an empty schema. A transcript has no
ending and no verdicts: its replay says where a config would have stopped it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus import ModelReply, ToolCall, ToolSpec
from orchestrator.replay.recording import Answer, Recording, RecordingError, ToolOutcome, result_key
from orchestrator.sim.content import content_text

__all__ = ["recording_from_chat"]

_encode = msgspec.json.Encoder().encode


def recording_from_chat(name: str, document: Any) -> Recording:
    """The recording of a chat transcript (see the module docstring).

    :raises RecordingError: no messages, no user message, or a malformed message.
    """
    if isinstance(document, dict):
        messages, tools = document.get("messages"), document.get("tools") or []
    else:
        messages, tools = document, []
    if not isinstance(messages, list) or not messages:
        raise RecordingError(f"{name}: no 'messages' list")
    if not isinstance(tools, list):
        raise RecordingError(f"{name}: 'tools' must be a list")
    system: str | None = None
    task: str | None = None
    answers: list[Answer] = []
    arguments: dict[str, tuple[str, str]] = {}
    results: dict[str, list[ToolOutcome]] = {}
    names: dict[str, ToolSpec] = {}
    for spec in tools:
        function = spec.get("function") if isinstance(spec, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RecordingError(f"{name}: tools: each needs function.name")
        names[function["name"]] = ToolSpec(
            name=function["name"],
            description=str(function.get("description") or ""),
            parameters=_encode(function.get("parameters") or {"type": "object"}).decode(),
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RecordingError(f"{name}: messages[{index}]: needs a 'role'")
        role, content = message["role"], content_text(message.get("content"))
        if role == "system" and system is None and task is None:
            system = content
        elif role == "user" and task is None:
            task = content
        elif role == "assistant":
            calls = []
            for number, raw in enumerate(message.get("tool_calls") or []):
                function = raw.get("function") if isinstance(raw, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise RecordingError(
                        f"{name}: messages[{index}].tool_calls[{number}]: needs function.name"
                    )
                call_id = str(raw.get("id") or f"call_{index}_{number}")
                args = function.get("arguments") or "{}"
                args = args if isinstance(args, str) else _encode(args).decode()
                calls.append(ToolCall(id=call_id, name=function["name"], arguments=args))
                arguments[call_id] = (function["name"], args)
                names.setdefault(
                    function["name"],
                    ToolSpec(name=function["name"], description="", parameters='{"type":"object"}'),
                )
            reply = ModelReply(
                run_id="",
                turn=0,
                text=content,
                tool_calls=tuple(calls),
                finish_reason="tool_calls" if calls else "stop",
            )
            answers.append(Answer(reply=reply))
        elif role == "tool" and (called := arguments.get(str(message.get("tool_call_id")))):
            results.setdefault(result_key(*called), []).append(ToolOutcome(content=content))
    if task is None:
        raise RecordingError(f"{name}: no user message (the task)")
    if not answers:
        raise RecordingError(f"{name}: no assistant message")
    return Recording(
        name=name,
        task=task,
        system=system,
        tools=tuple(names.values()),
        answers={"turn": tuple(answers)},
        results={key: tuple(found) for key, found in results.items()},
    )
