"""``[tools]`` limits reach the tool executor: time limit (also per run), result cap and
the image cap, whose misfit with the result cap is refused naming the key."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from actors.tools import ToolContext, default_registry
from actors.tools.registry import Tool
from bench.scripted_model import ScriptedModel
from bus import ModelReply, ModelRequest, ToolCall
from orchestrator.config import Config, ToolSettings
from orchestrator.errors import ConfigError
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime


async def slow(arguments: dict[str, Any], ctx: ToolContext) -> str:
    await anyio.sleep_forever()  # until its time limit cancels it
    return "never"


async def big(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return "x" * 5_000


def call_once(tool: str) -> Any:
    def script(request: ModelRequest) -> ModelReply:
        if request.turn == 1:
            call = ToolCall(id="call_1", name=tool, arguments="{}")
            return ModelReply(
                run_id=request.run_id,
                turn=1,
                text="",
                tool_calls=(call,),
                finish_reason="tool_calls",
            )
        return ModelReply(run_id=request.run_id, turn=request.turn, text="done")

    return script


async def run_tool(tool: str, config: Config, overrides: dict[str, Any] | None = None) -> str:
    tools = default_registry()
    for name, fn in (("slow", slow), ("big", big)):
        tools.add(Tool.from_json_schema(name, name, {"type": "object"}, fn))
    runtime = Runtime(
        config, tools=tools, model_actor=lambda bus: ScriptedModel(bus, call_once(tool))
    )
    async with runtime:
        with anyio.fail_after(20):
            result: RunResult = await runtime.run(
                RunSpec(task="t", overrides={"tools": [tool], **(overrides or {})})
            )
    tool_message = next(m for m in result.transcript if m.role == "tool")
    return tool_message.content or ""


@pytest.mark.asyncio
async def test_the_configured_time_limit_applies() -> None:
    content = await run_tool("slow", Config(tools=ToolSettings(timeout_seconds=0.05)))
    assert "slow timed out after 0.05 s" in content


@pytest.mark.asyncio
async def test_a_run_may_set_its_own_time_limit() -> None:
    content = await run_tool("slow", Config(), {"tool_timeout_seconds": 0.05})
    assert "timed out after 0.05 s" in content


@pytest.mark.asyncio
async def test_the_configured_result_cap_applies() -> None:
    content = await run_tool("big", Config(tools=ToolSettings(max_result_chars=1_000)))
    assert content.startswith("x" * 1_000)
    assert "[result cut: 4000 of 5000 characters left out]" in content


def test_an_image_cap_that_does_not_fit_the_result_cap_names_the_key() -> None:
    config = Config(tools=ToolSettings(image_max_bytes=200_000, max_result_chars=100_000))
    with pytest.raises(ConfigError) as refused:
        Runtime(config)
    assert refused.value.key == "tools.image_max_bytes"
    assert "raise max_result_chars" in refused.value.reason
    Runtime(Config(tools=ToolSettings(image_max_bytes=200_000, max_result_chars=300_000)))
