"""A server killed mid-stream: the streamed text stays in the result and its tokens are
counted, marked estimated (issue #18, item 4)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from bus import ModelTextDelta
from orchestrator.config import Config, ContextSettings, ModelSettings
from orchestrator.runtime import RunSpec, Runtime
from tests.interop.conftest import LlamaServer
from tests.interop.model_writer import LONG_CYCLE

pytestmark = pytest.mark.interop

STREAMED_BEFORE_KILL = 300
"""Characters that must have streamed before the server is killed."""


@pytest.mark.asyncio
async def test_a_server_killed_mid_stream_leaves_the_streamed_text_and_its_tokens(
    llama_server_factory: Callable[..., LlamaServer],
) -> None:
    server = llama_server_factory(chat_format="chatml", model="long", n_ctx=8192)
    config = Config(
        model=ModelSettings(
            base_url=server.base_url,
            model=server.model_id,
            max_output_tokens=7_000,
            max_attempts=2,
            backoff_base_seconds=0.01,
        ),
        context=ContextSettings(windows={server.model_id: 8192}, safety_buffer_tokens=256),
    )
    async with Runtime(config) as runtime:
        handle = await runtime.start(RunSpec(task="Write the alphabet, over and over."))
        streamed = 0
        with anyio.fail_after(60):
            async for message in handle.events():
                if isinstance(message, ModelTextDelta):
                    streamed += len(message.text)
                    if streamed >= STREAMED_BEFORE_KILL:
                        server.process.kill()
                        break
        with anyio.fail_after(60):
            result = await handle.result()
    assert result.exit_reason == "aborted_streaming", result.detail
    assert result.cause.startswith("model."), result.cause
    assert len(result.output) >= STREAMED_BEFORE_KILL
    assert result.output.startswith(LONG_CYCLE * 3)
    assert set(result.output) <= set(LONG_CYCLE)  # nothing but the model's text
    assert result.usage.completion_tokens > 0
    assert result.usage.partial_output_tokens > 0
    assert result.usage.estimated
