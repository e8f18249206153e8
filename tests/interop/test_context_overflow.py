"""A task longer than the server's window ends as a context problem, streamed or not
(issue #18, item 3): llama-cpp-python answers a streamed overflow with an empty 200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.interop.conftest import LlamaServer, run_loopfuse, write_config

pytestmark = pytest.mark.interop

WORDS = 3_000


def long_task() -> str:
    words = ("the growth curve of each well was read every fifteen minutes " * 400).split()
    return "Summarise this: " + " ".join(words[:WORDS])


@pytest.mark.parametrize("stream", [True, False])
def test_a_task_over_the_window_ends_with_a_context_cause(
    llama_chatml: LlamaServer, stream: bool, tmp_path: Path
) -> None:
    task = long_task()
    assert len(task.split()) > WORDS
    assert len(task) > llama_chatml.n_ctx
    config = write_config(tmp_path / "c.toml", llama_chatml, f"stream = {str(stream).lower()}\n")
    done = run_loopfuse("run", "--task", task, "--json", config=config)
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["exit_reason"] in {"prompt_too_long", "blocking_limit"}, result
    assert result["cause"].startswith("context."), result
    assert "context" in result["detail"]


def test_with_the_window_configured_nothing_is_sent(
    llama_chatml: LlamaServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "c.toml",
        llama_chatml,
        f'[context]\nsafety_buffer_tokens = 256\n[context.windows]\n"{llama_chatml.model_id}" = '
        f"{llama_chatml.n_ctx}\n",
    )
    mark = llama_chatml.log_mark()
    done = run_loopfuse("run", "--task", long_task(), "--json", config=config)
    result = json.loads(done.stdout)
    assert (result["exit_reason"], result["cause"]) == ("blocking_limit", "context.blocking_limit")
    assert llama_chatml.statuses_since(mark) == []
