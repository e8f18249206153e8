"""What a checkpoint keeps of the monitors, so a resumed run goes on with its fuses.

Without it a daemon restart or a fleet takeover would reset the loop monitor's history and
the token budget's account: a looping run would get its repeats for free again, a target
run a fresh set of continuations. :class:`MonitorStates` adds each monitor's state of the
run to every checkpoint (``RunCheckpoint.monitors``, by monitor name) and hands it back to
the monitors before a resumed run starts. A monitor with no state of the run (no token
budget, no call seen yet) adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import msgspec

from orchestrator.conductor import RunCheckpoint

__all__ = ["MonitorStates", "Resumable"]


class Resumable(Protocol):
    """A monitor whose per-run state can be saved and given back."""

    def snapshot(self, run_id: str) -> bytes | None: ...

    def restore(self, run_id: str, state: bytes) -> None: ...


class MonitorStates:
    """The states of ``monitors`` (by name) in and out of a run's checkpoints."""

    def __init__(self, monitors: Mapping[str, Resumable]) -> None:
        self._monitors = dict(monitors)

    def saving(self, save: Callable[[RunCheckpoint], None]) -> Callable[[RunCheckpoint], None]:
        """``save``, given each checkpoint with the monitors' states of its run added."""

        def with_states(checkpoint: RunCheckpoint) -> None:
            run_id = checkpoint.run_id
            states = {
                name: state
                for name, monitor in self._monitors.items()
                if (state := monitor.snapshot(run_id)) is not None
            }
            save(msgspec.structs.replace(checkpoint, monitors=states) if states else checkpoint)

        return with_states

    def restore(self, run_id: str, states: Mapping[str, bytes]) -> None:
        """Give each monitor its state of ``run_id`` back (before the run starts); a state
        of a monitor this runtime does not have is ignored."""
        for name, state in states.items():
            monitor = self._monitors.get(name)
            if monitor is not None:
                monitor.restore(run_id, state)
