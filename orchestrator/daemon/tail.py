"""The newest committed events of each run, in memory, for the event streams
(``docs/daemon.md``, "Event streams").

The store hands every commit to :meth:`EventTail.committed`; a stream asks
:meth:`EventTail.after` for the events after the last one it sent and reads the store only
when memory no longer holds them all. Memory holds, per run, one contiguous range of
sequence numbers that ends at the run's newest committed event, so a stream that takes what
the store returns up to some id and memory's from there on has no gap and no duplicate.

Bounded twice, both by the operator: at most ``per_run`` events per run (the oldest go) and
``total_bytes`` over all runs (the oldest events of the run written to least recently go). A
run's entry (it costs ``ENTRY_OVERHEAD_BYTES``) goes when its last event does.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

__all__ = ["EVENT_OVERHEAD_BYTES", "EventTail", "RunEnd"]

EVENT_OVERHEAD_BYTES: Final = 120
"""What one kept event costs besides its JSON (the tuple, the ints, the deque slot),
counted against ``total_bytes`` so that many tiny events are bounded too."""


class StoredEvent(NamedTuple):
    """One stored bus message of a run: its sequence number, type name and JSON."""

    seq: int
    type: str
    data: bytes


class RunEnd(NamedTuple):
    """A run's row once it says ``ended``: what the stream's ``event: end`` reports."""

    exit_reason: str | None
    last_event: int
    events_dropped: int


_stored: Final = tuple.__new__
"""Makes a :class:`StoredEvent` from a tuple without the Python-level ``__new__`` a
``NamedTuple`` adds."""

ENTRY_OVERHEAD_BYTES: Final = 400
"""What one run's entry costs besides its events (counted the same way)."""


@dataclass(slots=True)
class _Run:
    base: int
    """Memory holds every committed event of the run with a higher sequence number."""
    events: deque[StoredEvent] = field(default_factory=deque)
    dropped: int = 0
    ended: RunEnd | None = None


class EventTail:
    """The newest ``per_run`` committed events of each run, ``total_bytes`` in all."""

    def __init__(self, *, per_run: int, total_bytes: int) -> None:
        self.per_run = per_run
        self.total_bytes = total_bytes
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._bytes = 0
        self._evicted = 0  # events evicted so far (the tests count them)

    def committed(
        self,
        new_runs: Iterable[str],
        events: Iterable[tuple[str, int, str, bytes]],
        updates: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """Take in one commit: the runs it inserted (no events yet: memory holds them all),
        its events (in order) and its row updates."""
        per_run = self.per_run
        if per_run:
            for run_id in new_runs:
                self._entry(run_id, 0)
            runs = self._runs
            # One event's work, inlined (a busy daemon commits every event it stores here).
            last_id, run = None, None
            added = size = 0
            for run_id, seq, kind, data in events:
                if run_id != last_id or run is None:
                    run = runs.get(run_id)
                    if run is None:
                        run = self._entry(run_id, seq - 1)
                    else:
                        runs.move_to_end(run_id)  # the previous event's run is last already
                    last_id = run_id
                kept = run.events
                if seq != run.base + len(kept) + 1:
                    # Not the next one (rewritten after a restart): start the range anew.
                    self._drop(run, len(kept))
                    run.base = seq - 1
                    run.ended = None
                kept.append(_stored(StoredEvent, (seq, kind, data)))
                added += 1
                size += len(data)
                if len(kept) > per_run:
                    self._drop(run, len(kept) - per_run)
            self._bytes += size + added * EVENT_OVERHEAD_BYTES
            while self._bytes > self.total_bytes and runs:  # the least recently written first
                oldest_id, oldest = next(iter(runs.items()))
                while oldest.events and self._bytes > self.total_bytes:
                    self._drop(oldest, 1)
                if not oldest.events:
                    del runs[oldest_id]
                    self._bytes -= ENTRY_OVERHEAD_BYTES
        for run_id, columns in updates.items():
            run = self._runs.get(run_id)
            if run is None:
                continue
            if "events_dropped" in columns:
                run.dropped = int(columns["events_dropped"])
            if columns.get("status") == "ended" and run.events:
                run.ended = RunEnd(columns.get("exit_reason"), run.events[-1].seq, run.dropped)

    def after(self, run_id: str, seq: int) -> list[StoredEvent] | None:
        """The committed events of ``run_id`` after ``seq``, in order, if memory holds every
        one of them; ``None``: read them from the store."""
        run = self._runs.get(run_id)
        if run is None or seq < run.base:
            return None
        return list(itertools.islice(run.events, seq - run.base, None))

    def forget(self, run_ids: Iterable[str]) -> None:
        """Drop these runs (pruned from the store)."""
        for run_id in run_ids:
            run = self._runs.pop(run_id, None)
            if run is not None:
                self._drop(run, len(run.events))
                self._bytes -= ENTRY_OVERHEAD_BYTES

    def knows(self, run_id: str) -> bool:
        """Whether memory has an entry for ``run_id`` (then the run exists)."""
        return run_id in self._runs

    def ended(self, run_id: str) -> RunEnd | None:
        """How ``run_id`` ended, once its row says so (``None``: not known here)."""
        run = self._runs.get(run_id)
        return run.ended if run is not None else None

    def _entry(self, run_id: str, base: int) -> _Run:
        run = self._runs[run_id] = _Run(base)
        self._bytes += ENTRY_OVERHEAD_BYTES
        return run

    def _drop(self, run: _Run, count: int) -> None:
        for _ in range(count):
            event = run.events.popleft()
            run.base = event.seq
            self._bytes -= len(event.data) + EVENT_OVERHEAD_BYTES
        self._evicted += count
