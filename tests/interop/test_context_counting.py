"""How a run against llama-cpp-python counts tokens and finds its window (issue #18,
items 7 and 8): the server's tokenizer calibrates the estimate, the window is keyed by the
full ``/v1/models`` id or its basename, and an unknown window is warned about."""

from __future__ import annotations

import json
from pathlib import Path
from posixpath import basename

import pytest

from orchestrator.config import Config, ModelSettings
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime
from tests.interop.conftest import LlamaServer, run_loopfuse, write_config

pytestmark = pytest.mark.interop


def _counting(result: RunResult) -> list[str]:
    """What the run's ``context counting`` trace events say."""
    return [entry.detail for entry in result.trace if entry.event == "context counting"]


@pytest.mark.asyncio
async def test_the_servers_tokenizer_calibrates_the_estimate(llama_chatml: LlamaServer) -> None:
    config = Config(
        model=ModelSettings(base_url=llama_chatml.base_url, model=llama_chatml.model_id)
    )
    mark = llama_chatml.log_mark()
    async with Runtime(config) as runtime:
        first = await runtime.run(RunSpec(task="Say hello"))
        second = await runtime.run(RunSpec(task="Say hello again"))
    assert first.exit_reason == second.exit_reason == "completed"
    # the server is asked once per model, before the model's first run sends anything
    assert llama_chatml.statuses_since(mark, "/extras/tokenize") == [200]
    for result in (first, second):
        [counting] = _counting(result)
        assert f"Prompt tokens of {llama_chatml.model_id!r} are estimated" in counting
        assert "server's tokenizer (POST /extras/tokenize)" in counting


@pytest.mark.parametrize("key", ["full id", "basename"])
def test_the_window_is_found_by_the_full_model_id_or_its_basename(
    llama_chatml: LlamaServer, key: str, tmp_path: Path
) -> None:
    model_id = llama_chatml.model_id
    assert "/" in model_id  # what /v1/models reports: the --model path
    name = model_id if key == "full id" else basename(model_id)
    config = write_config(
        tmp_path / "w.toml",
        llama_chatml,
        f'[context]\nsafety_buffer_tokens = 0\n[context.windows]\n"{name}" = 200\n',
    )
    done = run_loopfuse("run", "--task", "word " * 200, "--json", config=config)
    result = json.loads(done.stdout)
    assert (result["exit_reason"], result["cause"]) == ("blocking_limit", "context.blocking_limit")
    assert "200-token" in result["detail"] or "200 " in result["detail"], result["detail"]
    assert "is unknown" not in done.stderr


def test_an_unknown_window_is_warned_about(llama_chatml: LlamaServer, tmp_path: Path) -> None:
    config = write_config(tmp_path / "u.toml", llama_chatml)
    done = run_loopfuse("run", "--task", "Say hello", "--json", config=config)
    assert done.returncode == 0, done.stderr
    assert f"context window of model {llama_chatml.model_id!r} is unknown" in done.stderr


@pytest.mark.asyncio
async def test_a_run_without_a_folder_is_offered_no_tools(
    llama_fc: LlamaServer, tmp_path: Path
) -> None:
    """The function-calling template writes every offered tool's schema into the system
    message (tool_choice auto), so the server's own prompt count shows whether tools went."""
    config = Config(
        model=ModelSettings(base_url=llama_fc.base_url, model=llama_fc.model_id, stream=False)
    )
    async with Runtime(config) as runtime:
        plain = await runtime.run(RunSpec(task="Say hello", system="Be brief."))
        with_tools = await runtime.run(
            RunSpec(task="Say hello", system="Be brief.", folder=str(tmp_path))
        )
    assert (plain.exit_reason, with_tools.exit_reason) == ("completed", "completed")
    assert not plain.usage.estimated
    assert not with_tools.usage.estimated
    # the schemas are over a thousand characters, one token each here
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 500
    assert plain.usage.prompt_tokens < 100
