"""The fleet on a real nats-server (loopback, JetStream in a temporary directory).

Several :class:`ClusterNode` daemons share one NATS: runs submitted to any of them end once,
with their expected reasons; duplicates are one run; aborts and event streams work from any
daemon; a daemon killed with SIGKILL loses no run; a NATS restart loses nothing accepted.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy, KeyValueConfig
from nats.js.errors import NotFoundError

from orchestrator.cluster import ClusterError, ClusterNode, ClusterSettings
from orchestrator.cluster.jetstream import bucket_keys
from orchestrator.config import Config
from orchestrator.daemon import starting
from orchestrator.daemon.schemas import RunRequest
from orchestrator.sim import Scenario, find_scenario, parse_scenario
from tests.fleet_support import NEEDS_NATS_SERVER
from tests.nats_server import NatsServer

pytestmark = NEEDS_NATS_SERVER

QUICK = ("max_turns", "path_escape", "hook_denied", "max_tool_calls", "dead_loop", "completed")

# A run that is still busy when the test acts on it: one quick turn, then a slow tool.
SLOW = """
description = "A quick turn, then a slow tool, then the answer."
task = "Count, then fit."

[config]
max_turns = 5
abort_grace_seconds = 0.2

[[tools]]
name = "count_rows"
description = "Count the rows."
results = ["1240 rows"]

[[tools]]
name = "fit_model"
description = "Fit the model (slow)."
delay_seconds = {delay}
results = ["fitted"]

[[steps]]
tool_calls = [{{ name = "count_rows" }}]

[[steps]]
tool_calls = [{{ name = "fit_model" }}]

[[steps]]
text = "Fitted."

