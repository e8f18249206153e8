"""With no model configured the daemon still answers tasks and pipelines, with the embedded
simulator, and says so: the result (``simulated``, ``note``), the run's view, the report
file, ``loopfuse runs`` / ``watch`` and a warning at start. Scenario runs and runs on a
configured model are not marked (issue #18, item 10)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from orchestrator.cli import main
from orchestrator.config import Config, ModelSettings
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.starting import warn_without_model
from orchestrator.report.workflow import with_notice
from orchestrator.result import SIMULATOR_NOTE
from orchestrator.sim import open_simulator, shipped_scenarios
from tests.daemon_support import daemon_config, daemon_process, wait_ended

SAMPLE = Path(__file__).resolve().parent.parent / "orchestrator" / "report" / "sample"
TASK = {"task": "Summarise the risks in my meeting notes.", "config": {"model": "completed"}}


async def ended(client: DaemonClient, body: dict[str, Any], seconds: float = 30) -> dict[str, Any]:
    run_id = (await client.submit(body))["id"]
    with anyio.fail_after(seconds):
        return await wait_ended(client, run_id)


@pytest.mark.asyncio
async def test_a_task_without_a_model_is_marked_a_scenario_is_not(tmp_path: Path) -> None:
    async with open_daemon(daemon_config(tmp_path)) as running, DaemonClient(running.url) as client:
        task = await ended(client, TASK)
        scenario = await ended(client, {"scenario": "completed"})
        page = await client.runs()
    assert task["exit_reason"] == scenario["exit_reason"] == "completed"
    assert task["simulated"] is True
    assert task["result"]["simulated"] is True
    assert task["result"]["note"] == SIMULATOR_NOTE
    assert "embedded simulator answered this run, not a model" in SIMULATOR_NOTE
    assert "docs/servers.md" in SIMULATOR_NOTE
    assert scenario["simulated"] is False
    assert scenario["result"]["simulated"] is False
    assert scenario["result"]["note"] == ""
    listed = {run["id"]: run["simulated"] for run in page["runs"]}
    assert listed == {task["id"]: True, scenario["id"]: False}  # pages carry no result


@pytest.mark.asyncio
async def test_a_task_on_a_configured_model_is_not_marked(tmp_path: Path) -> None:
    # The simulator served on loopback is a real endpoint here, as any server would be.
    async with open_simulator(shipped_scenarios()) as simulator:
        config = Config(
            model=ModelSettings(base_url=simulator.base_url, model="completed", max_attempts=1),
            daemon=daemon_config(tmp_path).daemon,
        )
        async with open_daemon(config) as running, DaemonClient(running.url) as client:
            task = await ended(client, TASK)
            page = await client.runs()
    assert task["exit_reason"] == "completed"
    assert task["simulated"] is False
    assert task["result"]["simulated"] is False
    assert task["result"]["note"] == ""
    assert [run["simulated"] for run in page["runs"]] == [False]


@pytest.mark.asyncio
async def test_a_report_without_a_model_starts_with_the_note(tmp_path: Path) -> None:
    request = {"pipeline": {"name": "report", "goal": "Summarise the risks"}, "folder": str(SAMPLE)}
    config = daemon_config(tmp_path, folder_roots=(str(SAMPLE.parent),))
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        run = await ended(client, request, seconds=60)
    assert run["exit_reason"] == "completed"
    assert run["simulated"] is True
    assert run["result"]["note"] == SIMULATOR_NOTE
    reports = tmp_path / "reports"
    text = (reports / f"{run['id']}.md").read_text(encoding="utf-8")
    assert text.startswith(f"> **Note:** {SIMULATOR_NOTE}\n\n# ")
    summary = json.loads((reports / f"{run['id']}.summary.json").read_text(encoding="utf-8"))
    assert summary["note"] == SIMULATOR_NOTE


def test_a_latex_report_starts_with_the_note_and_shows_it_in_the_document() -> None:
    report = "\\documentclass{article}\n\\begin{document}\nText.\n\\end{document}\n"
    text = with_notice(report, SIMULATOR_NOTE, "latex")
    assert text.startswith(f"% Note: {SIMULATOR_NOTE}\n\\documentclass{{article}}")
    after_begin = text.split("\\begin{document}\n", 1)[1]
    assert after_begin.startswith("\\noindent\\textbf{Note:} No model is configured")
    assert "set [model] base\\_url and model" in after_begin  # escaped for LaTeX
    assert with_notice(report, "", "latex") == report
    assert with_notice("# T\n", "", "markdown") == "# T\n"


def test_the_warning_at_start_only_without_a_model(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("loopfuse.test_simulated")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        warn_without_model(Config(model=ModelSettings(base_url="http://127.0.0.1:9/v1")), logger)
        assert caplog.records == []
        warn_without_model(Config(), logger)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "embedded simulator answers task and pipeline runs" in caplog.text


def test_serve_warns_and_runs_and_watch_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, log = tmp_path / "loopfuse.toml", tmp_path / "daemon.log"
    config.write_text(
        f"[daemon]\nstore_path = {json.dumps(str(tmp_path / 'daemon.db'))}\n", encoding="utf-8"
    )
    with daemon_process(config, log) as (_, url):
        task_id = httpx.post(f"{url}/v1/runs", json=TASK).json()["id"]
        scenario_id = httpx.post(f"{url}/v1/runs", json={"scenario": "completed"}).json()["id"]
        assert main(["watch", task_id, "--url", url]) == 0
        watched_task = capsys.readouterr().out
        assert main(["watch", scenario_id, "--url", url]) == 0
        watched_scenario = capsys.readouterr().out
        assert main(["runs", "--url", url]) == 0
        listed = capsys.readouterr().out.splitlines()
    assert "no model is configured" in log.read_text(encoding="utf-8")
    assert f"Note: {SIMULATOR_NOTE}" in watched_task
    assert "Note:" not in watched_scenario
    (task_line,) = [line for line in listed if line.startswith(task_id)]
    (scenario_line,) = [line for line in listed if line.startswith(scenario_id)]
    assert "[simulator] Summarise the risks" in task_line
    assert "[simulator]" not in scenario_line
    assert listed[-1].startswith("[simulator] runs: no model was configured")
