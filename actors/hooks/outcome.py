"""What a hook's run amounts to: an action (its own, or its ``on_error`` policy's when it
failed) and the texts the model and the person reading the ending will see."""

from __future__ import annotations

from typing import Final, NamedTuple

from actors.hooks.command import CommandResult
from actors.hooks.config import EXIT_ALLOW, EXIT_BLOCK, EXIT_DENY, Action, Hook
from actors.hooks.python import FunctionResult

__all__ = [
    "MESSAGE_LIMIT",
    "HookOutcome",
    "command_outcome",
    "function_outcome",
    "most_severe",
]

MESSAGE_LIMIT: Final = 2_000
"""Longest hook message passed on (characters)."""

_BY_STATUS: Final[dict[int, Action]] = {
    EXIT_ALLOW: "allow",
    EXIT_BLOCK: "block",
    EXIT_DENY: "deny",
}
_SEVERITY: Final[dict[Action, int]] = {"allow": 0, "block": 1, "deny": 2}


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


class HookOutcome(NamedTuple):
    """One hook's answer. ``failure`` is set when the hook failed and ``action`` is its
    ``on_error`` policy."""

    hook: str
    action: Action
    message: str = ""
    failure: str | None = None

    def block_message(self) -> str:
        """The tool error the model reads for a blocked call."""
        if self.failure is not None:
            return (
                f"Blocked: the hook {self.hook!r} failed ({self.failure}) and its "
                "on_error policy is 'block'."
            )
        return f"Blocked by hook {self.hook!r}: {self.message or 'no reason given.'}"

    def veto_message(self) -> str:
        """The nudge the model reads when a stop hook vetoes its final answer."""
        if self.failure is not None:
            return (
                f"The hook {self.hook!r} could not check your answer ({self.failure}); "
                "check your work once more, then answer again."
            )
        return self.message or (
            f"The hook {self.hook!r} did not accept this answer; check your work and answer again."
        )

    def deny_detail(self, subject: str) -> str:
        """Why the run stopped, for the person reading the ending."""
        if self.failure is not None:
            return (
                f"The hook {self.hook!r} failed ({self.failure}) while judging {subject}; "
                "its on_error policy is 'deny'."
            )
        return f"The hook {self.hook!r} denied {subject}: {self.message or 'no reason given.'}"


def command_outcome(hook: Hook, result: CommandResult) -> HookOutcome:
    """A command hook's outcome from its exit status (0 allow, 2 block, 3 deny)."""
    said = _clip(result.stderr) or _clip(result.stdout)
    if result.failure is None and result.returncode is not None:
        action = _BY_STATUS.get(result.returncode)
        if action is not None:
            return HookOutcome(hook.name, action, said)
    why = result.failure or f"exited with status {result.returncode}"
    if said and result.failure is None:
        why = f"{why}: {said[:200]}"
    return HookOutcome(hook.name, hook.on_error, "", why)


def function_outcome(hook: Hook, result: FunctionResult) -> HookOutcome:
    """A Python hook's outcome from its decision."""
    if result.decision is None:
        return HookOutcome(hook.name, hook.on_error, "", result.failure or "no decision")
    return HookOutcome(hook.name, result.decision.action, _clip(result.decision.message))


def most_severe(outcomes: list[HookOutcome]) -> HookOutcome | None:
    """The first ``deny``, else the first ``block``; ``None`` when every hook allows."""
    worst = max(outcomes, key=lambda outcome: _SEVERITY[outcome.action], default=None)
    return worst if worst is not None and worst.action != "allow" else None
