"""The hostile probes of issue #16, as a client would send them to ``loopfuse serve`` with
its defaults (a real process): each fails safely, and ``/healthz`` answers throughout.

Each probe has its own tests elsewhere (the policy, input limits, bounded config,
idempotency); this one replays the whole list against one daemon, as the issue did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import daemon_process, wait_ended

TOKEN = "tökén-ß"  # not ASCII: compared as UTF-8 bytes
JSON = {"Content-Type": "application/json"}
HEALTH_TIMEOUT = 5.0
"""Seconds for /healthz to answer: a frozen event loop never does."""


def _hook_probe(marker: Path) -> dict[str, Any]:
    command = ["/bin/sh", "-c", f"id > {marker}; exit 2"]
    return {
        "scenario": "completed",
        "config": {"hooks": [{"name": "x", "kind": "command", "command": command}]},
    }


def _nested_config(depth: int) -> bytes:
    """A run request whose ``config`` nests ``depth`` levels (too deep for ``json``)."""
    return b'{"task": "x", "config": ' + b'{"a": ' * depth + b"{}" + b"}" * depth + b"}"


@pytest.mark.asyncio
async def test_every_probe_fails_safely_and_the_daemon_stays_healthy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPFUSE_API_TOKENS", TOKEN)
    config = tmp_path / "loopfuse.toml"
    config.write_text(
        f"[daemon]\nstore_path = {json.dumps(str(tmp_path / 'daemon.db'))}\n", encoding="utf-8"
    )
    marker = tmp_path / "owned.txt"
    auth = {b"Authorization": b"Bearer " + TOKEN.encode()}
    health_answers = 0

    with daemon_process(config, tmp_path / "daemon.log") as (_, url):
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=30) as http:

            async def healthy() -> None:
                nonlocal health_answers
                with anyio.fail_after(HEALTH_TIMEOUT):
                    assert (await http.get("/healthz")).status_code == 200
                health_answers += 1

            async def refused(body: Any, status: int, key: str | None = None) -> None:
                if isinstance(body, bytes):
                    response = await http.post("/v1/runs", content=body, headers=JSON)
                else:
                    response = await http.post("/v1/runs", json=body)
                assert response.status_code == status, response.text
                error = response.json()["error"]
                if key is not None:
                    assert error["key"] == key, error
                await healthy()

            # Commands: a client cannot set hooks.
            await refused(_hook_probe(marker), 422, "config.hooks")
            # Files: no folder run without operator roots, none outside them.
            await refused({"task": "x", "folder": "/etc"}, 422, "folder")
            await refused({"task": "x", "folder": "/", "config": {"model": "path_escape"}}, 422)
            await refused({"pipeline": {"name": "report", "goal": "g"}, "folder": "/etc"}, 422)
            await refused({"scenario": "/etc/passwd"}, 422, "scenario")
            # Unbounded numbers.
            frozen = {"loop": {"cycle": {"enabled": True, "max_period": 10**30}}}
            await refused({"scenario": "dead_loop", "config": frozen}, 422)
            # 5xx from input.
            await refused(_nested_config(1_000), 400)
            await refused({"task": "x" * 1_000_000}, 422, "task")
            for query in ("cursor=9223372036854775808", "limit=1_0", "cursor=%2B1"):
                listed = await http.get(f"/v1/runs?{query}")
                assert listed.status_code == 400, (query, listed.text)
            await healthy()

            # Idempotency: 30 concurrent repeats, one run, never a 409.
            answers: list[httpx.Response] = []

            async def submit() -> None:
                body = {"scenario": "completed", "idempotency_key": "same"}
                answers.append(await http.post("/v1/runs", json=body))

            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(submit)
            assert sorted(answer.status_code for answer in answers) == [200] * 29 + [202]
            ids = {answer.json()["id"] for answer in answers}
            assert len(ids) == 1
            (run_id,) = ids

            # A bogus Last-Event-ID is refused before the stream starts.
            for last in ("99999999999999999999", "1_0"):
                events = await http.get(
                    f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": last}
                )
                assert events.status_code == 400, (last, events.text)
            await healthy()

            # A wrong token is refused; the right non-ASCII one worked all along.
            wrong = await http.get("/v1/runs", headers={b"Authorization": "Bearer tôken".encode()})
            assert wrong.status_code == 401

            async with DaemonClient(url, token=TOKEN) as client:
                with anyio.fail_after(60):
                    ended = await wait_ended(client, run_id)
            assert ended["exit_reason"] == "completed"
            await healthy()

    assert not marker.exists()  # the hook never ran
    assert health_answers >= 10
    assert "Traceback" not in (tmp_path / "daemon.log").read_text()
