"""The interop tier's servers: llama-cpp-python's ``llama_cpp.server`` on loopback, serving
the tiny models that ``model_writer.py`` writes at session start.

``scripts/interop`` points ``INTEROP_LLAMA_PYTHON`` at the python of ``.venv-llama`` (the
server's own virtualenv). Without that server the tier fails: it exists to talk to it.

Fixtures (pinned in the plan): ``llama_fc`` and ``llama_chatml`` (session servers in the
``chatml-function-calling`` and ``chatml`` chat formats, short model, ``n_ctx`` 4096,
``--interrupt_requests False``) and ``llama_server_factory``, which starts a server of the
test's own (stopped when the test ends).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

LLAMA_PYTHON_ENV = "INTEROP_LLAMA_PYTHON"
REPO = Path(__file__).resolve().parents[2]
MODEL_WRITER = Path(__file__).resolve().parent / "model_writer.py"
START_TIMEOUT = 60.0
ModelName = Literal["short", "long"]


@dataclass
class LlamaServer:
    """A running ``llama_cpp.server``: its ``/v1`` URL, the model id it reports, its window."""

    base_url: str
    model_id: str
    n_ctx: int
    chat_format: str
    process: subprocess.Popen[bytes]
    log: Path
    """The server's stdout and stderr (shown when a test using it fails)."""

    @property
    def root_url(self) -> str:
        """The server without ``/v1`` (``/extras/tokenize`` lives there)."""
        return self.base_url.removesuffix("/v1")

    def log_text(self, limit: int = 6_000) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return text[-limit:]

    def log_mark(self) -> int:
        """Where the log ends now (for :meth:`statuses_since`)."""
        return self.log.stat().st_size

    def statuses_since(self, mark: int, path: str = "/v1/chat/completions") -> list[int]:
        """The HTTP statuses the server answered ``POST path`` with since ``mark``, in order
        (from uvicorn's access log)."""
        with self.log.open("rb") as log:
            log.seek(mark)
            text = log.read().decode("utf-8", errors="replace")
        found = re.findall(rf'"POST {re.escape(path)} HTTP/1\.1" (\d{{3}})', text)
        return [int(status) for status in found]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def llama_python() -> str:
    """The llama venv's python; fails the test (not a skip) when it is missing."""
    python = os.environ.get(LLAMA_PYTHON_ENV) or str(REPO / ".venv-llama" / "bin" / "python")
    if not Path(python).is_file():
        pytest.fail(
            f"no llama-cpp-python server: {python} does not exist; run scripts/interop "
            f"(it builds .venv-llama) or set {LLAMA_PYTHON_ENV}",
            pytrace=False,
        )
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _models_answer(url: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            answer: dict[str, object] = json.loads(response.read())
            return answer
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@dataclass
class ServerPool:
    """Starts servers in one working directory (where ``models/`` holds the GGUF files)."""

    root: Path
    python: str
    started: list[LlamaServer] = field(default_factory=list)

    def start(
        self,
        *,
        chat_format: str = "chatml-function-calling",
        model: ModelName = "short",
        n_ctx: int = 512,
        interrupt_requests: bool = False,
    ) -> LlamaServer:
        port = free_port()
        log = self.root / f"server-{port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    self.python,
                    "-m",
                    "llama_cpp.server",
                    "--model",
                    f"models/{model}.gguf",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--n_ctx",
                    str(n_ctx),
                    "--chat_format",
                    chat_format,
                    "--interrupt_requests",
                    str(interrupt_requests),
                ],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        base_url = f"http://127.0.0.1:{port}/v1"
        server = LlamaServer(base_url, "", n_ctx, chat_format, process, log)
        self.started.append(server)
        server.model_id = _await_ready(server)
        return server

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()
        self.started.clear()


def _await_ready(server: LlamaServer) -> str:
    """Poll ``/v1/models`` until it answers; between polls wait on the process (an early
    exit fails at once, with its log). Returns the model id it reports."""
    attempts = int(START_TIMEOUT / 0.1)
    for _ in range(attempts):
        answer = _models_answer(server.base_url + "/models")
        if answer is not None:
            data = answer["data"]
            assert isinstance(data, list)
            return str(data[0]["id"])
        try:
            code = server.process.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"llama server exited with {code}:\n{server.log_text()}", pytrace=False)
    server.stop()
    pytest.fail(f"llama server not ready in {START_TIMEOUT}s:\n{server.log_text()}", pytrace=False)


@pytest.fixture(scope="session")
def interop_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with ``models/short.gguf`` and ``models/long.gguf``, written now."""
    root = tmp_path_factory.mktemp("interop")
    done = subprocess.run(
        [llama_python(), str(MODEL_WRITER), str(root / "models")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"model_writer failed:\n{done.stderr}", pytrace=False)
    return root


@pytest.fixture(scope="session")
def _session_pool(interop_root: Path) -> Iterator[ServerPool]:
    pool = ServerPool(interop_root, llama_python())
    yield pool
    pool.stop_all()


SESSION_N_CTX = 4096
"""The session servers' window: one token is one character here, and a tool-using run's
prompt (system prompt, task, tool schemas) is a few thousand characters."""


@pytest.fixture(scope="session")
def llama_fc(_session_pool: ServerPool) -> LlamaServer:
    """A server in the ``chatml-function-calling`` chat format (short model)."""
    return _session_pool.start(chat_format="chatml-function-calling", n_ctx=SESSION_N_CTX)


@pytest.fixture(scope="session")
def llama_chatml(_session_pool: ServerPool) -> LlamaServer:
    """A server in the plain ``chatml`` chat format (short model)."""
    return _session_pool.start(chat_format="chatml", n_ctx=SESSION_N_CTX)


@pytest.fixture
def llama_server_factory(
    interop_root: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., LlamaServer]]:
    """``factory(chat_format=..., model="short"|"long", n_ctx=512, interrupt_requests=False)``
    starts a server for this test; every one is stopped when the test ends."""
    pool = ServerPool(interop_root, llama_python())
    request.node.stash[_SERVERS] = pool.started
    yield pool.start
    pool.stop_all()


_SERVERS = pytest.StashKey[list[LlamaServer]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report shows the log of every server it used."""
    report = yield
    if call.when == "call" and report.failed:
        servers = [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, LlamaServer)]
        started: list[LlamaServer] = item.stash.get(_SERVERS, [])
        servers += started
        for server in servers:
            report.sections.append(
                (f"llama server {server.chat_format} {server.base_url}", server.log_text())
            )
    return report


# ----------------------------------------------------------------------- driving loopfuse


def write_config(
    path: Path, server: LlamaServer, extra: str = "", *, model: str = "", max_attempts: int = 2
) -> Path:
    """A loopfuse config file for ``server`` (``extra``: more TOML, appended)."""
    path.write_text(
        "[model]\n"
        f'base_url = "{server.base_url}"\n'
        f'model = "{model or server.model_id}"\n'
        f"max_attempts = {max_attempts}\n"
        "backoff_base_seconds = 0.01\n"
        "max_output_tokens = 64\n"
        f"{extra}\n",
        encoding="utf-8",
    )
    return path


def loopfuse_env() -> dict[str, str]:
    """The environment of a ``loopfuse`` process: no LOOPFUSE_* keys from outside, a key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPFUSE_")}
    env["OPENAI_API_KEY"] = "sk-interop-unused"
    return env


def run_loopfuse(
    *args: str, config: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``loopfuse [--config FILE] ARGS`` as a process, as a user runs it."""
    command = [sys.executable, "-m", "orchestrator"]
    if config is not None:
        command += ["--config", str(config)]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=loopfuse_env(),
        check=False,
    )
