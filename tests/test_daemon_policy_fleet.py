"""A fleet member (``loopfuse serve --nats``) applies the same policy as a single daemon and
gives concurrent repeats of an idempotency key the same run."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.fleet_support import NEEDS_NATS_SERVER
from tests.nats_server import NatsServer
from tests.test_cluster_http import start_daemon, stop
from tests.test_daemon_idempotency import post_all
from tests.test_daemon_policy import completed_text, hook, refusal

pytestmark = NEEDS_NATS_SERVER


@pytest.mark.asyncio
async def test_a_fleet_member_refuses_the_probes_and_keeps_keys_concurrent(
    server: NatsServer, tmp_path: Path
) -> None:
    marker = tmp_path / "owned.txt"
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "escape").symlink_to("/etc")
    mine = tmp_path / "mine.toml"
    mine.write_text(completed_text())
    settings = f'folder_roots = ["{root}"]\nstore_path = "{tmp_path}/s"\nscenarios = ["{mine}"]\n'
    daemon, url = start_daemon(server, "p", tmp_path, f"[daemon]\n{settings}")
    probes = {
        "config.hooks": {"scenario": "completed", "config": {"hooks": [hook(marker)]}},
        "config.model": {"task": "x", "config": {"model": "path_escape"}},
        "config.max_turns": {"task": "x", "config": {"max_turns": 21}},
        "folder": {"task": "x", "folder": "/etc"},
        "scenario": {"scenario": "/etc/passwd"},
    }
    by_path = {"scenario": str(mine)}
    try:
        with anyio.fail_after(90):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                assert (await http.get("/readyz")).status_code == 200
                answers = {key: await http.post("/v1/runs", json=b) for key, b in probes.items()}
                escape = await http.post(
                    "/v1/runs", json={"task": "x", "folder": str(root / "escape")}
                )
                inside = await http.post(
                    "/v1/runs", json={"task": "x", "folder": str(root / "data")}
                )
                path = await http.post("/v1/runs", json=by_path)
                name = await http.post("/v1/runs", json={"scenario": "mine"})
                names = (await http.get("/v1/scenarios")).json()["scenarios"]
            body = {"scenario": "completed", "idempotency_key": "fleet-30"}
            repeats = await post_all(url, [body] * 30)
    finally:
        stop(daemon)
    for key, response in answers.items():
        assert response.status_code == 422, (key, response.text)
        assert refusal(response)["key"] == key
    assert refusal(escape)["code"] == "folder_not_allowed"
    assert inside.status_code == 202, inside.text
    assert refusal(path)["code"] == "unknown_scenario"
    assert name.status_code == 202, name.text
    assert {"mine", "completed"} <= set(names)
    assert sorted(r.status_code for r in repeats) == [200] * 29 + [202]
    assert len({r.json()["id"] for r in repeats}) == 1
    assert not marker.exists()
