"""The fuse acceptance corpus (issue #32): legitimate runs (``legit/*.toml``) and stuck runs
(``stuck/*.toml``), played under every loop preset; the bar each must meet is in
``docs/loop-detection.md`` ("The acceptance corpus"). A file's first line names its kind
(``# kind: legit.poll``).

:func:`play_corpus` runs them in process against the simulator, every scenario under every
preset, and :func:`outcome` says what became of each run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, Literal

import anyio
import msgspec

from actors.loop import PRESETS
from bus import NUDGE_MARKER
from orchestrator.config import Config
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import run_scenario
from orchestrator.sim import Scenario, load_scenario

__all__ = [
    "CORPUS_DIR",
    "STOP_BY",
    "CorpusRun",
    "Outcome",
    "corpus",
    "corpus_kind",
    "outcome",
    "play_corpus",
]

CORPUS_DIR: Final = Path(__file__).resolve().parent
STOP_BY: Final = 20
"""A stuck run must be stopped by a loop fuse at (before running) its 20th call at the
latest: the 21st call is never proposed."""
CONCURRENT_RUNS: Final = 32
"""Runs played at once by :func:`play_corpus` (one runtime, in process: CPU-bound)."""

Half = Literal["legit", "stuck"]


class CorpusRun(msgspec.Struct, frozen=True, kw_only=True):
    """One corpus scenario: its half (``legit`` / ``stuck``) and its kind (``stuck.poll``)."""

    half: Half
    kind: str
    scenario: Scenario


def corpus_kind(path: Path) -> str:
    """The ``kind`` a corpus file declares on its first line (``# kind: legit.poll``)."""
    with path.open(encoding="utf-8") as file:
        first = file.readline()
    prefix = "# kind: "
    if not first.startswith(prefix):
        raise ValueError(f"{path}: the first line must be '{prefix}<half>.<kind>'")
    return first[len(prefix) :].strip()


def corpus(half: Half | None = None) -> tuple[CorpusRun, ...]:
    """The corpus scenarios (of one half, or both: legitimate first), sorted by name."""
    halves: tuple[Half, ...] = (half,) if half is not None else ("legit", "stuck")
    runs: list[CorpusRun] = []
    for h in halves:
        for path in sorted((CORPUS_DIR / h).glob("*.toml")):
            kind = corpus_kind(path)
            if not kind.startswith(f"{h}."):
                raise ValueError(f"{path}: kind {kind!r} is not of the {h} half")
            runs.append(CorpusRun(half=h, kind=kind, scenario=load_scenario(path)))
    return tuple(runs)


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one corpus run under one preset.

    ``verdicts``: the loop monitor's answers other than "allow": warnings and refusals of
    calls, loop nudges, and a ``loop.`` stop. ``stopped_at``: the call at which a loop fuse
    stopped the run (that call did not run; a stop between calls counts the next call),
    else ``None``.
    """

    scenario: str
    preset: str
    half: Half
    kind: str
    exit_reason: str
    cause: str
    calls: int
    warnings: int
    refusals: int
    loop_nudges: int
    stopped_at: int | None
    llm_requests: int
    total_tokens: int

    @property
    def verdicts(self) -> int:
        return self.warnings + self.refusals + self.loop_nudges + (self.stopped_at is not None)


def outcome(run: CorpusRun, preset: str, result: RunResult) -> Outcome:
    """Summarise ``result`` (``run`` played under ``preset``)."""
    log = result.call_log
    stopped_at: int | None = None
    if result.cause.startswith("loop."):
        stopped_at = len(log) if log and log[-1].verdict == "not_run" else len(log) + 1
    nudges = [
        m.content[len(NUDGE_MARKER) :]
        for m in result.transcript
        if m.role == "user" and m.content is not None and m.content.startswith(NUDGE_MARKER)
    ]
    return Outcome(
        scenario=run.scenario.name,
        preset=preset,
        half=run.half,
        kind=run.kind,
        exit_reason=result.exit_reason.value,
        cause=result.cause,
        calls=len(log),
        warnings=sum(e.verdict == "warn" for e in log),
        refusals=sum(e.verdict == "block" for e in log),
        loop_nudges=sum(kind.startswith("loop.") for kind in nudges),
        stopped_at=stopped_at,
        llm_requests=result.llm_requests,
        total_tokens=result.usage.total_tokens,
    )


def under(run: CorpusRun, preset: str) -> Scenario:
    """``run``'s scenario under ``preset``, served by a model name of its own."""
    scenario = run.scenario
    return msgspec.structs.replace(
        scenario,
        name=f"corpus-{scenario.name}-{preset}",
        config={**scenario.config, "loop_preset": preset},
    )


async def play_corpus(
    runs: Sequence[CorpusRun] | None = None,
    presets: Iterable[str] = PRESETS,
    *,
    config: Config | None = None,
) -> dict[tuple[str, str], tuple[Outcome, RunResult]]:
    """Play every run under every preset on one runtime, :data:`CONCURRENT_RUNS` at a time;
    keyed by (scenario name, preset)."""
    chosen = corpus() if runs is None else tuple(runs)
    plays = [(run, preset, under(run, preset)) for run in chosen for preset in presets]
    played: dict[tuple[str, str], tuple[Outcome, RunResult]] = {}
    limiter = anyio.CapacityLimiter(CONCURRENT_RUNS)
    async with Runtime(config, scenarios=[scenario for _, _, scenario in plays]) as runtime:

        async def play(run: CorpusRun, preset: str, scenario: Scenario) -> None:
            async with limiter:
                result = await run_scenario(runtime, scenario)
            played[run.scenario.name, preset] = (outcome(run, preset, result), result)

        async with anyio.create_task_group() as tg:
            for run, preset, scenario in plays:
                tg.start_soon(play, run, preset, scenario)
    return {key: played[key] for run, preset, _ in plays for key in [(run.scenario.name, preset)]}
