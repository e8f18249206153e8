"""The context gatekeeper's CPU per turn: ``python -m bench.gatekeeper [--json]``.

The messages are the throughput workload's own (:func:`bench.recorder.capture_messages`:
the echo script, every monitor on), captured from real runs by an inline observer on the
runtime's bus; the gatekeeper's six types are kept, in their order. They are then fed to
a fresh gatekeeper's functions, by type, as the bus calls them inline
(``ContextGatekeeper.handlers()``), ``repeat`` times over (each pass with new run ids, so
every pass starts and ends its runs), with the policy the runtime gives the workload's
runs; only those calls are timed, in CPU time (``time.process_time``). Progress goes to
stderr; the figures to stdout.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

import anyio
import msgspec

from actors.context import ContextPolicy
from actors.context.gatekeeper import ContextGatekeeper
from bench.loops import bench_overrides
from bench.options import replay_parser
from bench.recorder import capture_messages
from bus import (
    Bus,
    ModelReplied,
    ModelRequest,
    PromptRejected,
    RunFinished,
    RunStarted,
    TurnStarted,
)
from orchestrator.config import Config, context_policy, run_settings

__all__ = ["GatekeeperFigures", "gatekeeper_messages", "main", "measure_gatekeeper"]

_Handled = RunStarted | RunFinished | TurnStarted | ModelRequest | ModelReplied | PromptRejected
_TYPES = (RunStarted, RunFinished, TurnStarted, ModelRequest, ModelReplied, PromptRejected)


class GatekeeperFigures(NamedTuple):
    """Microseconds of CPU per turn in the gatekeeper's handler, over the repetitions."""

    turns: int
    messages_per_turn: float
    us_per_turn: float
    us_per_turn_min: float
    us_per_turn_max: float
    mix: dict[str, int]


def gatekeeper_messages(runs: int, turns: int) -> list[_Handled]:
    """The messages the gatekeeper handles in ``runs`` runs of the throughput workload."""
    messages = anyio.run(capture_messages, runs, turns)
    return [msg for msg in messages if isinstance(msg, _TYPES)]


def _passes(messages: Sequence[_Handled], repeat: int) -> list[list[_Handled]]:
    # Each pass its own run ids (so each starts fresh runs, as new runs would).
    return [
        [msgspec.structs.replace(msg, run_id=f"{msg.run_id}/{n}") for msg in messages]
        for n in range(repeat)
    ]


def _time_once(
    passes: Sequence[Sequence[_Handled]], policy: Callable[[str], ContextPolicy | None]
) -> float:
    handlers = ContextGatekeeper(Bus(), policy).handlers()  # what the bus calls inline
    started = time.process_time()
    for messages in passes:
        for msg in messages:
            handlers[type(msg)](msg)
    return time.process_time() - started


def measure_gatekeeper(
    runs: int = 20, turns: int = 20, *, repeat: int = 50, reps: int = 5
) -> GatekeeperFigures:
    """µs per turn through the gatekeeper's handler on the workload's messages.

    :raises ValueError: a count is not positive.
    """
    for key, count in (("runs", runs), ("turns", turns), ("repeat", repeat), ("reps", reps)):
        if count < 1:
            raise ValueError(f"{key} must be positive, got {count}")
    messages = gatekeeper_messages(runs, turns)
    config = Config()
    policy = context_policy(config, run_settings(config, bench_overrides(turns)))
    passes = _passes(messages, repeat)
    turn_count = sum(isinstance(msg, TurnStarted) for msg in messages) * repeat
    _time_once(passes[:1], lambda run_id: policy)  # warm up (the vocabulary loads)
    per_turn = [_time_once(passes, lambda run_id: policy) / turn_count * 1e6 for _ in range(reps)]
    return GatekeeperFigures(
        turns=turn_count,
        messages_per_turn=len(messages) * repeat / turn_count,
        us_per_turn=statistics.median(per_turn),
        us_per_turn_min=min(per_turn),
        us_per_turn_max=max(per_turn),
        mix=dict(Counter(type(msg).__name__ for msg in messages).most_common()),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the figures (a line, or one JSON object with ``--json``); 0 on success."""
    parser = replay_parser("python -m bench.gatekeeper", __doc__, repeat=50)
    args = parser.parse_args(argv)
    print("capturing the workload's messages, then timing the gatekeeper…", file=sys.stderr)
    figures = measure_gatekeeper(args.runs, args.turns, repeat=args.repeat, reps=args.reps)
    if args.json:
        print(msgspec.json.encode(figures._asdict()).decode())
        return 0
    print(
        f"{figures.turns:,} turns ({figures.messages_per_turn:.1f} messages per turn): "
        f"{figures.us_per_turn:.2f} µs/turn median "
        f"({figures.us_per_turn_min:.2f}–{figures.us_per_turn_max:.2f})"
    )
    print("mix per pass: " + ", ".join(f"{name} {count}" for name, count in figures.mix.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
