"""Issue #28, finding 5: answers an untrusted client can make large or slow. A listing of
runs with long tasks is paged by bytes and made of summaries (``GET /v1/runs?limit=500``
over 500 such runs built 150 MB per answer, 1.7 GB of RSS with 5 at once); a long
``folder`` is refused before any path is resolved (a 190,000-character one cost seconds).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import httpx
import pytest

from orchestrator.daemon.store import RunRow, Store
from tests.daemon_support import JSON, daemon_process
from tests.test_daemon_connection_limits import (
    HEALTHZ_SECONDS,
    RSS_SLACK_MIB,
    healthz_watched,
    rss_mib,
)

WAIT = 60.0
RUNS = 60
TASK_CHARS = 150_000
PAGE_BYTES = 16_384


async def _store_ended_runs(path: Path) -> list[str]:
    """``RUNS`` ended runs with long tasks and results, as a daemon leaves them; their ids,
    newest first."""
    store = Store(path)
    now = time.time()
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for n in range(RUNS):
            request = {"task": f"{n} " + "t" * TASK_CHARS, "system": "s" * 50_000}
            store.insert_run(
                RunRow(
                    id=f"run-{n:03d}",
                    trace_id="a" * 32,
                    status="ended",
                    on_crash="resume",
                    request=json.dumps(request).encode(),
                    request_hash=str(n),
                    created_at=now + n,
                    ended_at=now + n,
                    exit_reason="completed",
                    cause="completed",
                    result=json.dumps({"simulated": True, "answer": "r" * 100_000}).encode(),
                )
            )
        await store.flush()
        tg.cancel_scope.cancel()
    store.close()
    return [f"run-{n:03d}" for n in reversed(range(RUNS))]


def _serve(tmp_path: Path, *lines: str) -> Path:
    config = tmp_path / "loopfuse.toml"
    store = json.dumps(str(tmp_path / "daemon.db"))
    config.write_text("\n".join(["[daemon]", f"store_path = {store}", *lines]) + "\n")
    return config


@pytest.mark.asyncio
async def test_a_listing_is_paged_by_bytes_and_holds_summaries(tmp_path: Path) -> None:
    ids = await _store_ended_runs(tmp_path / "daemon.db")
    config = _serve(tmp_path, f"max_page_bytes = {PAGE_BYTES}")
    with daemon_process(config, tmp_path / "daemon.log") as (process, url):
        async with httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
            assert (await http.get("/healthz")).status_code == 200
            start = rss_mib(process.pid)

            seen: list[str] = []
            query: dict[str, str | int] = {"limit": 500}
            while True:
                response = await http.get("/v1/runs", params=query)
                assert response.status_code == 200, response.text
                assert len(response.content) <= PAGE_BYTES
                page = response.json()
                assert page["runs"], page
                for run in page["runs"]:
                    assert run["request"]["task"] == run["request"]["task"][:200]
                    assert len(run["request"]["task"]) == 200
                    assert len(run["request"]["system"]) == 200
                    assert run["result"] is None
                    assert run["simulated"] is True
                    seen.append(run["id"])
                if page["next_cursor"] is None:
                    break
                query["cursor"] = page["next_cursor"]
            assert seen == ids  # every run once, newest first

            whole = (await http.get(f"/v1/runs/{ids[0]}")).json()
            assert len(whole["request"]["task"]) == TASK_CHARS + len(f"{RUNS - 1} ")

            async with healthz_watched(url) as healthz_times, anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(http.get, "/v1/runs?limit=500")
            assert max(healthz_times) < HEALTHZ_SECONDS, sorted(healthz_times)[-3:]
            assert rss_mib(process.pid) - start < RSS_SLACK_MIB


@pytest.mark.asyncio
async def test_a_long_folder_is_refused_before_any_path_work(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    config = _serve(tmp_path, f"folder_roots = [{json.dumps(str(root))}]")
    folder = str(root) + "/a" * 95_000  # ~190,000 characters, under daemon.max_task_chars
    with daemon_process(config, tmp_path / "daemon.log") as (_, url):
        async with httpx.AsyncClient(base_url=url, timeout=WAIT, headers=JSON) as http:
            answers: list[httpx.Response] = []

            async def probe() -> None:
                body = {"task": "read it", "folder": folder}
                answers.append(await http.post("/v1/runs", json=body))

            async with healthz_watched(url) as healthz_times:
                with anyio.fail_after(WAIT):
                    async with anyio.create_task_group() as tg:
                        for _ in range(5):
                            tg.start_soon(probe)
            assert max(healthz_times) < HEALTHZ_SECONDS, sorted(healthz_times)[-3:]
            for answer in answers:
                assert answer.status_code == 422, answer.text
                error = answer.json()["error"]
                assert error["code"] == "too_long"
                assert error["key"] == "folder"
                assert "daemon.max_folder_chars" in error["message"]
            inside = await http.post("/v1/runs", json={"task": "x", "folder": str(root)})
            assert inside.status_code == 202, inside.text
