"""The observers' CPU per turn: ``python -m bench.observers [--json]``.

The subscribers that see the throughput workload's messages and are not on its critical
path: the metrics recorder and the event log (every message), the budget monitor, the hook
runner (no hooks configured, as in the workload), the progress reporter and the loop
monitor (preset ``strict``). The messages are the workload's own, captured from real runs
(:func:`bench.recorder.capture_messages`); each component gets the types it subscribes to,
in their order, through what the bus calls inline (its handler, or its function of the
message's type). A fresh instance per pass (set up as the runtime sets it up, untimed),
``repeat`` passes per repetition; only the handler calls are timed, in CPU time
(``time.process_time``). The figures are µs per turn (the bus's own delivery, the same for
every handler, is not in them). Progress goes to stderr.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import anyio
import msgspec

from actors.budget.monitor import BudgetMonitor
from actors.hooks import HookRunner
from actors.loop import STRICT
from actors.loop.monitor import LoopMonitor
from actors.progress.reporter import ProgressReporter
from bench.options import replay_parser
from bench.recorder import _recorder, capture_messages
from bus import (
    Bus,
    BusMessage,
    ModelError,
    ModelReplied,
    ModelReply,
    ModelTextDelta,
    RunEnding,
    RunFinished,
    RunStarted,
    ToolCallProposed,
    ToolResult,
    TurnEnded,
    TurnStarted,
)
from orchestrator.runtime.event_log import EventLog

__all__ = ["COMPONENTS", "Component", "ComponentFigures", "main", "measure_observers"]

Handler = Callable[[Any], object]


class Component(NamedTuple):
    """How to set up one observer for a pass: ``make(run_ids)`` returns what the bus calls
    (one handler for every message, or the function of each type it handles); ``types``
    are the message types it subscribes to (``None``: every one)."""

    name: str
    make: Callable[[Sequence[str]], Handler | Mapping[type, Handler]]
    types: tuple[type, ...] | None


def _event_log(run_ids: Sequence[str]) -> Handler:
    log = EventLog(Bus())
    for run_id in run_ids:  # as the runtime does before a run's first message
        log.open_run(run_id)
    return log.record


COMPONENTS: tuple[Component, ...] = (
    Component("recorder", lambda run_ids: _recorder()._record, None),
    Component("event_log", _event_log, None),
    Component(
        "budget_monitor",
        lambda run_ids: BudgetMonitor(Bus()).handlers(),
        (RunStarted, RunFinished, TurnStarted, TurnEnded, ToolCallProposed, ModelReplied),
    ),
    Component(
        "hook_runner",
        lambda run_ids: HookRunner(Bus(), lambda run_id: ()).handle,
        (RunStarted, RunFinished, ToolCallProposed, ModelReply, ModelReplied),
    ),
    Component(
        "progress_reporter",
        lambda run_ids: ProgressReporter(Bus()).handlers(),
        (RunStarted, TurnStarted, RunEnding),
    ),
    Component(
        "loop_monitor",
        lambda run_ids: LoopMonitor(Bus(), lambda run_id: STRICT).handlers(),
        (
            RunStarted,
            RunFinished,
            ToolCallProposed,
            ToolResult,
            ModelTextDelta,
            ModelReply,
            ModelError,  # the model-based loop check's failed request
        ),
    ),
)
"""The observers as the runtime sets them up (the hook runner's second subscription,
``AbortRequested`` only, sees nothing in this workload)."""


class ComponentFigures(NamedTuple):
    """µs of CPU per turn in one component's handler, over the repetitions."""

    name: str
    messages_per_turn: float
    us_per_turn: float
    us_per_turn_min: float
    us_per_turn_max: float


def time_component(
    component: Component, messages: Sequence[BusMessage], run_ids: Sequence[str], repeat: int
) -> float:
    """CPU seconds of ``repeat`` passes of ``messages`` through a fresh ``component`` each."""
    mine = [m for m in messages if component.types is None or type(m) in component.types]
    spent = 0.0
    for _ in range(repeat):
        made = component.make(run_ids)
        if isinstance(made, Mapping):  # the bus calls each type's function itself
            deliveries = [(made[type(msg)], msg) for msg in mine]
        else:
            deliveries = [(made, msg) for msg in mine]
        started = time.process_time()
        for handle, msg in deliveries:
            handle(msg)
        spent += time.process_time() - started
    return spent


def measure_observers(
    runs: int = 20,
    turns: int = 20,
    *,
    repeat: int = 20,
    reps: int = 5,
    components: Sequence[Component] = COMPONENTS,
    messages: Sequence[BusMessage] | None = None,
) -> list[ComponentFigures]:
    """µs per turn of each of ``components`` on the workload's messages (repetitions of
    the components alternate, so machine noise spreads over all of them).

    :raises ValueError: a count is not positive.
    """
    for key, count in (("runs", runs), ("turns", turns), ("repeat", repeat), ("reps", reps)):
        if count < 1:
            raise ValueError(f"{key} must be positive, got {count}")
    if messages is None:
        messages = anyio.run(capture_messages, runs, turns)
    run_ids = list(dict.fromkeys(msg.run_id for msg in messages))
    turn_count = sum(1 for msg in messages if type(msg) is TurnStarted) or 1
    for component in components:  # warm up
        time_component(component, messages, run_ids, 1)
    spent: dict[str, list[float]] = {component.name: [] for component in components}
    for _ in range(reps):
        for component in components:
            seconds = time_component(component, messages, run_ids, repeat)
            spent[component.name].append(seconds / (repeat * turn_count) * 1e6)
    figures = []
    for component in components:
        per_turn = spent[component.name]
        mine = sum(1 for m in messages if component.types is None or type(m) in component.types)
        figures.append(
            ComponentFigures(
                component.name,
                mine / turn_count,
                statistics.median(per_turn),
                min(per_turn),
                max(per_turn),
            )
        )
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Print the figures (a table, or one JSON array with ``--json``); 0 on success."""
    parser = replay_parser("python -m bench.observers", __doc__, repeat=20)
    args = parser.parse_args(argv)
    print("capturing the workload's messages, then timing the observers…", file=sys.stderr)
    figures = measure_observers(args.runs, args.turns, repeat=args.repeat, reps=args.reps)
    if args.json:
        print(msgspec.json.encode([f._asdict() for f in figures]).decode())
        return 0
    total = sum(f.us_per_turn for f in figures)
    for f in figures:
        print(
            f"{f.name:18} {f.messages_per_turn:4.1f} msg/turn  {f.us_per_turn:6.2f} µs/turn "
            f"({f.us_per_turn_min:.2f}–{f.us_per_turn_max:.2f})"
        )
    print(f"{'total':18} {'':13} {total:6.2f} µs/turn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
