"""Helpers for the daemon tests (no tests here): configs, a slow scenario, waiting, and a
real ``loopfuse serve`` process."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec

from orchestrator.config import Config, DaemonSettings, RuntimeSettings
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.schemas import RunRequest
from orchestrator.daemon.store import RunRow, Store

SLOW = """
description = "A slow model reading a file line by line: ends at max_turns."
task = "Read a.txt line by line."

[config]
max_turns = {max_turns}
loop_preset = "off"

[folder]
"a.txt" = {lines}

[[steps]]
latency = {latency}
tool_calls = [
  {{ name = "read_file", arguments = {{ path = "a.txt", offset = "{{n}}", limit = 1 }} }},
]
repeat = true

[expect]
exit_reason = "max_turns"
"""


def write_slow(
    tmp_path: Path, name: str = "slow", *, max_turns: int = 50, latency: float = 0.2
) -> str:
    path = tmp_path / f"{name}.toml"
    lines = json.dumps("".join(f"line {n}\n" for n in range(max_turns + 1)))
    text = SLOW.format(max_turns=max_turns, latency=latency, lines=lines)
    path.write_text(text, encoding="utf-8")
    return str(path)


def daemon_config(tmp_path: Path, *, concurrent: int = 8, **daemon: Any) -> Config:
    settings: dict[str, Any] = {"store_path": str(tmp_path / "daemon.db"), "port": 0, **daemon}
    return Config(
        daemon=DaemonSettings(**settings),
        runtime=RuntimeSettings(max_concurrent_runs=concurrent),
    )


async def store_queued(path: Path, run_id: str, request: RunRequest, *, on_crash: str) -> None:
    """Commit ``request`` to the store at ``path`` as a queued run ``run_id`` (what a daemon
    that stopped before starting it leaves), with the store's own writer."""
    store = Store(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        store.insert_run(
            RunRow(
                id=run_id,
                trace_id="a" * 32,
                status="queued",
                on_crash=on_crash,
                request=json.dumps(msgspec.to_builtins(request)).encode(),
                request_hash="h",
                created_at=0.0,
            )
        )
        await store.flush()
        tg.cancel_scope.cancel()
    store.close()


async def events_until(
    client: DaemonClient, run_id: str, predicate: Any, *, after: int | None = None
) -> list[dict[str, Any]]:
    """The run's events (as dicts with their ``id``) up to the first that ``predicate`` accepts."""
    seen: list[dict[str, Any]] = []
    async for event in client.events(run_id, after=after):
        if event.event != "message":
            break
        data = {"id": event.id, **json.loads(event.data)}
        seen.append(data)
        if predicate(data):
            return seen
    raise AssertionError(f"the stream of {run_id} ended before the condition held: {seen[-3:]}")


async def wait_ended(client: DaemonClient, run_id: str) -> dict[str, Any]:
    """Follow the run's stream to its ``end`` (sent once the result is stored), then
    return the run."""
    async for event in client.events(run_id):
        last = event
    assert last.event == "end", last
    run = await client.run(run_id)
    assert run["status"] == "ended", run
    return run


JSON = {"Content-Type": "application/json"}
"""The header a POST with a body sends (the daemon refuses other types with a 415)."""

START_TIMEOUT = 60.0
"""Seconds for a daemon to finish recovery and listen: a frozen event loop never does."""


@contextmanager
def daemon_process(config: Path, log: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``loopfuse serve --port 0``; yields the process and its URL (read from the banner it
    prints once recovery is done and it listens), or fails after :data:`START_TIMEOUT`."""
    with log.open("a", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--config", str(config), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            # Scenario runs' folders go under the test's directory, even those a kill leaves.
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(config.parent)},
        )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT)
        assert ready, f"no banner in {START_TIMEOUT} s (frozen?); log: {log.read_text()[-2000:]}"
        banner = process.stdout.readline()
        found = re.search(r"listening on (\S+)", banner)
        assert found, f"no banner: {banner!r}; log: {log.read_text()[-2000:]}"
        yield process, found[1]
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
