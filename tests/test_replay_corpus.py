"""The committed real-model corpus (``bench/real_corpus``, issue #29): each recorded run
replayed under its own config reproduces its recorded decisions call by call, and
``loopfuse replay`` prints the three-preset table over it (docs/replay.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Final

import anyio
import pytest

from bench.real_corpus import CORPUS, replay_overrides
from bench.real_model import CONFIGURATIONS, REAL_TASKS
from orchestrator.config import Config
from orchestrator.replay.player import play
from orchestrator.replay.report import compare
from orchestrator.replay.sources import load_recordings
from tests.cli_support import loopfuse

FILES: Final = sorted(CORPUS.glob("*.json"))
PRESETS: Final = ("strict", "gemini", "off")
"""The table's presets: the default (``strict``), another, and the fuses off."""


def test_the_corpus_holds_every_task_under_both_configurations() -> None:
    names = {path.name for path in FILES}
    assert names == {
        f"{task.name}.{preset}.json" for task in REAL_TASKS for preset in CONFIGURATIONS
    }
    # every event of each run, as the event log keeps it: about 0.7 MB in all
    assert sum(path.stat().st_size for path in FILES) < 750_000
    for path in FILES:
        document = json.loads(path.read_text())
        preset = path.stem.split(".")[1]
        assert document["name"] == path.stem
        assert document["config"] == replay_overrides(preset)  # the real run's settings


@pytest.mark.asyncio
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
async def test_own_config_replay_reproduces_every_recorded_decision(path: Path) -> None:
    (recording,) = load_recordings([str(path)])
    assert recording.ending is not None
    with anyio.fail_after(60):
        played = await play(Config(), recording, beyond="end")
    result = played.result
    # call by call: each call's verdict (allow, warn, block, not run) and tool ...
    assert tuple(e.verdict for e in result.call_log) == recording.verdicts
    # ... every warning, refusal and nudge at the same turn and call, and the same first stop
    assert played.decisions == recording.decisions
    # the same ending: reason, cause, requests, tool calls, the call it stopped at
    ending = recording.ending
    assert (result.exit_reason.value, result.cause) == (ending.exit_reason, ending.cause)
    assert (result.llm_requests, result.tool_calls) == (ending.llm_requests, ending.tool_calls)
    assert result.usage == ending.usage
    assert played.extrapolated == 0
    row = compare(recording, played, "own")
    assert (row.change, row.verdicts_match) == ("same", True)
    assert row.stop_call == ending.stopped_at_call


ROW: Final = re.compile(
    r"^\| (?P<run>[a-z_]+\.(default|off)) \| (?P<config>[a-z]+) \| (?P<recorded>\S+ @ \d+) "
    r"\| (?P<replayed>\S+ @ \d+)(?: \(\+\d+ past the recording\))? \| (?P<stop>\d+|-) "
    r"\| (?P<change>[a-z]+) \| (?P<requests>[+-]\d+) \| (?P<tokens>[+-]\d+) \| \S+ \|$"
)
TOTAL: Final = re.compile(
    r"^\| (?P<config>[a-z]+) \| (?P<cause>[a-z_.]+) \| (?P<runs>\d+) \| (?P<missed>\d+) "
    r"\| (?P<requests>[+-]\d+) \| (?P<tokens>[+-]\d+) \| \S+ \|$"
)


def test_the_command_prints_the_three_preset_table() -> None:
    root = CORPUS.parents[1]
    args = ["replay", "bench/real_corpus"]
    for preset in PRESETS:
        args += ["--preset", preset]
    done = loopfuse(*args, "--markdown", cwd=root, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [m for line in lines if (m := ROW.match(line))]
    totals = [m for line in lines if (m := TOTAL.match(line))]
    assert len(rows) == len(FILES) * len(PRESETS)
    assert [m["config"] for m in rows] == [p for _ in FILES for p in PRESETS]
    # a recording replayed under the preset it ran with ends as it did
    for m in rows:
        own = m["run"].split(".")[1] == {"strict": "default", "off": "off"}.get(m["config"])
        if own:
            assert m["change"] == "same", m.group(0)
            assert m["recorded"] == m["replayed"]
    for preset in PRESETS:
        mine = [m for m in rows if m["config"] == preset]
        sums = [m for m in totals if m["config"] == preset]
        assert sum(int(m["runs"]) for m in sums) == len(FILES)
        assert sum(int(m["requests"]) for m in sums) == sum(int(m["requests"]) for m in mine)
        assert sum(int(m["tokens"]) for m in sums) == sum(int(m["tokens"]) for m in mine)
        assert sum(int(m["missed"]) for m in sums) == sum(m["change"] == "missed" for m in mine)
    # the table in docs/replay.md is this one
    docs = (root / "docs" / "replay.md").read_text()
    assert done.stdout in docs
