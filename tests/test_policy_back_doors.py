"""The policy's back doors of issue #28 (item 1), tried against a real ``loopfuse serve``.

Each was accepted before the policy judged a request by its effect: loop detection
switched off through the ``loop`` table (``loop_preset = "off"`` itself refused), the
looping tool exempted, the reply ceiling raised through the model-based loop check. Each
is now a 422 naming the key and the reason, and nothing is stored; a request that makes
detection stricter is still accepted, and its run stops sooner.
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

HEALTH_TIMEOUT = 5.0

BACK_DOORS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "every detector switched off through the loop table",
        {
            "loop": {
                "generic_repeat": {"enabled": False},
                "no_new_information": {"enabled": False},
                "unknown_tool": {"enabled": False},
            }
        },
        "config.loop.generic_repeat.enabled",
        "the operator keeps this detector on",
    ),
    (
        "the looping tool exempted",
        {"loop": {"exempt_tools": ["read_file", "finish_exploration"]}},
        "config.loop.exempt_tools",
        "an exempt tool is never counted by any detector",
    ),
    (
        "the reply ceiling raised through the loop check",
        {"loop": {"llm_check": {"enabled": True, "max_tokens": 100_000}}},
        "config.loop.llm_check.max_tokens",
        "100000 is above the operator's ceiling of 8192 tokens",
    ),
    (
        "a stop level raised to effectively off",
        {"loop": {"generic_repeat": {"break_at": 100_000}}},
        "config.loop.generic_repeat.break_at",
        "100000 is above the operator's 5",
    ),
]


@pytest.mark.asyncio
async def test_each_back_door_is_refused_by_a_real_daemon(tmp_path: Path) -> None:
    config = tmp_path / "loopfuse.toml"
    config.write_text(
        f"[daemon]\nstore_path = {json.dumps(str(tmp_path / 'daemon.db'))}\n", encoding="utf-8"
    )
    with daemon_process(config, tmp_path / "daemon.log") as (_, url):
        async with (
            httpx.AsyncClient(base_url=url, timeout=30) as http,
            DaemonClient(url) as client,
        ):
            # the direct way is refused, as it was before
            off = await http.post(
                "/v1/runs", json={"scenario": "dead_loop", "config": {"loop_preset": "off"}}
            )
            assert off.status_code == 422, off.text
            answers = {
                name: await http.post(
                    "/v1/runs", json={"scenario": "dead_loop", "config": overrides}
                )
                for name, overrides, _, _ in BACK_DOORS
            }
            stored = (await http.get("/v1/runs")).json()["runs"]
            # stricter than the operator: accepted, and the loop stops sooner
            stricter = await client.submit(
                {"scenario": "dead_loop", "config": {"loop": {"generic_repeat": {"break_at": 3}}}}
            )
            with anyio.fail_after(60):
                run = await wait_ended(client, stricter["id"])
                health = await http.get("/healthz")
    for name, _, key, reason in BACK_DOORS:
        answer = answers[name]
        assert answer.status_code == 422, (name, answer.text)
        error = answer.json()["error"]
        assert (error["code"], error["key"]) == ("override_not_allowed", key), name
        assert error["message"].startswith(f"`{key}`: "), name
        assert reason in error["message"], (name, error["message"])
    assert stored == []
    assert (run["exit_reason"], run["result"]["cause"]) == ("hook_stopped", "loop.generic_repeat")
    assert run["result"]["turns"] < 5  # dead_loop's own preset stops it at the 5th
    assert health.status_code == 200
