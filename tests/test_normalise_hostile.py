"""Issue #28 item 2: text built to make a backtracking regex engine stall, sent through
runs of a real ``loopfuse serve``, never freezes the daemon: ``/healthz`` answers in under
50 ms throughout (the issue's figure; the only timed assertion, as the issue asks).

The text reaches every pattern that reads tool results and model text: the result
normaliser (a scripted tool's results, a 100,000-character file-like result), the
unknown-tool answer that echoes the model's invented tool name, and an operator
``result_patterns`` entry. Before the fix, one such result held the event loop for
3.4 s (``/healthz`` answered in seconds).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import daemon_process, wait_ended
from tests.loopback import open_loopback

HEALTH_BOUND = 0.050
"""Seconds: the issue's bound for ``/healthz`` while the hostile runs go on."""

RUNS = 2
"""Hostile runs submitted at once."""

_LONG = 7_990
"""Characters of each crafted run (a result is normalised in its first and last 4,000
characters: the old patterns' worst case fits in them)."""

ADVERSARIAL = (
    "id" + " " * _LONG + "!",  # \s*[:=#]?\s* after an id-like key: quadratic
    "1." * (_LONG // 2) + "x",  # [\d.]* before a duration unit that never comes
    "pid:" * (_LONG // 4),
    ".1" * (_LONG // 2),
    "7" * _LONG + "g",  # a digit run without a terminator
    "a1" * (_LONG // 2) + "g",  # a hex run without a boundary
    " " * _LONG + "x",
    "a" * 24,  # the operator's pattern below: exponential under a backtracking engine
)

INVENTED = ADVERSARIAL
"""Tool names a model makes up: the executor's "unknown tool" answer echoes each."""

FILE = "0x7f3a id=a1b2c3d4e5 2026-12-05T08:00:00Z 1.2.3.4.5.6.7.8.9 request_id: " * 400
"""A big file-like result (about 30,000 characters, every token of it a volatile one).
(Larger results are a cost of the context gatekeeper's token estimate, not of a regular
expression: 100,000 characters of this hold the event loop about 20 ms per turn there.)"""


_WATCH = """
import sys, time, httpx
worst, answers, failures = 0.0, 0, 0
with httpx.Client(base_url=sys.argv[1], timeout=30) as http:
    print("ready", flush=True)
    while not sys.stdin.closed:
        start = time.perf_counter()
        status = http.get("/healthz").status_code
        worst = max(worst, time.perf_counter() - start)
        answers += 1
        failures += status != 200
        if select.select([sys.stdin], [], [], 0)[0]:
            break
print(worst, answers, failures, flush=True)
""".replace("import sys,", "import select, sys,")


class HealthWatch:
    """``GET /healthz`` over and over from a process of its own (what this test process
    does meanwhile, such as parsing the runs' large events, cannot delay it) until the
    block ends; keeps the slowest answer's seconds."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.worst = 0.0
        self.answers = 0
        self.failures = 0

    def __enter__(self) -> HealthWatch:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _WATCH, self._url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        assert self._process.stdout.readline() == "ready\n"
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self._process.communicate(input="stop\n", timeout=60)
        worst, answers, failures = out.split()
        self.worst, self.answers, self.failures = float(worst), int(answers), int(failures)


async def _run_all(url: str, request: dict[str, object]) -> tuple[HealthWatch, list[Any]]:
    """Submit :data:`RUNS` runs of ``request`` at once and follow each to its end, while a
    :class:`HealthWatch` times ``/healthz``; returns the watch and the ended runs."""
    async with DaemonClient(url) as client:
        # one run first, unwatched: the daemon's first-use work (lazy imports, caches) is
        # not what is measured
        with anyio.fail_after(120):
            await wait_ended(client, (await client.submit(request))["id"])
        with HealthWatch(url) as watch:
            ids = [(await client.submit(request))["id"] for _ in range(RUNS)]
            ended: list[Any] = []

            async def follow(run_id: str) -> None:
                ended.append(await wait_ended(client, run_id))

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for run_id in ids:
                        tg.start_soon(follow, run_id)
    assert watch.failures == 0
    assert watch.answers >= 10
    return watch, ended


def _scenario(tmp_path: Path) -> str:
    results = ", ".join(f"{{ text = {json.dumps(text)} }}" for text in (*ADVERSARIAL, FILE))
    lines = [
        'description = "Results and tool names crafted against backtracking regexes."',
        'task = "Fetch everything."',
        "",
        "[config]",
        "max_turns = 12",
        'loop_preset = "strict"',
        "",
        "[[tools]]",
        'name = "fetch"',
        'description = "Fetch one page."',
        'parameters = { page = "integer" }',
        f"results = [{results}]",
        "",
        "[[steps]]",
        "latency = 0.05",  # the runs overlap the health checks
        'tool_calls = [{ name = "fetch", arguments = { page = "{n}" } }]',
        "repeat = true",
        "",
        "[expect]",
        'exit_reason = "max_turns"',
    ]
    path = tmp_path / "hostile_text.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "loopfuse.toml"
    path.write_text(
        f"[daemon]\nstore_path = {json.dumps(str(tmp_path / 'daemon.db'))}\n"
        f"scenarios = {json.dumps([_scenario(tmp_path)])}\n\n"
        "[loop]\n"
        # an operator pattern that would backtrack exponentially under Python's engine
        'result_patterns = [{ pattern = "(a|a)*b", replacement = "<ab>" }]\n',
        encoding="utf-8",
    )
    return path


@pytest.mark.asyncio
async def test_crafted_text_never_stalls_the_daemon(tmp_path: Path) -> None:
    with daemon_process(_config(tmp_path), tmp_path / "daemon.log") as (_, url):
        watch, ended = await _run_all(url, {"scenario": "hostile_text"})
    # every run got its crafted results (none failed before the tool calls were answered)
    assert [run["cause"] for run in ended] == ["budget.max_turns"] * RUNS, ended
    assert watch.worst < HEALTH_BOUND, f"/healthz took {watch.worst * 1000:.1f} ms"
    assert "Traceback" not in (tmp_path / "daemon.log").read_text()


def _inventing_model() -> Starlette:
    """An OpenAI-compatible endpoint whose every reply calls the tools of
    :data:`INVENTED` (no run has them)."""

    async def completions(request: Request) -> Response:
        await anyio.sleep(0.05)  # a model's latency: the runs overlap the health checks
        calls = [
            {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": "{}"}}
            for n, name in enumerate(INVENTED)
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "inventor",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.mark.asyncio
async def test_invented_tool_names_never_stall_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    async with open_loopback(_inventing_model()) as base_url:
        config = tmp_path / "loopfuse.toml"
        config.write_text(
            f"[daemon]\nstore_path = {json.dumps(str(tmp_path / 'daemon.db'))}\n\n"
            f'[model]\nbase_url = {json.dumps(base_url)}\nmodel = "inventor"\n'
            "stream = false\n\n"
            "[budget]\nmax_turns = 2\n",
            encoding="utf-8",
        )
        with daemon_process(config, tmp_path / "daemon.log") as (_, url):
            watch, ended = await _run_all(url, {"task": "Fetch."})
    for run in ended:  # every invented call was answered "unknown tool" (echoing its name)
        result = run["result"]
        assert isinstance(result, dict)
        kinds = {(call["tool"], call["error_kind"]) for call in result["call_log"]}
        assert kinds == {(name, "unknown_tool") for name in INVENTED}, run["cause"]
    assert watch.worst < HEALTH_BOUND, f"/healthz took {watch.worst * 1000:.1f} ms"
    assert "Traceback" not in (tmp_path / "daemon.log").read_text()
