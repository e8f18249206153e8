"""Scenario folders: written once per runtime, shared read-only by a scenario's runs,
removed when the runtime stops; a pipeline keeps a folder of its own."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import pytest

from bus import Progress, RunStarted
from orchestrator.runtime import Runtime
from orchestrator.runtime.folders import SharedFolders
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}


def _tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: its text and permission bits."""
    return {
        str(path.relative_to(root)): (path.read_text(), stat.S_IMODE(path.stat().st_mode))
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _gone(*paths: Path) -> bool:
    return not any(path.exists() for path in paths)


@pytest.mark.asyncio
async def test_concurrent_runs_of_a_scenario_share_one_read_only_folder() -> None:
    scenario = SHIPPED["completed"]
    async with Runtime() as runtime:
        handles = [await start_scenario(runtime, scenario) for _ in range(20)]
        with anyio.fail_after(30):
            results = [await handle.result() for handle in handles]
        folders = set()
        for handle in handles:
            async for event in handle.events():
                if isinstance(event, RunStarted):
                    folders.add(event.folder)
                    break
        assert len(folders) == 1
        root = Path(folders.pop() or "")
        assert _tree(root) == {name: (text, 0o444) for name, text in scenario.folder.items()}
        for directory, _, _ in os.walk(root):
            assert stat.S_IMODE(os.stat(directory).st_mode) == 0o555
        again = await start_scenario(runtime, scenario)
        await again.result()
        assert _tree(root) == {name: (text, 0o444) for name, text in scenario.folder.items()}
    assert all(expectation_mismatches(scenario, result) == [] for result in results)
    assert _gone(root, root.parent)


@pytest.mark.asyncio
async def test_a_folder_is_written_once_however_many_runs_ask_at_once() -> None:
    folders = SharedFolders()
    files = {"a.txt": "one", "sub/b.txt": "two"}
    paths: list[str] = []

    async def ask() -> None:
        paths.append(await folders.folder("x", files))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(ask)
    assert len(set(paths)) == 1
    root = Path(paths[0])
    assert sorted(p.name for p in root.parent.iterdir()) == [root.name]
    changed = await folders.folder("x", {"a.txt": "other"})
    assert changed != paths[0]
    assert _tree(Path(changed)) == {"a.txt": ("other", 0o444)}
    assert _tree(root)["sub/b.txt"] == ("two", 0o444)
    folders.close()
    assert _gone(root.parent)


@pytest.mark.asyncio
async def test_an_entry_outside_the_folder_is_refused_and_nothing_is_kept() -> None:
    folders = SharedFolders()
    with pytest.raises(ValueError, match="points outside the folder"):
        await folders.folder("bad", {"../escape.txt": "x"})
    assert "bad" not in str(await folders.folder("good", {"a.txt": "ok"})).split("/")[-2:]
    folders.close()


@pytest.mark.asyncio
async def test_a_pipeline_scenario_gets_a_folder_of_its_own() -> None:
    scenario = SHIPPED["report"]
    async with Runtime() as runtime:
        handles = [await start_scenario(runtime, scenario) for _ in range(2)]
        written: list[str] = []
        with anyio.fail_after(60):
            results = [await handle.result() for handle in handles]
            for handle in handles:
                async for event in handle.events():
                    if isinstance(event, Progress) and event.detail.startswith("wrote "):
                        written.append(event.detail.split()[1])
    assert all(expectation_mismatches(scenario, result) == [] for result in results)
    assert len(written) == 2
    assert written[0] != written[1]  # each in a folder of its own
    assert _gone(*(Path(report).parent for report in written))  # removed at the end
