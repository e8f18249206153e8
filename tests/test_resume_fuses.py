"""A resumed run goes on with its fuses: the loop monitor's history and the token budget's
account come back from the checkpoint, so the run stops at the call it would have stopped
at had it never been interrupted.

In process: a run's checkpoints are kept by a journal; the same run is started again from
one of them (as a restarted daemon does) and must end exactly as the uninterrupted run; the
same checkpoint without the monitors' states ends elsewhere (what a restart did before).
Through a real daemon: ``loopfuse serve`` is killed mid-loop and restarted.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any, Final

import anyio
import msgspec
import pytest

from orchestrator.conductor import RunCheckpoint
from orchestrator.daemon.client import DaemonClient
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime, StartPoint
from orchestrator.sim import Scenario, parse_scenario
from tests.daemon_support import daemon_process, events_until, wait_ended

LOOP: Final = """
description = "The same read_file over and over (strict): nudged at the 3rd, stopped at the 5th."
task = "Read the notes and tell me what the experiment measured."

[config]
max_turns = 20
cache_max_entries = 0

[folder]
"notes.txt" = "Plate reader run 14: OD600 of three yeast strains every 30 minutes.\\n"

[[steps]]
tool_calls = [{{ name = "read_file", arguments = {{ path = "notes.txt" }} }}]
latency = {latency}
repeat = true

[expect]
exit_reason = "hook_stopped"
cause = "loop.generic_repeat"
tool_calls = 4
"""

TARGET: Final = """
description = "Target 30,000 tokens; continuations add 3,000, 3,000, 2,500, 400, 300: stopped."
task = "Write the complete design document for the billing service."

[config]
max_turns = 20
output_token_budget = 30000
budget_mode = "target"

[[steps]]
text = "Part 1: scope and actors."
usage = {{ completion_tokens = 3000 }}
latency = {latency}

[[steps]]
text = "Part 2: pricing rules."
usage = {{ completion_tokens = 3000 }}
latency = {latency}

[[steps]]
text = "Part 3: payment providers."
usage = {{ completion_tokens = 2500 }}
latency = {latency}

[[steps]]
text = "A few more notes on naming."
usage = {{ completion_tokens = 400 }}
latency = {latency}

[[steps]]
text = "One more remark on naming."
usage = {{ completion_tokens = 300 }}
latency = {latency}
repeat = true

