"""Plays the fuse acceptance corpus (``orchestrator/scenarios/corpus``) in process, every
scenario under every loop preset, and says what became of each run (:class:`Outcome`): the
harness of ``tests/test_fuse_corpus.py`` and ``python -m bench.waste --corpus``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import anyio
import msgspec

from actors.loop import PRESETS
from bus import NUDGE_MARKER
from orchestrator.config import Config
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.corpus import CorpusRun, Half, corpus
from orchestrator.scenarios.runs import run_scenario
from orchestrator.sim import Scenario

__all__ = ["CONCURRENT_RUNS", "STOP_BY", "Outcome", "outcome", "play_corpus", "under"]

STOP_BY: Final = 20
"""A stuck run must be stopped by a loop fuse at (before running) its 20th call at the
latest: the 21st call is never proposed."""
CONCURRENT_RUNS: Final = 32
"""Runs played at once by :func:`play_corpus` (one runtime, in process: CPU-bound)."""


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
