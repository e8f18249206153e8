"""20 concurrent runs against a server with ``--interrupt_requests`` on (its default): a
stream cut with ``[DONE]`` and no ``finish_reason`` is retried or named for what it is
(issue #18, item 9)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from orchestrator.config import Config, ModelSettings
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime
from tests.interop.conftest import LlamaServer
from tests.interop.model_writer import SHORT_REPLY

pytestmark = pytest.mark.interop

RUNS = 20


@pytest.mark.asyncio
async def test_concurrent_runs_cut_by_the_server_are_retried_or_named_interrupted(
    llama_server_factory: Callable[..., LlamaServer],
) -> None:
    server = llama_server_factory(chat_format="chatml", interrupt_requests=True)
    config = Config(
        model=ModelSettings(
            base_url=server.base_url,
            model=server.model_id,
            max_output_tokens=64,
            backoff_base_seconds=0.01,
        )
    )
    mark = server.log_mark()
    results: list[RunResult] = []
    async with Runtime(config) as runtime:

        async def one(n: int) -> None:
            results.append(await runtime.run(RunSpec(task=f"Say hello, run {n}")))

        with anyio.fail_after(240):
            async with anyio.create_task_group() as tg:
                for n in range(RUNS):
                    tg.start_soon(one, n)
    endings = sorted((r.exit_reason, r.cause) for r in results)
    requests = len(server.statuses_since(mark))
    summary = f"{endings} after {requests} requests"
    assert len(results) == RUNS
    # one request per run unless its stream was cut: more show the server did cut some
    assert requests > RUNS, f"no stream was cut, nothing was tested: {summary}"
    for result in results:
        if result.exit_reason == "completed":
            assert result.output == SHORT_REPLY, summary
        else:  # never an outage or a stream fault: the server said it interrupted the stream
            assert (result.exit_reason, result.cause) == ("aborted_streaming", "model.interrupted")
            assert "interrupt" in (result.detail + result.hint), summary
    assert sum(r.exit_reason == "completed" for r in results) >= RUNS // 2, summary
