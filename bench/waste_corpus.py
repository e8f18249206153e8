"""The fuse acceptance corpus (issue #32) per preset: ``python -m bench.waste --corpus``.

Every corpus run (``orchestrator/scenarios/corpus``) is played under every preset, in
process on one runtime (:func:`bench.corpus_play.play_corpus`). Per preset:

* **legit**: runs, runs that got a loop verdict (false positives: a warning, a refusal, a
  loop nudge or a loop stop), and the requests and tokens the legitimate runs spent;
* **stuck**: runs, runs stopped with a ``loop.`` cause, those stopped by call 20
  (:data:`~bench.corpus_play.STOP_BY`), the median and largest call at which
  they were stopped, and the requests and tokens the stuck runs spent (a run no fuse stops
  runs to its 40-turn budget).

Then one line per corpus run: the call at which each preset stopped it (``-``: not stopped;
for a legitimate run ``ok`` or the verdicts it got).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import TextIO

import msgspec

from actors.loop import PRESETS
from bench.corpus_play import STOP_BY, Outcome, play_corpus
from orchestrator.config import Config
from orchestrator.scenarios.corpus import CorpusRun, corpus

__all__ = ["CorpusRow", "corpus_rows", "format_corpus", "measure_corpus"]


class CorpusRow(msgspec.Struct, frozen=True, kw_only=True):
    """The corpus under one preset."""

    preset: str
    legit: int
    false_positives: tuple[str, ...]
    legit_requests: int
    legit_tokens: int
    stuck: int
    stopped: int
    stopped_by_call_20: int
    stop_calls: dict[str, int]
    """Stuck run → the call at which a loop fuse stopped it (the stopped ones only)."""
    median_stop_call: float | None
    max_stop_call: int | None
    not_stopped: tuple[str, ...]
    stuck_requests: int
    stuck_tokens: int


def corpus_rows(outcomes: Iterable[Outcome], presets: Sequence[str]) -> list[CorpusRow]:
    """Summarise ``outcomes`` per preset, in the order of ``presets``."""
    by_preset: dict[str, list[Outcome]] = {preset: [] for preset in presets}
    for outcome in outcomes:
        by_preset[outcome.preset].append(outcome)
    rows: list[CorpusRow] = []
    for preset, found in by_preset.items():
        legit = [o for o in found if o.half == "legit"]
        stuck = [o for o in found if o.half == "stuck"]
        stops = {
            o.scenario: o.stopped_at
            for o in stuck
            if o.stopped_at is not None and o.exit_reason == "hook_stopped"
        }
        rows.append(
            CorpusRow(
                preset=preset,
                legit=len(legit),
                false_positives=tuple(o.scenario for o in legit if o.verdicts),
                legit_requests=sum(o.llm_requests for o in legit),
                legit_tokens=sum(o.total_tokens for o in legit),
                stuck=len(stuck),
                stopped=len(stops),
                stopped_by_call_20=sum(call <= STOP_BY for call in stops.values()),
                stop_calls=stops,
                median_stop_call=statistics.median(stops.values()) if stops else None,
                max_stop_call=max(stops.values()) if stops else None,
                not_stopped=tuple(o.scenario for o in stuck if o.scenario not in stops),
                stuck_requests=sum(o.llm_requests for o in stuck),
                stuck_tokens=sum(o.total_tokens for o in stuck),
            )
        )
    return rows


async def measure_corpus(
    names: Sequence[str] = (),
    presets: Sequence[str] = tuple(PRESETS),
    *,
    config: Config | None = None,
) -> tuple[list[CorpusRow], list[Outcome]]:
    """Play the corpus (only the runs ``names`` lists, if any) under ``presets``.

    :raises ValueError: a name is no corpus run, or a preset is unknown.
    """
    runs = _chosen(names)
    unknown = sorted(set(presets) - set(PRESETS))
    if unknown:
        raise ValueError(f"unknown preset(s) {', '.join(unknown)}; known: {', '.join(PRESETS)}")
    played = await play_corpus(runs, presets, config=config)
    outcomes = [outcome for outcome, _ in played.values()]
    return corpus_rows(outcomes, presets), outcomes


def _chosen(names: Sequence[str]) -> tuple[CorpusRun, ...]:
    runs = corpus()
    if not names:
        return runs
    known = {run.scenario.name: run for run in runs}
    missing = [name for name in names if name not in known]
    if missing:
        raise ValueError(f"no corpus run named {', '.join(missing)}")
    return tuple(known[name] for name in names)


def _table(headers: Sequence[str], lines: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(line[i]) for line in (headers, *lines)) for i in range(len(headers))]
    for line in (headers, tuple("-" * w for w in widths), *lines):
        out.write("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        out.write("\n")


def format_corpus(rows: Sequence[CorpusRow], outcomes: Sequence[Outcome], out: TextIO) -> None:
    """The per-preset table, then each run's stop call (or verdicts) per preset."""
    _table(
        (
            "preset",
            "legit",
            "with verdicts",
            "legit requests",
            "legit tokens",
            "stuck",
            "stopped",
            f"by call {STOP_BY}",
            "stop call median / max",
            "stuck requests",
            "stuck tokens",
        ),
        [
            (
                row.preset,
                str(row.legit),
                str(len(row.false_positives)),
                str(row.legit_requests),
                f"{row.legit_tokens:,}",
                str(row.stuck),
                str(row.stopped),
                str(row.stopped_by_call_20),
                f"{row.median_stop_call:g} / {row.max_stop_call}"
                if row.median_stop_call is not None
                else "-",
                str(row.stuck_requests),
                f"{row.stuck_tokens:,}",
            )
            for row in rows
        ],
        out,
    )
    out.write("\n")
    presets = [row.preset for row in rows]
    cells: dict[tuple[str, str], str] = {}
    kinds: dict[str, str] = {}
    for o in outcomes:
        kinds[o.scenario] = o.kind
        if o.half == "legit":
            cells[o.scenario, o.preset] = _verdicts(o)
        else:
            cells[o.scenario, o.preset] = (
                str(o.stopped_at)
                if o.stopped_at is not None and o.exit_reason == "hook_stopped"
                else "-"
            )
    _table(
        ("run", "kind", *presets),
        [
            (name, kind, *(cells.get((name, p), "") for p in presets))
            for name, kind in kinds.items()
        ],
        out,
    )


def _verdicts(o: Outcome) -> str:
    if not o.verdicts:
        return "ok"
    got = [
        f"{label}{count}"
        for label, count in (("w", o.warnings), ("r", o.refusals), ("n", o.loop_nudges))
        if count
    ]
    if o.stopped_at is not None:
        got.append(f"stop@{o.stopped_at}")
    return ",".join(got)
