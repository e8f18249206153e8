"""Detector 3, ping-pong: two calls alternating A,B,A,B… (OpenClaw's algorithm).

A is the newest call in the window and B the newest earlier call with a different
fingerprint; the alternating tail is counted back from A, and the proposed call must be B.
The count includes the proposed call. No-progress evidence means every call of the tail has
a result, all of A's results are equal and all of B's are: a read-modify-write whose reads
see the file change is not stuck.

With ``continue_refused`` (every config with a ``refusal_limit`` whose refusals are not
recorded) a refused call counts as the alternation's next call while no call has run
since, so the refusals come in a row and the end of refusals stops the run
(``docs/loop-detection.md``, "A refused ping-pong goes on counting"); the detector then
keeps that one refusal per run, and a fresh instance serves each run.
"""

from __future__ import annotations

from typing import NamedTuple

from actors.loop.config import PingPongConfig
from actors.loop.history import CallRecord, ToolDetector, Window
from actors.loop.verdicts import Hit, by_level, level_for

__all__ = ["PingPong", "alternation"]


class Alternation(NamedTuple):
    length: int
    paired: str
    no_progress: bool


def alternation(window: Window, proposed: str) -> Alternation | None:
    """The alternating tail that ``proposed`` would extend, or ``None``. A call not in the
    window cannot be B: no scan then."""
    if not window.count(proposed):
        return None
    calls = window.records
    a = calls[-1].fingerprint
    b = next((r.fingerprint for r in reversed(calls[:-1]) if r.fingerprint != a), None)
    if b is None or proposed != b:
        return None
    tail = 0
    for record in reversed(calls):
        if record.fingerprint != (a if tail % 2 == 0 else b):
            break
        tail += 1
    if tail < 2:
        return None
    results: dict[str, str] = {}
    no_progress = True
    for record in calls[-tail:]:
        if record.result is None or results.setdefault(record.fingerprint, record.result) != (
            record.result
        ):
            no_progress = False
            break
    return Alternation(tail + 1, a, no_progress and len(results) == 2)


class _Refused(NamedTuple):
    fingerprint: str  # the refused call
    paired: str  # the call it alternated with
    length: int  # its count in the alternation
    newest: str  # the call id of the window's newest call when it was refused


class PingPong(ToolDetector):
    """Reads the window. Without ``continue_refused`` it keeps no state of its own, so one
    instance serves every run; with it, one instance per run (:meth:`fresh`) remembers the
    last refusal."""

    __slots__ = ("_config", "_continue", "_found", "_refused")

    window_results = True

    def __init__(self, config: PingPongConfig, *, continue_refused: bool = False) -> None:
        self._config = config
        self._continue = continue_refused
        self._found: _Refused | None = None  # the last critical finding, until refused
        self._refused: _Refused | None = None

    def fresh(self) -> PingPong:
        return PingPong(self._config, continue_refused=True) if self._continue else self

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        cfg = self._config
        found = None
        if self._continue:
            self._found = None
            refused = self._refused
            if refused is not None:
                # the alternation a refusal left, when ``call`` is its next call and no call
                # has run since (so the no-progress evidence still holds)
                records = window.records
                if not records or records[-1].call_id != refused.newest:
                    self._refused = None  # a call ran: counted from the window again
                elif call.fingerprint == refused.paired:
                    found = Alternation(refused.length + 1, refused.fingerprint, True)
        if found is None:
            found = alternation(window, call.fingerprint)
        if found is None:
            return None
        level = level_for(found.length, cfg.warn_at, cfg.block_at, cfg.break_at)
        if level in ("critical", "break") and cfg.stop_needs_no_progress and not found.no_progress:
            level = level_for(found.length, cfg.warn_at, None, None)
        if level == "warning" and cfg.warn_needs_no_progress and not found.no_progress:
            level = "none"
        if level == "none":
            return None
        key = "pingpong:" + "|".join(sorted((call.fingerprint, found.paired)))
        if self._continue and level == "critical":
            newest = window.records[-1].call_id
            self._found = _Refused(call.fingerprint, found.paired, found.length, newest)
        message = by_level(
            level,
            f"WARNING: You are alternating between repeated tool-call patterns ({found.length} "
            "consecutive calls). This looks like a ping-pong loop; stop retrying and report "
            "the task as failed.",
            f"CRITICAL: You are alternating between repeated tool-call patterns ({found.length} "
            "consecutive calls) with no progress. This appears to be a stuck ping-pong loop. "
            "This call was not run: neither call changes anything, so stop alternating and "
            "try a different approach or report the task as failed.",
            f"Stopped: two calls alternated {found.length} times with no progress.",
        )
        return Hit("ping_pong", level, found.length, key, message)

    def on_refused(self, call: CallRecord) -> None:
        found = self._found
        if found is not None and found.fingerprint == call.fingerprint:
            self._refused = found
        self._found = None

    def state(self) -> dict[str, object]:
        refused = self._refused
        return {} if refused is None else {"refused": list(refused)}

    def restore(self, state: dict[str, object]) -> None:
        saved = state.get("refused")
        self._found = self._refused = None
        if isinstance(saved, list) and len(saved) == 4:
            fingerprint, paired, length, newest = saved
            if isinstance(length, int) and all(
                isinstance(v, str) for v in (fingerprint, paired, newest)
            ):
                self._refused = _Refused(fingerprint, paired, length, newest)
