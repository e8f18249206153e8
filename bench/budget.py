"""``python -m bench.budget``: the performance budget, checked in CI.

Counts the instructions per unit of each shape of :mod:`bench.budget_shapes` (cheap,
realistic and peer: per turn; daemon: per run) under ``valgrind --tool=callgrind``, which
is deterministic where CPU time is not, and compares them with the committed baseline,
``bench/budget.json``. A shape more than :data:`TOLERANCE` (10 %) above its baseline fails
the check (exit status 1) with a message naming the shape, the baseline, the new figure
and how to update the baseline deliberately::

    python -m bench.budget             # measure, compare, exit 1 on a rise over 10 %
    python -m bench.budget --update    # measure and record the figures as the baseline
    python -m bench.budget peer        # some shapes only

A baseline is kept per build (``cpython-3.11-pure``: the interpreter's version and whether
the hot path is compiled with mypyc), since counts are only comparable like for like; a
build with no baseline is reported and not failed. Without valgrind the check says so and
passes (``scripts/test`` installs it). Nothing here runs in the test suite but the logic
(:func:`compare`, :func:`regression_message`, :func:`updated`), in
``tests/test_budget.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

__all__ = [
    "BASELINE",
    "TOLERANCE",
    "Verdict",
    "build_key",
    "compare",
    "main",
    "measure",
    "regression_message",
    "updated",
]

BASELINE: Final = Path(__file__).with_name("budget.json")
TOLERANCE: Final = 0.10
UPDATE_COMMAND: Final = "python -m bench.budget --update"
_TOTALS: Final = re.compile(rb"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


class Verdict(NamedTuple):
    """One shape's figure against its baseline (``baseline`` None: none recorded yet)."""

    shape: str
    unit: str
    measured: float
    baseline: float | None

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.measured / self.baseline

    def over(self, tolerance: float = TOLERANCE) -> bool:
        """True when the figure is more than ``tolerance`` above its baseline."""
        ratio = self.ratio
        return ratio is not None and ratio > 1 + tolerance


def build_key() -> str:
    """The build measured: ``cpython-X.Y-pure`` or ``cpython-X.Y-compiled``."""
    from orchestrator.runtime.compiled import compiled_modules

    kind = "compiled" if compiled_modules() else "pure"
    return f"cpython-{sys.version_info.major}.{sys.version_info.minor}-{kind}"


def compare(
    baseline: Mapping[str, Mapping[str, Any]],
    measured: Mapping[str, tuple[str, float]],
) -> list[Verdict]:
    """Each measured shape (``name -> (unit, instructions per unit)``) against ``baseline``
    (``name -> {"unit", "instructions"}``, one build's shapes)."""
    verdicts = []
    for name, (unit, figure) in measured.items():
        recorded = baseline.get(name)
        verdicts.append(
            Verdict(
                name, unit, figure, None if recorded is None else float(recorded["instructions"])
            )
        )
    return verdicts


def regression_message(verdict: Verdict, build: str, tolerance: float = TOLERANCE) -> str:
    """What a failed check says about one shape: which, how much, and what to do."""
    assert verdict.baseline is not None
    assert verdict.ratio is not None
    return (
        f"budget exceeded: shape {verdict.shape!r} ({build}) costs "
        f"{verdict.measured:,.0f} instructions per {verdict.unit}, baseline "
        f"{verdict.baseline:,.0f} (+{100 * (verdict.ratio - 1):.1f} %, the budget allows "
        f"+{100 * tolerance:.0f} %).\n"
        f"  If the rise is a regression, fix it. If it is the deliberate price of a change, "
        f"record it: run `{UPDATE_COMMAND}` and commit bench/budget.json with a commit "
        f"message that says why the shape costs more."
    )


