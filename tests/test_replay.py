"""``loopfuse replay``: own-config replays reproduce every shipped agent scenario's verdicts,
a looser config's missed stops, OpenAI transcripts, and the command line's input errors."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from bus import ENCODER, ToolSpec, for_the_log
from orchestrator.cli import main
from orchestrator.config import Config
from orchestrator.replay.player import play, replay_registry
from orchestrator.replay.recording import Recording, recording_from_events
from orchestrator.replay.report import compare
from orchestrator.replay.sources import recording_from_jsonl
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario, find_scenario, shipped_scenarios

CLOCK_OR_CALLER: dict[str, str] = {
    "deadline": "budget.deadline is wall-clock time; a replay does not wait out latencies",
}
"""Scenarios whose ending is not the monitors' to reproduce (docs/replay.md); their call
verdicts are still compared."""

AGENT_SCENARIOS = [s for s in shipped_scenarios() if s.pipeline is None]


async def _record(scenario: Scenario) -> tuple[RunResult, Recording, bytes]:
    async with Runtime(Config(), scenarios=[scenario]) as runtime:
        handle = await start_scenario(runtime, scenario)
        result = await handle.result()
        events = runtime.event_log.events(handle.run_id)
    jsonl = b"".join(ENCODER.encode(for_the_log(msg)) + b"\n" for msg in events)
    return result, recording_from_events(scenario.name, events, overrides=scenario.config), jsonl


@pytest.mark.asyncio
@pytest.mark.parametrize("scenario", AGENT_SCENARIOS, ids=lambda s: s.name)
async def test_own_config_replay_reproduces_every_verdict(scenario: Scenario) -> None:
    recorded, recording, jsonl = await _record(scenario)
    with anyio.fail_after(60):
        played = await play(Config(), recording)
    replayed = played.result
    assert [e.verdict for e in replayed.call_log] == [e.verdict for e in recorded.call_log]
    assert [e.tool for e in replayed.call_log] == [e.tool for e in recorded.call_log]
    assert recording.verdicts == tuple(e.verdict for e in recorded.call_log)
    # the logged form (JSONL, as the store holds it) reads back to the same recording
    assert recording_from_jsonl(scenario.name, jsonl).answers == recording.answers
    # every warning, refusal and nudge, in order, at the same turn and call
    kept = ("verdict", "nudge")
    assert [d for d in played.decisions if d[0] in kept] == [
        d for d in recording.decisions if d[0] in kept
    ]
    if scenario.name in CLOCK_OR_CALLER:
        return
    assert played.decisions == recording.decisions  # and the same first stop
    assert (replayed.exit_reason, replayed.cause) == (recorded.exit_reason, recorded.cause)
    assert replayed.llm_requests == recorded.llm_requests
    assert replayed.tool_calls == recorded.tool_calls
    assert played.extrapolated == 0
    assert compare(recording, played, "own").change == "same"


@pytest.mark.asyncio
async def test_a_stuck_run_replayed_with_the_fuses_off_reports_the_missed_stop() -> None:
    scenario = find_scenario("dead_loop")  # stopped at request 5 by loop.generic_repeat
    recorded, recording, _ = await _record(scenario)
    with anyio.fail_after(60):
        played = await play(Config(), recording, overrides={"loop_preset": "off"})
    row = compare(recording, played, "off")
    assert row.change == "missed"
    assert row.recorded_cause == "loop.generic_repeat"
    assert row.cause == "budget.max_turns"  # it loops on to max_turns = 20
    assert row.requests == 20
    assert row.requests_delta == 20 - recorded.llm_requests
    assert row.extrapolated == 20 - recorded.llm_requests
    assert row.tokens_delta > 0


TRANSCRIPT = {
    "messages": [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "List the files and summarise the risks."},
        *[
            message
            for n in range(1, 7)
            for message in (
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"c{n}",
                            "type": "function",
                            "function": {"name": "list_dir", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": f"c{n}", "content": "a.txt\nb.txt"},
            )
        ],
        {"role": "assistant", "content": "Two files."},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "list_dir",
                "description": "List a folder.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ],
}


@pytest.mark.asyncio
async def test_an_openai_transcript_is_replayed_under_each_preset(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(TRANSCRIPT))
    from orchestrator.replay.sources import load_recordings

    (recording,) = load_recordings([str(path)])
    assert recording.task == "List the files and summarise the risks."
    strict = await play(
        Config(), recording, overrides={"loop_preset": "strict", "cache_max_entries": 0}
    )
    off = await play(Config(), recording, overrides={"loop_preset": "off", "cache_max_entries": 0})
    assert strict.result.cause.startswith("loop.")
    assert strict.result.llm_requests < 7
    assert off.result.cause == "model.end_turn"  # nothing stops it: the transcript's end
    assert off.result.llm_requests == 7
    assert compare(recording, off, "off").change == "new"


def test_the_command_prints_a_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(TRANSCRIPT))
    assert main(["replay", str(path), "--preset", "strict", "--preset", "off"]) == 0
    table = capsys.readouterr().out
    assert "| chat.json | strict |" in table
    assert "| chat.json | off |" in table
    assert main(["replay", str(tmp_path), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [row["config"] for row in document["rows"]] == ["own"]
    assert document["totals"][0]["runs"] == 1


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("bad.json", "{", "not JSON"),
        ("empty.json", "{}", "no 'messages' list"),
        ("nouser.json", '{"messages": [{"role": "assistant", "content": "x"}]}', "no user message"),
        ("bad.jsonl", '{"type": "Nope"}\n', "line 1: not a run event"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str, says: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    assert main(["replay", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert says in captured.err
    assert "Traceback" not in captured.err


def test_a_missing_path_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["replay", str(tmp_path / "nothing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_a_dangling_link_in_a_folder_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    assert main(["replay", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "gone.jsonl: No such file or directory" in err
    assert "Traceback" not in err


def test_the_readme_example_runs_as_written(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    readme = (root / "README.md").read_text()
    block = readme.split("(docs/replay.md)):\n\n```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].split() for line in block.strip().splitlines()]
    assert len(lines) == 5
    for words in lines:
        assert words[0] == "loopfuse"
        assert main(words[1:]) == 0, words
    out = capsys.readouterr().out
    assert "| stuck_poll.json | strict | - | loop.generic_repeat @ 5 |" in out
    assert "| stuck_poll.json | off | - | model.end_turn @ 7 |" in out


def test_config_after_the_subcommand_is_the_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcript = tmp_path / "chat.json"
    transcript.write_text(json.dumps(TRANSCRIPT))
    config = tmp_path / "loopfuse.toml"
    config.write_text("[budget]\nmax_turns = 3\n")
    assert main(["replay", str(transcript), "--preset", "off", "--config", str(config)]) == 0
    assert "| chat.json | off | - | budget.max_turns @ 3 |" in capsys.readouterr().out


PIPELINE_SCENARIOS = [s for s in shipped_scenarios() if s.pipeline is not None]


@pytest.mark.asyncio
@pytest.mark.parametrize("scenario", PIPELINE_SCENARIOS, ids=lambda s: s.name)
async def test_each_stage_run_of_a_pipeline_replays_with_its_verdicts(scenario: Scenario) -> None:
    # A pipeline is several runs (one per agent stage, ``<id>.<stage>``): each is replayed
    # on its own; the pipeline's own log holds only its progress (docs/replay.md).
    async with Runtime(Config(), scenarios=[scenario]) as runtime:
        handle = await start_scenario(runtime, scenario)
        await handle.result()
        stages = dict.fromkeys(
            stage
            for msg in runtime.event_log.events(handle.run_id)
            if (stage := getattr(msg, "stage", None))
        )
        logs = {s: runtime.event_log.events(f"{handle.run_id}.{s}") for s in stages}
    recordings = [recording_from_events(s, events) for s, events in logs.items() if events]
    assert [r.name for r in recordings][:2] == ["explore", "draft"]
    for recording in recordings:
        with anyio.fail_after(60):
            played = await play(Config(), recording)
        assert recording.ending is not None
        assert tuple(e.verdict for e in played.result.call_log) == recording.verdicts
        assert played.decisions == recording.decisions
        assert (played.result.cause, played.result.llm_requests) == (
            recording.ending.cause,
            recording.ending.llm_requests,
        )
        assert compare(recording, played, "own").change == "same"


def test_a_listed_folder_is_recreated_by_name_only(tmp_path: Path) -> None:
    from orchestrator.replay import player

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    listing = "../escape, a/b, ok.txt, sub/ (and 3 more)"
    assert player._recreate_folder(listing, scratch) == str(scratch)
    names = sorted(p.name for p in scratch.iterdir())
    assert names[:2] == ["ok.txt", "sub"]
    assert (scratch / "sub").is_dir()
    assert len(names) == 2 + 3  # the "more" are placeholders sorted after the shown names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch"]  # nothing outside
    assert player._recreate_folder(None, scratch) is None
    for listing, placeholders in (
        ("a (and 3x more)", 0),
        ("b (and ² more)", 0),
        ("c (and 9" + "9" * 40 + " more)", 1_000),
    ):
        folder = tmp_path / listing[0]
        folder.mkdir()
        assert player._recreate_folder(listing, folder) == str(folder)
        assert len(list(folder.iterdir())) == 1 + placeholders


def test_a_recorded_tool_whose_schema_is_not_valid_still_replays() -> None:
    """A recording may predate the schema check: its tool is offered with an open schema."""
    for parameters in ('{"type": "object", "required": 5}', '{"type": "object", "$schema": []}'):
        bad = ToolSpec(name="f", description="", parameters=parameters)
        registry = replay_registry(Recording(name="r", task="t", tools=(bad,)))
        assert registry.names() == ("f",)
        open_schema = {"type": "object", "properties": {}}
        assert json.loads(registry.specs()[0].parameters) == open_schema
