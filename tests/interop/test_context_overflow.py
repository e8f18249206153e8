"""A task longer than the server's window ends as a context problem, streamed or not
(issue #18, item 3): llama-cpp-python answers a streamed overflow with an empty 200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import Config, ContextSettings, ModelSettings
from orchestrator.runtime import RunSpec, Runtime
from tests.interop.conftest import LlamaServer, run_loopfuse, write_config

pytestmark = pytest.mark.interop

WORDS = 3_000


def long_task() -> str:
    words = ("the growth curve of each well was read every fifteen minutes " * 400).split()
    return "Summarise this: " + " ".join(words[:WORDS])


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("max_attempts", [1, 4])
def test_a_task_over_the_window_ends_with_a_context_cause(
    llama_chatml: LlamaServer, stream: bool, max_attempts: int, tmp_path: Path
) -> None:
    """With one attempt too: the retry without streaming after the empty stream is what
    gets the server's real answer (a 400 naming the context length)."""
    task = long_task()
    assert len(task.split()) > WORDS
    assert len(task) > llama_chatml.n_ctx
    config = write_config(
        tmp_path / "c.toml",
        llama_chatml,
        f"stream = {str(stream).lower()}\n",
        max_attempts=max_attempts,
    )
    done = run_loopfuse("run", "--task", task, "--json", config=config)
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["exit_reason"] in {"prompt_too_long", "blocking_limit"}, result
    assert result["cause"].startswith("context."), result
    assert "context" in result["detail"]


@pytest.mark.asyncio
async def test_once_the_tokenizer_calibrated_an_over_long_task_is_never_sent(
    llama_chatml: LlamaServer,
) -> None:
    """With the window configured: the first run's estimate is uncalibrated (the server
    decides); the server's tokenizer then calibrates it, and the next run stops before
    sending anything."""
    server = llama_chatml
    config = Config(
        model=ModelSettings(base_url=server.base_url, model=server.model_id, max_output_tokens=64),
        context=ContextSettings(windows={server.model_id: server.n_ctx}, safety_buffer_tokens=256),
    )
    async with Runtime(config) as runtime:
        first = await runtime.run(RunSpec(task=long_task()))
        mark = server.log_mark()
        second = await runtime.run(RunSpec(task=long_task()))
    assert first.exit_reason in {"prompt_too_long", "blocking_limit"}, first.detail
    assert first.cause.startswith("context.")
    assert (second.exit_reason, second.cause) == ("blocking_limit", "context.blocking_limit")
    assert f"{server.n_ctx:,}" in second.detail
    assert server.statuses_since(mark) == []
