"""A fleet takeover keeps a run's loop fuse: a worker is killed with SIGKILL mid-loop, an
heir resumes the run from its checkpoint and stops it at the same call as an uninterrupted
run (real nats-server on loopback, the worker a real process)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from orchestrator.cluster import ClusterNode
from orchestrator.config import Config
from orchestrator.daemon.schemas import RunRequest
from orchestrator.sim import parse_scenario
from tests.fleet_support import NEEDS_NATS_SERVER
from tests.nats_server import NatsServer
from tests.test_cluster import all_events, settings_for, start_worker, wait_until
from tests.test_resume_fuses import LOOP

pytestmark = NEEDS_NATS_SERVER


@pytest.mark.asyncio
async def test_an_heir_resumes_a_looping_run_with_its_history_and_stops_it_on_time(
    server: NatsServer, tmp_path: Path
) -> None:
    path = tmp_path / "loop_resume.toml"
    path.write_text(LOOP.format(latency=0.3), encoding="utf-8")
    looping = parse_scenario(path.read_text(), source=str(path), name="loop_resume")
    settings = settings_for(server, ack_wait_seconds=2.0, node_ttl_seconds=2.0)
    process = start_worker(server, path)
    try:
        api = ClusterNode(Config(), settings, name="api", scenarios=[looping], pull=False)
        async with api.running():
            with anyio.fail_after(60):
                run_id = (await api.submit(RunRequest(scenario="loop_resume")))[0].run_id
                ended = 0
                async for event in api.events(run_id):
                    ended += event.type == "TurnEnded"
                    if ended == 2:  # two identical calls seen: the third is warned, the fifth stops
                        break
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                heir = ClusterNode(Config(), settings, name="heir", scenarios=[looping])
                async with heir.running():
                    owners = await wait_until(api, {run_id}, "ended")
                    assert owners == {run_id: "heir"}
                    await heir.wait_idle()
                    assert heir.statistics().resumed == 1
                state = await api.state(run_id)
                events = await all_events(api)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()

    kinds = [kind for _, kind in events[run_id]]
    assert kinds.count("RunStarted") == 2  # the first life and the resumed one
    assert (state.exit_reason, state.cause) == ("hook_stopped", "loop.generic_repeat")
    assert state.result is not None
    # As the uninterrupted run (the scenario's expectation): 4 calls ran, the 5th stopped
    # it; with the history forgotten the heir would have allowed 4 more.
    assert state.result["tool_calls"] == looping.expect.tool_calls == 4
    verdicts = [entry["verdict"] for entry in state.result["call_log"]]
    assert verdicts == ["allow", "allow", "warn", "allow", "not_run"]