[expect]
exit_reason = "completed"
cause = "model.end_turn"
turns = 3
"""


def slow_scenario(tmp_path: Path, delay: float) -> tuple[Scenario, Path]:
    text = SLOW.format(delay=delay)
    path = tmp_path / "slow.toml"
    path.write_text(text)
    return parse_scenario(text, source=str(path), name="slow"), path


def settings_for(server: NatsServer, **overrides: float) -> ClusterSettings:
    return ClusterSettings(nats_url=server.url, **overrides)  # type: ignore[arg-type]


@asynccontextmanager
async def fleet(
    settings: ClusterSettings, count: int, **options: object
) -> AsyncIterator[list[ClusterNode]]:
    nodes = [
        ClusterNode(Config(), settings, name=f"d{i}", **options)  # type: ignore[arg-type]
        for i in range(count)
    ]
    async with AsyncExitStack() as stack:
        for node in nodes:
            await stack.enter_async_context(node.running())
        yield nodes


async def wait_until(node: ClusterNode, run_ids: set[str], *statuses: str) -> dict[str, str]:
    """Watch ``runstate`` until every run in ``run_ids`` has one of ``statuses``; their owners."""
    watcher = await node.buckets.state.watchall()
    owners: dict[str, str] = {}
    try:
        async for entry in watcher:
            if entry is None or entry.value is None or entry.key not in run_ids:
                continue
            state = msgspec.json.decode(entry.value)
            if state["status"] in statuses:
                owners[entry.key] = state["owner"]
            else:
                owners.pop(entry.key, None)
            if len(owners) == len(run_ids):
                return owners
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    raise AssertionError("the watch ended")


async def all_events(node: ClusterNode) -> dict[str, list[tuple[int, str]]]:
    """Every stored event of every run: (stream sequence, type) by run id."""
    settings = node.settings
    info = await node.js.stream_info(settings.events_stream)
    total = info.state.messages
    runs: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    if not total:
        return runs
    sub = await node.js.subscribe(
        settings.events_subject("*"),
        stream=settings.events_stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    for _ in range(total):
        msg = await sub.next_msg(timeout=10)
        run_id = msg.subject.split(".")[-2]
        runs[run_id].append((msg.metadata.sequence.stream, (msg.headers or {})["Loopfuse-Type"]))
    await sub.unsubscribe()
    return runs


def assert_each_ended_once(events: dict[str, list[tuple[int, str]]], run_ids: set[str]) -> None:
    assert set(events) == run_ids
    for run_id, stream in events.items():
        kinds = [kind for _, kind in stream]
        assert kinds.count("RunFinished") == 1, (run_id, kinds)
        assert kinds[-1] == "RunFinished", (run_id, kinds)
        assert kinds[0] == "RunStarted", (run_id, kinds)


@pytest.mark.asyncio
async def test_300_runs_round_robin_on_three_daemons_each_end_once_as_expected(
    server: NatsServer,
) -> None:
    scenarios = {name: find_scenario(name) for name in QUICK}
    async with fleet(settings_for(server), 3) as nodes:
        with anyio.fail_after(120):
            expected: dict[str, str] = {}
            for i in range(300):
                name = QUICK[i % len(QUICK)]
                state, new = await nodes[i % 3].submit(RunRequest(scenario=name))
                assert new
                expected[state.run_id] = name
            await wait_until(nodes[0], set(expected), "ended")
            for run_id, name in expected.items():
                state = await nodes[(hash(run_id)) % 3].state(run_id)
                wanted = scenarios[name].expect
                assert (state.exit_reason, state.cause) == (
                    wanted.exit_reason.value if wanted.exit_reason else None,
                    wanted.cause,
                ), (name, state)
                assert state.attempts == 1
            for node in nodes:
                await node.wait_idle()
            stats = [node.statistics() for node in nodes]
            assert sum(s.taken for s in stats) == 300
            assert sum(s.finished for s in stats) == 300
            assert all(s.taken > 0 for s in stats), stats  # the work was shared
            assert_each_ended_once(await all_events(nodes[1]), set(expected))
            depth = await nodes[2].js.consumer_info(nodes[2].settings.runs_stream, "workers")
            assert depth.num_pending == 0
            assert depth.num_ack_pending == 0


@pytest.mark.asyncio
async def test_the_listing_is_every_run_the_bucket_holds(server: NatsServer) -> None:
    """The fleet's listing takes the keys from the bucket's stream (not nats-py's key
    watcher, which can end before the entries it holds: nats-io/nats.py#842): an empty
    bucket lists nothing, every run just submitted is listed at once, a deleted entry not."""
    async with fleet(settings_for(server), 1, pull=False) as (node,):
        with anyio.fail_after(30):
            assert await node.states() == []
            submitted = [
                (await node.submit(RunRequest(scenario="completed")))[0].run_id for _ in range(3)
            ]
            assert sorted(state.run_id for state in await node.states()) == sorted(submitted)
            await node.buckets.state.delete(submitted[0])
            listed = {state.run_id for state in await node.states()}
    assert listed == set(submitted[1:])


@pytest.mark.asyncio
async def test_a_bucket_past_one_answer_of_subjects_lists_every_key(server: NatsServer) -> None:
    """NATS answers ``STREAM.INFO`` with at most 100,000 subjects; the listing pages on, so a
    bucket holding more lists every key; a bucket that does not exist is an answer
    (``NotFoundError``, not retried), not an empty list."""
    count = 100_050
    nc = await nats.connect(server.url)
    try:
        with anyio.fail_after(60):
            js = nc.jetstream()
            await js.create_key_value(KeyValueConfig(bucket="many", history=1))
            for index in range(count - 1):  # core publishes: no ack round trip per key
                await nc.publish(f"$KV.many.k{index}", b"")
            # The stream stores one connection's messages in order: the last one's ack says
            # every key before it is stored.
            last = await js.publish(f"$KV.many.k{count - 1}", b"")
            assert last.seq == count
            keys = await bucket_keys(nc, "many")
            with pytest.raises(NotFoundError):
                await bucket_keys(nc, "absent")
    finally:
        await nc.close()
    assert len(keys) == count
    assert set(keys) == {f"k{index}" for index in range(count)}


@pytest.mark.asyncio
async def test_live_nodes_are_the_heartbeats_the_bucket_holds(server: NatsServer) -> None:
    """The fleet gauge counts the nodes bucket's current entries (from its stream's subjects,
    not nats-py's key watcher): a node's deleted heartbeat is not a live node."""
    from orchestrator.cluster.metrics import fleet_snapshot

    # Heartbeats every 200 s: none puts the deleted entry back while the test looks.
    async with fleet(settings_for(server, node_ttl_seconds=600), 2, pull=False) as nodes:
        with anyio.fail_after(30):
            assert (await fleet_snapshot(nodes[0])).live_nodes == 2
            await nodes[0].buckets.nodes.delete(nodes[1].name)
            assert (await fleet_snapshot(nodes[0])).live_nodes == 1


@pytest.mark.asyncio
async def test_a_duplicate_submission_is_one_run(server: NatsServer) -> None:
    async with fleet(settings_for(server), 2) as nodes:
        with anyio.fail_after(30):
            request = RunRequest(scenario="completed", idempotency_key="order-42")
            results: list[tuple[str, bool]] = []

            async def submit(node: ClusterNode) -> None:
                state, new = await node.submit(request)
                results.append((state.run_id, new))

            async with anyio.create_task_group() as tg:
                for node in (*nodes, *nodes):
                    tg.start_soon(submit, node)
            assert len({run_id for run_id, _ in results}) == 1
            assert sorted(new for _, new in results) == [False, False, False, True]
            run_id = results[0][0]
            await wait_until(nodes[0], {run_id}, "ended")
            state, new = await nodes[1].submit(request)  # after the end: still that run
            assert (state.run_id, new, state.status) == (run_id, False, "ended")
            with pytest.raises(ClusterError) as refused:
                await nodes[0].submit(RunRequest(scenario="max_turns", idempotency_key="order-42"))
            assert refused.value.status == 409
            assert_each_ended_once(await all_events(nodes[0]), {run_id})
            assert sum(node.statistics().taken for node in nodes) == 1


@pytest.mark.asyncio
async def test_abort_through_a_daemon_that_does_not_own_the_run(
    server: NatsServer, tmp_path: Path
) -> None:
    slow, _ = slow_scenario(tmp_path, 60.0)
    settings = settings_for(server)
    worker = ClusterNode(Config(), settings, name="worker", scenarios=[slow])
    api = ClusterNode(Config(), settings, name="api", scenarios=[slow], pull=False)
    async with worker.running(), api.running():
        with anyio.fail_after(30):
            state, _ = await api.submit(RunRequest(scenario="slow"))
            async for event in api.events(state.run_id):
                if event.type == "ToolExecute" and b"fit_model" in event.data:
                    break
            assert (await api.state(state.run_id)).owner == "worker"
            await api.abort(state.run_id)
            kinds = [event.type async for event in api.events(state.run_id)]
            assert kinds[-1] == "RunFinished"
            ended = await wait_until(api, {state.run_id}, "ended")
            assert ended == {state.run_id: "worker"}
            final = await api.state(state.run_id)
            assert (final.exit_reason, final.cause) == ("aborted_tools", "abort.caller")
            with pytest.raises(ClusterError) as refused:
                await api.abort(state.run_id)
            assert refused.value.status == 409


@pytest.mark.asyncio
async def test_events_resume_on_another_daemon_without_gaps_or_duplicates(
    server: NatsServer,
) -> None:
    async with fleet(settings_for(server), 3) as (a, b, c):
        with anyio.fail_after(30):
            state, _ = await a.submit(RunRequest(scenario="max_turns"))
            first: list[int] = []
            async for event in b.events(state.run_id):  # live, from the start
                first.append(event.seq)
                if len(first) == 5:
                    break
            rest = [event.seq async for event in c.events(state.run_id, after=first[-1])]
            whole = [event.seq async for event in a.events(state.run_id)]
            assert first + rest == whole
            assert whole == sorted(set(whole))
            past_the_end = [event async for event in b.events(state.run_id, after=whole[-1])]
            assert past_the_end == []


def start_worker(server: NatsServer, scenario_file: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cluster",
            "--nats",
            server.url,
            "--name",
            "doomed",
            "--scenario",
            str(scenario_file),
            "--ack-wait",
            "2",
            "--node-ttl",
            "2",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().startswith("ready doomed")
    return process


@pytest.mark.asyncio
async def test_a_daemon_killed_with_sigkill_loses_no_run(
    server: NatsServer, tmp_path: Path
) -> None:
    slow, path = slow_scenario(tmp_path, 3.0)
    settings = settings_for(server, ack_wait_seconds=2.0, node_ttl_seconds=2.0)
    process = start_worker(server, path)
    try:
        api = ClusterNode(Config(), settings, name="api", scenarios=[slow], pull=False)
        async with api.running():
            with anyio.fail_after(60):
                resumed: set[str] = set()
                crashed: set[str] = set()
                for on_crash, ids in (("resume", resumed), ("abort", crashed)):
                    for _ in range(3):
                        request = RunRequest(scenario="slow", config={"on_crash": on_crash})
                        ids.add((await api.submit(request))[0].run_id)
                for run_id in resumed | crashed:  # all busy in their slow tool, after turn 1
                    async for event in api.events(run_id):
                        if event.type == "ToolExecute" and b"fit_model" in event.data:
                            break
                owners = await wait_until(api, resumed | crashed, "running")
                assert set(owners.values()) == {"doomed"}
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                heir = ClusterNode(Config(), settings, name="heir", scenarios=[slow])
                async with heir.running():
                    owners = await wait_until(api, resumed | crashed, "ended")
                    assert set(owners.values()) == {"heir"}
                    await heir.wait_idle()
                    stats = heir.statistics()
                    assert (stats.resumed, stats.crash_ended, stats.finished) == (3, 3, 6)
                    # a delivery seen before the dead owner's key expired is a conflict,
                    # not run, and delivered again
                    assert stats.redelivered == 6 + stats.ownership_conflicts
                for run_id in resumed:
                    state = await api.state(run_id)
                    assert (state.exit_reason, state.attempts) == ("completed", 2)
                    assert state.result is not None
                    assert state.result["turns"] == 3  # turn 1 was not done again
                for run_id in crashed:
                    state = await api.state(run_id)
                    assert (state.exit_reason, state.cause) == ("aborted_tools", "abort.crash")
                events = await all_events(api)
                assert_each_ended_once(events, resumed | crashed)
                for run_id in resumed:
                    kinds = [kind for _, kind in events[run_id]]
                    assert kinds.count("RunStarted") == 2  # the first life and the resumed one
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


@pytest.mark.asyncio
async def test_a_nats_restart_during_runs_loses_nothing_accepted(
    server: NatsServer, tmp_path: Path
) -> None:
    slow, _ = slow_scenario(tmp_path, 1.0)
    async with fleet(settings_for(server), 2, scenarios=[slow]) as nodes:
        with anyio.fail_after(60):
            run_ids = {
                (await nodes[i % 2].submit(RunRequest(scenario="slow")))[0].run_id for i in range(6)
            }
            await wait_until(nodes[0], run_ids, "running")
            server.stop()
            late: list[str] = []

            async def submit_while_down() -> None:
                late.append((await nodes[1].submit(RunRequest(scenario="completed")))[0].run_id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(submit_while_down)
                await anyio.to_thread.run_sync(server.start)
            run_ids.update(late)
            await wait_until(nodes[0], run_ids, "ended")
            for run_id in run_ids:
                state = await nodes[0].state(run_id)
                assert state.exit_reason == "completed", state
            assert_each_ended_once(await all_events(nodes[0]), run_ids)


@pytest.mark.asyncio
async def test_fleet_metrics_come_from_one_daemon_and_node_metrics_sum(
    server: NatsServer,
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from orchestrator.cluster.metrics import FleetCollector, NodeCollector

    def scrape(registry: CollectorRegistry) -> dict[str, float]:
        text = generate_latest(registry).decode()
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async with fleet(settings_for(server), 2, pull=False) as nodes:
        with anyio.fail_after(30):
            registries, collectors = [], []
            for node in nodes:
                registry = CollectorRegistry()
                registry.register(NodeCollector(node))
                collector = FleetCollector(node)
                registry.register(collector)
                registries.append(registry)
                collectors.append(collector)
            for i in range(5):
                await nodes[i % 2].submit(RunRequest(scenario="completed"))
            await nodes[0].submit(RunRequest(scenario="completed", idempotency_key="k"))
            await nodes[1].submit(RunRequest(scenario="completed", idempotency_key="k"))
            for collector in collectors:
                await collector.refresh()
            scrapes = [scrape(registry) for registry in registries]
            assert sorted(s["loopfuse_cluster_fleet_reporter"] for s in scrapes) == [0, 1]
            reporter = next(s for s in scrapes if s["loopfuse_cluster_fleet_reporter"] == 1)
            other = next(s for s in scrapes if s["loopfuse_cluster_fleet_reporter"] == 0)
            assert reporter["loopfuse_cluster_fleet_queue_depth_runs"] == 6  # no daemon pulls
            assert reporter["loopfuse_cluster_fleet_live_nodes"] == 2
            assert "loopfuse_cluster_fleet_queue_depth_runs" not in other
            total = sum(s["loopfuse_cluster_node_submitted_runs_total"] for s in scrapes)
            assert total == 6
            duplicates = sum(
                s["loopfuse_cluster_node_duplicate_submissions_total"] for s in scrapes
            )
            assert duplicates == 1
            for collector in collectors:  # the lease stays where it is
                await collector.refresh()
            assert [c.reporting for c in collectors] == [
                s["loopfuse_cluster_fleet_reporter"] == 1 for s in scrapes
            ]


@pytest.mark.asyncio
async def test_an_abort_whose_message_was_missed_is_caught_from_the_run_state(
    server: NatsServer, tmp_path: Path
) -> None:
    slow, _ = slow_scenario(tmp_path, 60.0)
    settings = settings_for(server, ack_wait_seconds=0.6)
    async with fleet(settings, 1, scenarios=[slow]) as (node,):
        with anyio.fail_after(30):
            state, _ = await node.submit(RunRequest(scenario="slow"))
            async for event in node.events(state.run_id):
                if event.type == "ToolExecute" and b"fit_model" in event.data:
                    break
            entry = await node.buckets.state.get(state.run_id)  # the state change alone
            assert entry.value is not None
            current = msgspec.json.decode(entry.value)
            await node.buckets.state.update(
                state.run_id,
                msgspec.json.encode({**current, "status": "aborting"}),
                last=entry.revision,
            )
            await wait_until(node, {state.run_id}, "ended")
            final = await node.state(state.run_id)
            assert (final.exit_reason, final.cause) == ("aborted_tools", "abort.caller")


@pytest.mark.asyncio
async def test_a_run_that_cannot_start_ends_after_its_last_delivery(
    server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fleet(settings_for(server, max_deliver=2, ack_wait_seconds=1.0), 1) as (node,):

        async def broken_start(*args: object, **kwargs: object) -> object:
            raise RuntimeError("cannot start")

        monkeypatch.setattr(starting, "start_scenario", broken_start)
        with anyio.fail_after(30):
            state, _ = await node.submit(RunRequest(scenario="completed"))
            await wait_until(node, {state.run_id}, "ended")
            ended = await node.state(state.run_id)
    assert (ended.exit_reason, ended.cause) == ("hook_stopped", "internal.error")
    assert ended.result is not None
    assert "cannot start" in ended.result["detail"]
    assert ended.attempts == 2
