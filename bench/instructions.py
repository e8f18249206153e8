"""One workload, for counting its instructions under valgrind (deterministic, unlike time).

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python -m bench.instructions loopfuse 500      # then with 0, and guard 500
                                                       # (realistic: bench.realistic's shape;
                                                       # lifecycle: one-turn runs, 32 at a time)

Every invocation warms up with 20 runs × 20 turns of both workloads (imports, caches,
first-use costs), then runs ``runs`` × ``turns`` of the one named. Instructions per turn:
(the total with ``runs`` minus the total with 0) / (``runs`` × ``turns``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import anyio

from bench.loops import Sample, guard_loop, loopfuse_loop
from bench.realistic import realistic_loop
from bench.run_lifecycle import cpu_per_run

__all__ = ["main", "run_workload"]


async def _realistic(runs: int, turns: int) -> Sample:
    return (await realistic_loop(runs, turns)).sample


async def _lifecycle(runs: int, turns: int) -> Sample:
    """``runs`` runs of one turn, 32 at a time (``turns`` is ignored): starts and ends."""
    cpu = await cpu_per_run(runs, 1, 32)
    return Sample(cpu * runs / 1e6, 0.0, runs)


_WORKLOADS = {
    "loopfuse": loopfuse_loop,
    "guard": guard_loop,
    "realistic": _realistic,
    "lifecycle": _lifecycle,
}


async def run_workload(workload: str, runs: int, turns: int) -> Sample | None:
    """The warm-up, then ``runs`` × ``turns`` of ``workload`` (None for 0 runs)."""
    await loopfuse_loop(20, 20)
    await guard_loop(20, 20)
    await _realistic(20, 20)
    return await _WORKLOADS[workload](runs, turns) if runs else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("workload", choices=sorted(_WORKLOADS))
    parser.add_argument("runs", type=int, help="concurrent runs (0: the warm-up alone)")
    parser.add_argument("--turns", type=int, default=20, help="turns per run (default 20)")
    args = parser.parse_args(argv)
    anyio.run(run_workload, args.workload, args.runs, args.turns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
