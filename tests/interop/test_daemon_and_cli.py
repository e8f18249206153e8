"""The daemon and the command line against llama-cpp-python (issue #18, items 5 and 6):
a run over the daemon's HTTP API, exit statuses, and a config error as one line."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import daemon_process, wait_ended
from tests.interop.conftest import LlamaServer, run_loopfuse, write_config
from tests.interop.model_writer import SHORT_REPLY

pytestmark = pytest.mark.interop


@pytest.mark.asyncio
async def test_the_daemon_runs_a_task_against_the_server(
    llama_chatml: LlamaServer, tmp_path: Path
) -> None:
    store = json.dumps(str(tmp_path / "daemon.db"))
    config = write_config(
        tmp_path / "loopfuse.toml", llama_chatml, f"[daemon]\nstore_path = {store}\n"
    )
    mark = llama_chatml.log_mark()
    with daemon_process(config, tmp_path / "daemon.log") as (_, url):
        async with DaemonClient(url) as client:
            with anyio.fail_after(60):
                started = await client.submit({"task": "Say hello"})
                run = await wait_ended(client, started["id"])
    assert (run["exit_reason"], run["cause"]) == ("completed", "model.end_turn"), run
    assert run["result"]["output"] == SHORT_REPLY
    assert llama_chatml.statuses_since(mark) == [200]


def test_exit_statuses_against_the_server(llama_chatml: LlamaServer, tmp_path: Path) -> None:
    config = write_config(tmp_path / "ok.toml", llama_chatml)
    done = run_loopfuse("run", "--task", "Say hello", config=config)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(SHORT_REPLY)
    assert "Finished:" in done.stdout
    # a budget stop is a failed run: one turn allowed, and the first is a forced tool call
    budget = write_config(
        tmp_path / "b.toml", llama_chatml, 'tool_choice = "list_dir"\n[budget]\nmax_turns = 1\n'
    )
    done = run_loopfuse("run", "--task", "List", "--folder", str(tmp_path), "--json", config=budget)
    result = json.loads(done.stdout)
    assert (result["exit_reason"], result["cause"]) == ("max_turns", "budget.max_turns"), result
    assert done.returncode == 1


def test_a_window_too_small_for_the_reservations_is_one_line(
    llama_chatml: LlamaServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "small.toml",
        llama_chatml,
        f'[context.windows]\n"{llama_chatml.model_id}" = {llama_chatml.n_ctx}\n'
        "[context]\nsafety_buffer_tokens = 8000\n",
    )
    mark = llama_chatml.log_mark()
    done = run_loopfuse("run", "--task", "Say hello", config=config)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    for key in ("context.safety_buffer_tokens", "model.max_output_tokens", "context.windows"):
        assert key in done.stderr
    assert "Traceback" not in done.stderr
    assert "config.context" not in done.stderr
    assert llama_chatml.statuses_since(mark) == []
