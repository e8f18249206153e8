"""Issue #32's acceptance corpus, every scenario under every loop preset.

A legitimate run (``orchestrator/scenarios/corpus/legit``) completes with no loop verdict:
no warning, refusal, loop nudge or loop stop. A stuck run (``…/stuck``) is stopped with a
``loop.`` cause before its 21st call. Where a preset is documented to differ
(docs/loop-detection.md, "The acceptance corpus"), :data:`DIFFERS` says how, per preset and
kind; the cases today's code still fails are in :data:`XFAIL`, one entry per (scenario,
preset) with the part of issue #32 that fixes it: delete an entry when its fix lands
(``xfail_strict``: a case that passes while still listed fails the suite).

Every run plays in process on one runtime (``play_corpus``), once per module.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Final, NamedTuple

import anyio
import msgspec
import pytest

from actors.loop import PRESETS
from bench.corpus_play import STOP_BY, Outcome, play_corpus
from bench.waste import main as waste_main
from orchestrator.scenarios.corpus import CorpusRun, corpus
from tests.corpus_generate import main as generate_main

RUNS: Final = corpus()
KINDS: Final = frozenset(run.kind for run in RUNS)


class Differs(NamedTuple):
    """How a preset differs on a kind of run, and why (each stated in the docs).

    ``legit_may``: the loop verdicts a legitimate run may get (``warn``, ``refuse``,
    ``stop``). ``stop_by``: the call by which a stuck run must be stopped; ``None``: the
    preset has no rule for it (a run it refuses must still end with a ``loop.`` cause).
    """

    reason: str
    legit_may: frozenset[str] = frozenset()
    stop_by: int | None = STOP_BY


_OC_GENERIC: Final = Differs(
    "OpenClaw's generic repeat warns at the 11th identical call in its window whatever the "
    "results (upstream; a nudge, never a refusal)",
    legit_may=frozenset({"warn"}),
)
_OC_PING_PONG: Final = Differs(
    "OpenClaw's ping-pong warns at the 10th alternating call whatever the results (upstream)",
    legit_may=frozenset({"warn"}),
)
_OC_BREAKER: Final = Differs(
    "OpenClaw's thresholds: the first refusal or stop of a repeat is at the 21st call; the "
    "global breaker stops the 31st identical call (the 32nd when two come per reply)",
    stop_by=32,
)
_OC_BLIND: Final = Differs(
    "OpenClaw's detectors see identical calls and two-call ping-pong only: no rule for a "
    "rotation of different calls or a rephrasing (argument churn is not reproduced)",
    stop_by=None,
)
DIFFERS: Final[dict[tuple[str, str], Differs]] = {
    ("strict", "legit.retry"): Differs(
        "strict nudges the 3rd identical call after two identical results (seed 000): a "
        "call retried twice after the same error gets that nudge, never a stop",
        legit_may=frozenset({"warn"}),
    ),
    ("openclaw", "legit.poll"): _OC_GENERIC,
    ("openclaw-current", "legit.poll"): _OC_GENERIC,
    ("openclaw", "legit.alternating"): _OC_PING_PONG,
    ("openclaw-current", "legit.alternating"): _OC_PING_PONG,
    ("gemini", "legit.alternating"): Differs(
        "gemini's cycle detector ignores results, as upstream: two calls in turn are struck "
        "at the 10th call and stopped at the 11th even while their results change",
        legit_may=frozenset({"warn", "refuse", "stop"}),
    ),
    ("openclaw", "stuck.poll"): _OC_BREAKER,
    ("openclaw", "stuck.identical"): _OC_BREAKER,
    ("openclaw-current", "stuck.poll"): _OC_BREAKER,
    ("openclaw-current", "stuck.identical"): _OC_BREAKER,
    ("openclaw", "stuck.rotation"): _OC_BLIND,
    ("openclaw", "stuck.rephrased"): _OC_BLIND,
    ("openclaw-current", "stuck.rotation"): _OC_BLIND,
    ("openclaw-current", "stuck.rephrased"): _OC_BLIND,
    ("gemini", "stuck.rotation"): Differs(
        "gemini's cycles are periods of 2-5 repeated 5 times in the last 25 calls: a period "
        "of 4 is stopped at the 21st call, 5 at the 26th, a longer one never",
        stop_by=None,
    ),
    ("gemini", "stuck.rephrased"): Differs(
        "gemini-cli has no rule for different calls returning one result", stop_by=None
    ),
}

XFAIL: Final[dict[tuple[str, str], str]] = {}
"""The cases today's code fails, with the fix each waits for (none today); an entry
that passes fails the test, so the table cannot go stale."""


def _cases() -> list[pytest.ParameterSet]:
    cases = []
    for run in RUNS:
        for preset in PRESETS:
            key = (run.scenario.name, preset)
            marks = [pytest.mark.xfail(strict=True, reason=XFAIL[key])] if key in XFAIL else []
            cases.append(pytest.param(run, preset, marks=marks, id=f"{key[0]}-{preset}"))
    return cases


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, str], Outcome]:
    """Every corpus run under every preset (in process, one runtime, about 10 s)."""

    async def play() -> dict[tuple[str, str], Outcome]:
        with anyio.fail_after(300):
            played = await play_corpus(RUNS, PRESETS)
        return {key: outcome for key, (outcome, _) in played.items()}

    return anyio.run(play)


def given(outcome: Outcome) -> set[str]:
    """The loop verdicts a run got."""
    got = set()
    if outcome.warnings or outcome.loop_nudges:
        got.add("warn")
    if outcome.refusals:
        got.add("refuse")
    if outcome.stopped_at is not None:
        got.add("stop")
    return got


@pytest.mark.parametrize(("run", "preset"), _cases())
def test_the_corpus_run_ends_as_its_half_requires(
    outcomes: dict[tuple[str, str], Outcome], run: CorpusRun, preset: str
) -> None:
    outcome = outcomes[run.scenario.name, preset]
    differs = DIFFERS.get((preset, run.kind), Differs("no difference"))
    if run.half == "legit":
        assert outcome.cause == "model.end_turn" or "stop" in differs.legit_may, outcome
        assert given(outcome) <= differs.legit_may, outcome
        if outcome.cause == "model.end_turn":
            assert outcome.calls == run.scenario.expect.tool_calls, outcome
        return
    if differs.stop_by is None:
        if outcome.refusals:  # refused, so seen: the refusals must end in a stop
            assert outcome.cause.startswith("loop."), outcome
        return
    assert outcome.exit_reason == "hook_stopped", outcome
    assert outcome.cause.startswith("loop."), outcome
    assert outcome.stopped_at is not None
    assert outcome.stopped_at <= differs.stop_by, outcome


def test_the_corpus_has_forty_runs_of_each_half_and_every_kind_asked_for() -> None:
    legit = [r for r in RUNS if r.half == "legit"]
    stuck = [r for r in RUNS if r.half == "stuck"]
    assert len(legit) >= 40
    assert len(stuck) >= 40
    assert {
        "legit.poll",
        "legit.paged",
        "legit.batch",
        "legit.distinct",
        "legit.long",
        "legit.recovery",
        "stuck.poll",
        "stuck.identical",
        "stuck.rotation",
        "stuck.rephrased",
        "stuck.unknown_tool",
        "stuck.error_streak",
    } <= KINDS
    assert max(r.scenario.expect.tool_calls or 0 for r in legit) >= 100
    assert all(r.scenario.expect.exit_reason.value == "completed" for r in legit)
    assert all(r.scenario.expect.exit_reason.value == "hook_stopped" for r in stuck)
    assert all("loop_preset" not in r.scenario.config for r in RUNS)  # the test picks it


def test_the_tables_name_real_presets_kinds_and_runs() -> None:
    names = {r.scenario.name for r in RUNS}
    assert {preset for preset, _ in DIFFERS} <= set(PRESETS)
    assert {kind for _, kind in DIFFERS} <= KINDS
    assert {name for name, _ in XFAIL} <= names
    assert {preset for _, preset in XFAIL} <= set(PRESETS)


def test_the_shipped_files_are_what_the_generator_writes() -> None:
    assert generate_main(["--check"]) == 0


def test_the_waste_bench_reports_the_corpus_per_preset() -> None:
    table = io.StringIO()
    argv = ["--corpus", "--preset", "strict", "--preset", "openclaw"]
    assert waste_main([*argv, "identical_call", "paged_read_6"], out=table) == 0
    lines = table.getvalue().splitlines()
    strict = next(line.split() for line in lines if line.startswith("strict "))
    # preset, legit, with verdicts, requests, tokens, stuck, stopped, by call 20, median / max
    assert strict[1:3] == ["1", "0"]
    assert strict[5:11] == ["1", "1", "1", "5", "/", "5"]
    openclaw = next(line.split() for line in lines if line.startswith("openclaw "))
    assert openclaw[5:11] == ["1", "1", "0", "31", "/", "31"]  # its breaker: call 31
    assert next(line.split() for line in lines if line.startswith("identical_call"))[2:] == [
        "5",
        "31",
    ]
    assert next(line.split() for line in lines if line.startswith("paged_read_6"))[2:] == [
        "ok",
        "ok",
    ]

    as_json = io.StringIO()
    assert waste_main([*argv, "--json", "identical_call"], out=as_json) == 0
    rows = [msgspec.json.decode(line) for line in as_json.getvalue().splitlines()]
    assert [(r["preset"], r["stop_calls"]) for r in rows] == [
        ("strict", {"identical_call": 5}),
        ("openclaw", {"identical_call": 31}),
    ]


def test_the_waste_bench_names_a_bad_corpus_run_or_preset(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert waste_main(["--corpus", "no_such_run"]) == 2
    assert "no corpus run named no_such_run" in capsys.readouterr().err
    assert waste_main(["--corpus", "--preset", "nope"]) == 2
    assert "unknown preset(s) nope" in capsys.readouterr().err
    assert waste_main(["--preset", "strict"]) == 2
    assert "--preset needs --corpus" in capsys.readouterr().err


def test_every_preset_difference_is_stated_in_the_docs() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "loop-detection.md").read_text()
    section = docs.split("## The acceptance corpus (issue #32)", 1)[1]
    table = section.split("**Where a preset differs**", 1)[1].split("\n\n", 2)[1]
    stated = set()
    for row in table.splitlines()[2:]:
        presets, kinds = (cell.strip() for cell in row.strip("|").split("|")[:2])
        stated |= {(p.strip(), k.strip(" `")) for p in presets.split(",") for k in kinds.split(",")}
    assert stated == set(DIFFERS)
