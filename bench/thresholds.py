"""``python -m bench.thresholds``: the default preset's key thresholds, chosen by replay.

Every run of three corpora is recorded once **with the loop fuses off** (loop preset
``off``; the result cache on but never out of hits, so a tool the run cached is known to be
idempotent), so each recording holds the whole trajectory, then replayed
(:func:`orchestrator.replay.player.play`, no model, no tool) under the default preset with
one threshold changed at a time (:data:`SWEEPS`):

* issue #32's acceptance corpus (``orchestrator/scenarios/corpus``): ``legit`` runs make
  progress and must get no loop verdict; ``stuck`` runs must be stopped by a loop fuse;
* the shipped agent scenarios that run under the default preset with no loop table of
  their own, labelled by their ending as shipped: ``stuck`` when a loop fuse stopped them,
  else ``legit`` when no loop verdict touched them (the rest are left out);
* the real-model corpus (``bench/real_corpus``, its ``default`` runs): unlabelled (a small
  model's runs are neither scripted progress nor a scripted loop); how many a loop fuse
  stops, and where.

Per threshold value: legitimate runs with any loop verdict (a warning, a refusal, a loop
nudge or a loop stop: must be 0), stuck runs stopped by a loop fuse (of how many), the mean
call a stuck run was stopped at, and the real runs a loop fuse stopped with their mean stop
call. The default value of each threshold is marked ``*``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
import msgspec

from bench.real_corpus import CORPUS
from orchestrator.config import CACHE_HITS_MAX, Config
from orchestrator.replay.player import play
from orchestrator.replay.recording import Decision, Recording, recording_from_events
from orchestrator.replay.sources import load_recordings
from orchestrator.runtime import Runtime
from orchestrator.scenarios.corpus import corpus
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario, shipped_scenarios

__all__ = [
    "SWEEPS",
    "Labelled",
    "Point",
    "Sweep",
    "format_points",
    "main",
    "measure",
    "real_runs",
    "record",
    "record_scenarios",
]


class Sweep(msgspec.Struct, frozen=True, kw_only=True):
    """One threshold: its name, the run overrides of each value, the default value."""

    name: str
    values: tuple[int, ...]
    default: int

    def overrides(self, value: int) -> dict[str, Any]:
        """The run overrides that set this threshold to ``value`` over the default preset."""
        match self.name:
            case "max_cache_hits":
                return {"max_cache_hits": value}
            case "generic_repeat.warn_at":
                return {"loop": {"generic_repeat": {"warn_at": value}}}
            case "generic_repeat.break_at":
                return {"loop": {"generic_repeat": {"break_at": value}}}
            case "error_streak.break_at":
                return {"loop": {"error_streak": {"break_at": value}}}
            case "no_new_information.break_at":
                return {"loop": {"no_new_information": {"break_at": value}}}
            case _:
                raise ValueError(f"no such threshold: {self.name}")


SWEEPS: Final = (
    Sweep(name="generic_repeat.warn_at", values=(2, 3, 4), default=3),
    Sweep(name="generic_repeat.break_at", values=(4, 5, 6, 8), default=5),
    Sweep(name="error_streak.break_at", values=(4, 5, 6, 8), default=6),
    Sweep(name="max_cache_hits", values=(1, 2, 3, 4), default=2),
    Sweep(name="no_new_information.break_at", values=(6, 8, 10, 12), default=10),
)
"""The thresholds swept (each with the others at their defaults)."""

_RECORD_OFF: Final = {"loop_preset": "off", "max_cache_hits": CACHE_HITS_MAX}


class Labelled(msgspec.Struct, frozen=True, kw_only=True):
    """A recording with its corpus and label (``legit``, ``stuck`` or ``real``) and the
    settings of its own the replay keeps (the loop preset and cache hits aside)."""

    corpus: str
    label: str
    recording: Recording
    settings: dict[str, Any]


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One threshold value's results over the corpora."""

    threshold: str
    value: int
    default: bool
    legit: int
    legit_with_verdict: int
    legit_touched: tuple[str, ...]
    """The legitimate runs with a loop verdict, by name."""
    stuck: int
    stuck_stopped: int
    mean_stop_call: float | None
    real: int
    real_stopped: int
    real_mean_stop_call: float | None


def _own(scenario: Scenario) -> dict[str, Any]:
    return {
        k: v
        for k, v in scenario.config.items()
        if k not in ("loop_preset", "loop", "max_cache_hits")
    }


def _loop_touched(recording: Recording) -> bool:
    ending = recording.ending
    return _loop_decision(recording.decisions) or (
        ending is not None and ending.cause.startswith("loop.")
    )


async def record_scenarios(
    scenarios: Sequence[Scenario], overrides: dict[str, Any]
) -> list[Recording]:
    """Play each of ``scenarios`` with ``overrides`` over its own settings, in process
    against the simulator; the recording of each."""
    recorded: list[Recording] = []
    for scenario in scenarios:
        played = msgspec.structs.replace(
            scenario, name=f"{scenario.name}", config={**scenario.config, **overrides}
        )
        async with Runtime(Config(), scenarios=[played]) as runtime:
            handle = await start_scenario(runtime, played)
            await handle.result()
            events = runtime.event_log.events(handle.run_id)
        recorded.append(recording_from_events(scenario.name, events))
    return recorded


def _default_preset_scenarios() -> list[Scenario]:
    return [
        s
        for s in shipped_scenarios()
        if s.pipeline is None
        and s.config.get("loop_preset", "strict") == "strict"
        and "loop" not in s.config
        and s.abort is None
        and s.name != "deadline"
    ]