[expect]
exit_reason = "max_turns"
cause = "budget.diminishing_returns"
turns = 5
"""


def scenario(template: str, name: str, latency: float = 0.0) -> Scenario:
    return parse_scenario(template.format(latency=latency), source=f"{name}.toml", name=name)


class Journal:
    """Keeps every checkpoint; starts a run from the one it is told to."""

    def __init__(self, resume: RunCheckpoint | None = None) -> None:
        self.checkpoints: list[RunCheckpoint] = []
        self._resume = resume

    def start_point(self, run_id: str) -> StartPoint | None:
        if self._resume is None:
            return None
        return StartPoint(trace_id=self._resume.trace_id, resume=self._resume)

    def checkpoint(self, checkpoint: RunCheckpoint) -> None:
        self.checkpoints.append(checkpoint)


async def run_with(chosen: Scenario, journal: Journal) -> RunResult:
    async with Runtime(scenarios=[chosen], journal=journal) as runtime:
        handle = await runtime.start(
            RunSpec(
                task=chosen.task,
                overrides={"model": chosen.name, **chosen.config},
                run_id="resumed-run",
                folder=str(await folder_of(chosen)),
            )
        )
        with anyio.fail_after(60):
            return await handle.result()


_FOLDERS: dict[str, Path] = {}


async def folder_of(chosen: Scenario) -> Path:
    return _FOLDERS[chosen.name]


def ending(result: RunResult) -> tuple[str, str, int, int, list[str]]:
    return (
        result.exit_reason.value,
        result.cause,
        result.tool_calls,
        result.turns,
        [entry.verdict for entry in result.call_log],
    )


@pytest.fixture(autouse=True)
def folders(tmp_path: Path) -> None:
    for chosen in (scenario(LOOP, "loop_resume"), scenario(TARGET, "target_resume")):
        folder = tmp_path / chosen.name
        folder.mkdir()
        for relative, text in chosen.folder.items():
            (folder / relative).write_text(text, encoding="utf-8")
        _FOLDERS[chosen.name] = folder


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("template", "name", "turn", "monitor"),
    [(LOOP, "loop_resume", 2, "loop"), (TARGET, "target_resume", 3, "budget")],
)
async def test_a_run_resumed_from_a_checkpoint_stops_where_it_would_have(
    template: str, name: str, turn: int, monitor: str
) -> None:
    chosen = scenario(template, name)
    whole = Journal()
    uninterrupted = await run_with(chosen, whole)
    assert uninterrupted.cause == chosen.expect.cause
    point = next(c for c in whole.checkpoints if c.turn == turn)
    assert monitor in point.monitors  # the checkpoint carries the monitor's state

    resumed = await run_with(chosen, Journal(resume=point))
    assert ending(resumed) == ending(uninterrupted)
    assert resumed.nudges == uninterrupted.nudges
    assert resumed.llm_requests == uninterrupted.llm_requests

    # The same checkpoint without the monitors' states: the fuses start from zero again.
    forgetful = await run_with(chosen, Journal(resume=msgspec.structs.replace(point, monitors={})))
    assert forgetful.cause == uninterrupted.cause
    assert forgetful.turns > uninterrupted.turns


@pytest.mark.asyncio
async def test_a_checkpoint_from_before_this_version_still_resumes() -> None:
    chosen = scenario(LOOP, "loop_resume")
    whole = Journal()
    await run_with(chosen, whole)
    raw = msgspec.json.decode(msgspec.json.encode(whole.checkpoints[0]))
    del raw["monitors"]  # as an older daemon stored it
    old = msgspec.json.decode(msgspec.json.encode(raw), type=RunCheckpoint)
    assert old.monitors == {}
    resumed = await run_with(chosen, Journal(resume=old))
    assert resumed.cause == "loop.generic_repeat"


def write_daemon_config(tmp_path: Path) -> Path:
    paths = []
    for template, name in ((LOOP, "loop_resume"), (TARGET, "target_resume")):
        path = tmp_path / f"{name}.toml"
        path.write_text(template.format(latency=0.3), encoding="utf-8")
        paths.append(str(path))
    config = tmp_path / "loopfuse.toml"
    config.write_text(
        f"[daemon]\nstore_path = {json.dumps(str(tmp_path / 'daemon.db'))}\n"
        f"scenarios = {json.dumps(paths)}\n",
        encoding="utf-8",
    )
    return config


async def run_through_daemon(url: str, name: str) -> dict[str, Any]:
    async with DaemonClient(url) as client:
        run_id = (await client.submit({"scenario": name}))["id"]
        with anyio.fail_after(60):
            return await wait_ended(client, run_id)


@pytest.mark.asyncio
async def test_a_killed_daemon_resumes_loop_and_token_fuses_where_they_were(
    tmp_path: Path,
) -> None:
    config, log = write_daemon_config(tmp_path), tmp_path / "daemon.log"
    kill_after = {"loop_resume": 2, "target_resume": 3}
    with daemon_process(config, log) as (process, url):
        uninterrupted = {name: await run_through_daemon(url, name) for name in kill_after}
        async with DaemonClient(url) as client:
            killed = {name: (await client.submit({"scenario": name}))["id"] for name in kill_after}
            with anyio.fail_after(30):
                for name, run_id in killed.items():
                    await events_until(
                        client,
                        run_id,
                        lambda e, turn=kill_after[name]: (
                            e["type"] == "TurnEnded" and e["turn"] >= turn
                        ),
                    )
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    with daemon_process(config, log) as (_, url):
        async with DaemonClient(url) as client:
            with anyio.fail_after(60):
                resumed = {
                    name: await wait_ended(client, run_id) for name, run_id in killed.items()
                }
            starts = {
                name: [
                    json.loads(e.data).get("resumed_from_turn")
                    async for e in client.events(run_id)
                    if e.event == "message" and json.loads(e.data)["type"] == "RunStarted"
                ]
                for name, run_id in killed.items()
            }

    for name in kill_after:
        first, restart = starts[name]
        assert first is None
        assert restart >= kill_after[name] - 1, "resumed from a checkpoint with some history"
        before, after = uninterrupted[name], resumed[name]
        assert (after["exit_reason"], after["cause"]) == (before["exit_reason"], before["cause"])
        assert after["result"]["tool_calls"] == before["result"]["tool_calls"]
        assert after["result"]["turns"] == before["result"]["turns"]
        verdicts = [[c["verdict"] for c in run["result"]["call_log"]] for run in (before, after)]
        assert verdicts[0] == verdicts[1]