def updated(
    document: Mapping[str, Any],
    build: str,
    measured: Mapping[str, tuple[str, float]],
    *,
    commit: str = "",
) -> dict[str, Any]:
    """``document`` (the baseline file's content) with ``build``'s figures set to
    ``measured``; shapes not measured keep their figures, other builds are untouched."""
    builds = {key: dict(value) for key, value in document.get("builds", {}).items()}
    entry = builds.setdefault(build, {})
    shapes = dict(entry.get("shapes", {}))
    for name, (unit, figure) in measured.items():
        shapes[name] = {"unit": unit, "instructions": round(figure)}
    entry["shapes"] = dict(sorted(shapes.items()))
    if commit:
        entry["measured_at"] = commit
    return {"tolerance": TOLERANCE, "builds": dict(sorted(builds.items()))}


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _units() -> dict[str, str]:
    from bench.budget_shapes import SHAPES

    return {shape.name: shape.unit for shape in SHAPES}


def measure(
    names: Sequence[str] = (), python: str = sys.executable
) -> dict[str, tuple[str, float]]:
    """Instructions per unit of each shape (all, or ``names``), from one callgrind run.

    :raises RuntimeError: valgrind or the workload failed."""
    units = _units()
    with tempfile.TemporaryDirectory(prefix="budget-") as folder:
        out = Path(folder) / "cg.out"
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        command = [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=getpgid",
            f"--callgrind-out-file={out}",
            python,
            "-m",
            "bench.budget_shapes",
            *names,
        ]
        done = subprocess.run(command, capture_output=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} failed ({done.returncode}):\n"
                f"{done.stderr.decode(errors='replace')[-4000:]}"
            )
        rows = [line.split() for line in done.stdout.decode().splitlines() if line.strip()]
        phases = [_total(Path(f"{out}.{n}")) for n in range(2, 2 + 3 * len(rows))]
    figures: dict[str, tuple[str, float]] = {}
    for index, (name, small, large) in enumerate(rows):
        small_count, large_count = phases[3 * index + 1], phases[3 * index + 2]
        per_unit = (large_count - small_count) / (int(large) - int(small))
        figures[name] = (units[name], per_unit)
    return figures


def _total(dump: Path) -> int:
    found = _TOTALS.search(dump.read_bytes())
    if found is None:
        raise RuntimeError(f"no totals in callgrind's dump {dump}")
    return int(found.group(1))


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        check=False,
    )
    return done.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.budget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shapes", nargs="*", help=f"default: all of {', '.join(_units())}")
    parser.add_argument("--update", action="store_true", help="record the figures as the baseline")
    parser.add_argument(
        "--baseline", type=Path, default=BASELINE, help="the baseline file (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.shapes) - set(_units()))
    if unknown:
        parser.error(f"unknown shape {', '.join(unknown)}: choose from {', '.join(_units())}")
    if shutil.which("valgrind") is None:
        print("budget check skipped: valgrind is not installed (scripts/test installs it)")
        return 0
    build = build_key()
    began = time.perf_counter()
    measured = measure(args.shapes)
    seconds = time.perf_counter() - began
    document = _load(args.baseline)
    if args.update:
        new = updated(document, build, measured, commit=_commit())
        args.baseline.write_text(json.dumps(new, indent=2) + "\n")
        for name, (unit, figure) in measured.items():
            print(f"{name}: {figure:,.0f} instructions per {unit} (recorded)")
        print(f"baseline for {build} written to {args.baseline}; say why in the commit message")
        return 0
    shapes = document.get("builds", {}).get(build, {}).get("shapes", {})
    verdicts = compare(shapes, measured)
    failed = False
    for verdict in verdicts:
        if verdict.baseline is None:
            print(
                f"{verdict.shape}: {verdict.measured:,.0f} per {verdict.unit}, no baseline for "
                f"{build} (record one with `{UPDATE_COMMAND}`)"
            )
        elif verdict.over():
            failed = True
            print(regression_message(verdict, build))
        else:
            print(
                f"{verdict.shape}: {verdict.measured:,.0f} instructions per {verdict.unit}, "
                f"baseline {verdict.baseline:,.0f} ({100 * ((verdict.ratio or 1) - 1):+.1f} %)"
            )
    print(f"budget check ({build}, callgrind): {seconds:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