def real_runs(real_corpus: Path = CORPUS) -> list[Labelled]:
    """The real-model corpus's fuses-off runs (none if the directory is missing)."""
    found: list[Labelled] = []
    if real_corpus.is_dir():
        for recording in load_recordings([str(real_corpus)]):
            if recording.overrides.get("loop_preset") == "off":
                settings = {
                    k: v
                    for k, v in recording.overrides.items()
                    if k not in ("loop_preset", "max_cache_hits", "cache_max_entries")
                }
                found.append(
                    Labelled(corpus="real", label="real", recording=recording, settings=settings)
                )
    return found


async def record() -> list[Labelled]:
    """Every run of the acceptance corpus and the shipped scenarios, recorded with the
    loop fuses off (see the module docstring), labelled."""
    found: list[Labelled] = []
    runs = corpus()
    recordings = await record_scenarios([run.scenario for run in runs], _RECORD_OFF)
    for run, recording in zip(runs, recordings, strict=True):
        found.append(
            Labelled(
                corpus="acceptance",
                label=run.half,
                recording=recording,
                settings=_own(run.scenario),
            )
        )
    scenarios = _default_preset_scenarios()
    shipped = await record_scenarios(scenarios, {})
    off = await record_scenarios(scenarios, _RECORD_OFF)
    for scenario, own, recording in zip(scenarios, shipped, off, strict=True):
        if own.ending is not None and own.ending.cause.startswith("loop."):
            label = "stuck"
        elif not _loop_touched(own):
            label = "legit"
        else:
            continue
        found.append(
            Labelled(corpus="shipped", label=label, recording=recording, settings=_own(scenario))
        )
    return found


def _stop_call(played_log: Sequence[str], cause: str) -> int | None:
    if not cause.startswith("loop."):
        return None
    return len(played_log) if played_log and played_log[-1] == "not_run" else len(played_log) + 1


def _mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


async def measure(runs: Sequence[Labelled], sweeps: Sequence[Sweep] = SWEEPS) -> list[Point]:
    """Replay every run under every value of every sweep (the default preset)."""
    points: list[Point] = []
    config = Config()
    for sweep in sweeps:
        for value in sweep.values:
            touched: list[str] = []
            stopped_calls = 0
            stuck_calls: list[int] = []
            real_calls: list[int] = []
            for run in runs:
                overrides = {**run.settings, "loop_preset": "strict", **sweep.overrides(value)}
                bare = msgspec.structs.replace(run.recording, overrides={})
                played = await play(config, bare, overrides=overrides, beyond="end")
                result = played.result
                log = [entry.verdict for entry in result.call_log]
                call = _stop_call(log, result.cause)
                if run.label == "legit":
                    if _loop_decision(played.decisions) or call is not None:
                        touched.append(run.recording.name)
                elif run.label == "stuck" and call is not None:
                    stopped_calls += 1
                    stuck_calls.append(call)
                elif run.label == "real" and call is not None:
                    real_calls.append(call)
            points.append(
                Point(
                    threshold=sweep.name,
                    value=value,
                    default=value == sweep.default,
                    legit=sum(r.label == "legit" for r in runs),
                    legit_with_verdict=len(touched),
                    legit_touched=tuple(touched),
                    stuck=sum(r.label == "stuck" for r in runs),
                    stuck_stopped=stopped_calls,
                    mean_stop_call=_mean(stuck_calls),
                    real=sum(r.label == "real" for r in runs),
                    real_stopped=len(real_calls),
                    real_mean_stop_call=_mean(real_calls),
                )
            )
    return points


def _loop_decision(decisions: Sequence[Decision]) -> bool:
    """Any warning, refusal, nudge or stop of a loop fuse among ``decisions``."""
    for kind, _, first, second, third in decisions:
        if kind == "verdict" and third.startswith("loop."):
            return True
        if kind == "nudge" and first.startswith("loop."):
            return True
        if kind == "stop" and second.startswith("loop."):
            return True
    return False


def format_points(points: Sequence[Point], out: TextIO) -> None:
    """A Markdown table of ``points``."""
    out.write(
        "| threshold | value | legit runs with a loop verdict | stuck runs stopped "
        "| mean stop call (stuck) | real runs stopped | mean stop call (real) "
        "| legit runs touched |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n"
    )
    for p in points:
        mark = " *" if p.default else ""
        out.write(
            f"| {p.threshold} | {p.value}{mark} | {p.legit_with_verdict} / {p.legit} "
            f"| {p.stuck_stopped} / {p.stuck} | {p.mean_stop_call if p.mean_stop_call else '-'} "
            f"| {p.real_stopped} / {p.real} "
            f"| {p.real_mean_stop_call if p.real_mean_stop_call else '-'} "
            f"| {', '.join(p.legit_touched) or '-'} |\n"
        )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of ``python -m bench.thresholds``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.thresholds", description=__doc__)
    parser.add_argument("--json", action="store_true", help="one JSON object per value")
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        choices=[s.name for s in SWEEPS],
        help="only this threshold (repeatable; default: every one)",
    )
    parser.add_argument("--real-corpus", type=Path, default=CORPUS, help="the real-model corpus")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    sweeps = [s for s in SWEEPS if not args.threshold or s.name in args.threshold]
    real = real_runs(args.real_corpus)

    async def run() -> list[Point]:
        return await measure([*await record(), *real], sweeps)

    points = anyio.run(run)
    if args.json:
        encoder = msgspec.json.Encoder()
        for point in points:
            out.write(encoder.encode(point).decode() + "\n")
    else:
        format_points(points, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
