"""Endpoint settings, transcript-to-wire conversion, usage estimates and the public API."""

from __future__ import annotations

import msgspec
import pytest

import actors.llm.caller
from actors.llm.settings import EndpointSettings
from actors.llm.wire import ToolSchemaError, WireTools, estimate_usage, prompt_chars, wire_messages
from bus import ChatMessage, ToolCall, ToolSpec, Usage


def test_public_api() -> None:
    assert actors.llm.caller.__all__ == ["RUN_ID_HEADER", "LLMCaller", "LLMCallerStatistics"]


def test_settings_defaults() -> None:
    s = EndpointSettings(base_url="http://127.0.0.1:8000/v1")
    assert (s.max_attempts, s.stream, s.escalated_max_tokens, s.default_max_tokens) == (
        4,
        True,
        None,
        None,
    )
    assert s.max_tokens_param == "max_tokens"


def test_settings_never_show_secrets() -> None:
    s = EndpointSettings(
        base_url="https://api.example.com/v1",
        api_key="sk-very-secret",
        extra_headers={"Authorization-Proxy": "token-secret"},
    )
    for shown in (repr(s), str(s), f"{s}", repr(s.__rich_repr__())):
        assert "secret" not in shown
        assert "api.example.com" in shown


@pytest.mark.parametrize(
    ("toml_key", "value"),
    [
        ("max_attempts", 0),
        ("call_deadline_seconds", 0),
        ("backoff_base_seconds", -1),
        ("escalated_max_tokens", 0),
        ("base_url", "localhost:8000"),
    ],
)
def test_settings_errors_name_the_key(toml_key: str, value: object) -> None:
    raw = {"base_url": "http://x", toml_key: value}
    with pytest.raises(msgspec.ValidationError, match=toml_key):
        msgspec.convert(raw, EndpointSettings)


def test_settings_reject_unknown_keys() -> None:
    with pytest.raises(msgspec.ValidationError, match="max_retries"):
        msgspec.convert({"base_url": "http://x", "max_retries": 3}, EndpointSettings)


def test_wire_messages() -> None:
    call = ToolCall(id="c1", name="read", arguments='{"p":1}')
    messages = (
        ChatMessage(role="system", content="sys"),
        ChatMessage(role="assistant", tool_calls=(call,)),
        ChatMessage(role="tool", content="data", tool_call_id="c1", name="read"),
        ChatMessage(role="assistant"),
    )
    assert wire_messages(messages) == [
        {"role": "system", "content": "sys"},
        {
            "role": "assistant",
            "content": "",  # never null: strict servers (llama-cpp-python) answer 500
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"p":1}'},
                }
            ],
        },
        {"role": "tool", "content": "data", "tool_call_id": "c1", "name": "read"},
        {"role": "assistant", "content": ""},
    ]
    assert prompt_chars(messages) == 3 + 4 + 7 + 4


def test_tool_schemas_are_decoded_once() -> None:
    tools = WireTools()
    spec = ToolSpec(name="read", description="Read a file", parameters='{"properties": {}}')
    first = tools((spec,))
    again = tools(
        (ToolSpec(name="read", description="Read a file", parameters='{"properties": {}}'),)
    )
    assert first[0] is again[0]
    assert len(tools) == 1
    assert first[0]["function"]["parameters"] == {"properties": {}, "type": "object"}
    assert tools((ToolSpec(name="now", description="", parameters=""),))[0]["function"][
        "parameters"
    ] == {"type": "object"}


def test_tool_schema_cache_is_bounded() -> None:
    tools = WireTools(capacity=2)
    for n in range(5):
        tools((ToolSpec(name=f"t{n}", description="", parameters="{}"),))
    assert len(tools) == 2


@pytest.mark.parametrize("parameters", ["{not json", "[1, 2]"])
def test_bad_tool_schema_names_the_tool(parameters: str) -> None:
    with pytest.raises(ToolSchemaError, match="'broken'"):
        WireTools()((ToolSpec(name="broken", description="", parameters=parameters),))


def test_estimate_usage_rounds_up() -> None:
    assert estimate_usage(9, 0) == Usage(prompt_tokens=3, completion_tokens=0, estimated=True)
