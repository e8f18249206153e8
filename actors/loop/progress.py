"""Whether a call's result made progress: what qwen's stagnation rules count without.

A result makes progress when it is not an error and it changed: it is a result the run has
not seen before (from any call), or it differs from the same call's previous result (as a
repeat whose result changed is progress for the consecutive rule). The run's first result
has nothing to change from, so it is not progress; nor is a refusal recorded with the
call's last result. So 30 different files read one after the other make progress (each
result is new), while 12 commands printing one output, or a poll whose status never
changes, do not.

Memory is bounded: the newest :data:`MAX_REMEMBERED` results and call fingerprints are
kept (oldest forgotten first); a result forgotten and seen again counts as new.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_REMEMBERED", "ProgressTracker"]

MAX_REMEMBERED: Final = 4096
"""Results (and calls' last results) remembered per run."""


class ProgressTracker:
    """One run's results seen, and each call's last result."""

    __slots__ = ("_any", "_last", "_seen")

    def __init__(self) -> None:
        self._seen: dict[str, None] = {}
        self._last: dict[str, str] = {}
        self._any = False

    def judge(self, fingerprint: str, result: str, *, is_error: bool) -> bool:
        """Whether ``result`` (a result fingerprint) of the call ``fingerprint`` made
        progress; remembers it either way."""
        seen, last = self._seen, self._last
        before = last.get(fingerprint)
        new = result not in seen
        progress = not is_error and self._any and (new or (before is not None and before != result))
        self._any = True
        if new:
            seen[result] = None
            if len(seen) > MAX_REMEMBERED:
                del seen[next(iter(seen))]
        if before != result:
            last[fingerprint] = result
            if before is None and len(last) > MAX_REMEMBERED:
                del last[next(iter(last))]
        return progress

    def state(self) -> dict[str, object]:
        """The results seen and the calls' last results, as plain data."""
        return {"seen": list(self._seen), "last": dict(self._last), "any": self._any}

    def restore(self, state: dict[str, object]) -> None:
        """Take back what :meth:`state` gave."""
        seen, last = state.get("seen"), state.get("last")
        self._seen = dict.fromkeys(str(r) for r in seen) if isinstance(seen, list) else {}
        self._last = {str(k): str(v) for k, v in last.items()} if isinstance(last, dict) else {}
        self._any = state.get("any") is True
