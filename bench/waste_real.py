"""``python -m bench.waste --real``: what the loop fuses save on a real model's runs.

Every task of :data:`bench.real_model.REAL_TASKS` runs twice against SmolLM2-135M on
llama-cpp-python's server (``scripts/realmodel`` installs both): under the default fuses,
and with them off (loop preset ``off``, the result cache off; the window and the budgets
stay). For each task: how each run ended, its model requests and tokens (as the server
counted them), and the ratio off / on. Real runs take seconds each: the whole table takes
minutes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import anyio
import msgspec

from bench.real_model import DEFAULT, OFF, RealRun, open_real_server, play_real_tasks

__all__ = ["RealWaste", "format_real", "measure_real", "real_rows"]


class RealWaste(msgspec.Struct, frozen=True, kw_only=True):
    """One real task with the fuses on and off."""

    task: str
    on_ending: str
    """``exit_reason (cause)`` of the run under the default fuses."""
    off_ending: str
    on_requests: int
    off_requests: int
    on_tokens: int
    off_tokens: int
    requests_ratio: float
    tokens_ratio: float


def _tokens(run: RealRun) -> int:
    return run.result.usage.prompt_tokens + run.result.usage.completion_tokens


def _ratio(off: int, on: int) -> float:
    return round(off / on, 2) if on else float("inf")


def real_rows(runs: Sequence[RealRun]) -> list[RealWaste]:
    """The table of ``runs`` (each task under :data:`DEFAULT` and :data:`OFF`)."""
    by_key = {(run.task.name, run.preset): run for run in runs}
    rows = []
    for run in runs:
        if run.preset != DEFAULT or (run.task.name, OFF) not in by_key:
            continue
        on, off = run, by_key[run.task.name, OFF]
        rows.append(
            RealWaste(
                task=run.task.name,
                on_ending=f"{on.result.exit_reason.value} ({on.result.cause})",
                off_ending=f"{off.result.exit_reason.value} ({off.result.cause})",
                on_requests=on.result.llm_requests,
                off_requests=off.result.llm_requests,
                on_tokens=_tokens(on),
                off_tokens=_tokens(off),
                requests_ratio=_ratio(off.result.llm_requests, on.result.llm_requests),
                tokens_ratio=_ratio(_tokens(off), _tokens(on)),
            )
        )
    return rows


def measure_real() -> list[RealWaste]:
    """Start the real model's server, play every task on and off, stop it.

    :raises FileNotFoundError: the server's virtualenv has no model (run scripts/realmodel).
    """
    with tempfile.TemporaryDirectory() as tmp, open_real_server(Path(tmp)) as server:
        runs = anyio.run(play_real_tasks, server, Path(tmp))
    return real_rows(runs)


def format_real(rows: Sequence[RealWaste], out: TextIO) -> None:
    """A Markdown table of ``rows`` with the totals."""
    out.write(
        "| task | fuses on: ending | off: ending | requests on / off | tokens on / off "
        "| ratio requests | ratio tokens |\n|---|---|---|---|---|---|---|\n"
    )
    for row in rows:
        out.write(
            f"| {row.task} | {row.on_ending} | {row.off_ending} "
            f"| {row.on_requests} / {row.off_requests} | {row.on_tokens} / {row.off_tokens} "
            f"| {row.requests_ratio} | {row.tokens_ratio} |\n"
        )
    on_r, off_r = sum(r.on_requests for r in rows), sum(r.off_requests for r in rows)
    on_t, off_t = sum(r.on_tokens for r in rows), sum(r.off_tokens for r in rows)
    out.write(
        f"| **total** | | | {on_r} / {off_r} | {on_t} / {off_t} "
        f"| {_ratio(off_r, on_r)} | {_ratio(off_t, on_t)} |\n"
    )
