"""Token and cost accounting of one run: the decisions behind the budget monitor's answers.

Pure and synchronous (no bus, no clock), so every rule is testable on its own:

* **ceiling** (the default mode): once completion tokens reach 90% of
  ``output_tokens`` a warning is given, once per run; once they reach the budget the run is
  stopped before its next model call (``budget.output_tokens``). Prompt tokens summed over
  requests (``budget.input_tokens``) and cost (``budget.cost``) are ceilings too.
* **target**: ``output_tokens`` is the volume the model is asked to produce. When the model
  ends its turn below 90% of it, the run is continued ("keep working, do not summarise").
  A *continuation* is one such answer; its *increment* is every completion token produced
  from the end of turn it answered to the next end of turn (tool-calling turns in between
  included). After 3 or more continuations, if the last two increments were each below 500
  tokens, the run is stopped (``budget.diminishing_returns``). At 90% or more the run
  completes. Input and cost ceilings apply in both modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

__all__ = [
    "CONTINUE_KIND",
    "DIMINISHING_AFTER",
    "DIMINISHING_TOKENS",
    "NUDGE_FRACTION",
    "WARNING_KIND",
    "BudgetMode",
    "BudgetNudge",
    "BudgetStop",
    "TokenAccount",
    "TokenLimits",
]

BudgetMode = Literal["ceiling", "target"]

NUDGE_FRACTION: Final = 0.9
"""The share of the output budget at which the warning (ceiling) or completion (target) comes."""
DIMINISHING_AFTER: Final = 3
"""Continuations already made before diminishing returns can stop a run."""
DIMINISHING_TOKENS: Final = 500
"""An increment below this many completion tokens adds little."""

WARNING_KIND: Final = "budget.warning"
CONTINUE_KIND: Final = "budget.continue"


class TokenLimits(NamedTuple):
    """A run's token and cost limits; 0 means no limit."""

    output_tokens: int = 0
    input_tokens: int = 0
    cost: float = 0.0
    mode: BudgetMode = "ceiling"
    input_price_per_million: float = 0.0
    output_price_per_million: float = 0.0

    @property
    def any(self) -> bool:
        return bool(self.output_tokens or self.input_tokens or self.cost)


class BudgetNudge(NamedTuple):
    """Inject ``text`` before the next model call; ``continues`` keeps an ending run going."""

    kind: str
    text: str
    continues: bool = False


class BudgetStop(NamedTuple):
    """Stop the run with ``max_turns`` and this cause."""

    cause: str
    detail: str


@dataclass
class TokenAccount:
    """What one run has spent, and what its limits say about it."""

    limits: TokenLimits
    prompt_tokens: int = 0
    completion_tokens: int = 0
    warned: bool = False
    continuations: int = 0
    checked_at: int = 0
    last_increment: int | None = None

    @property
    def cost(self) -> float:
        limits = self.limits
        return (
            self.prompt_tokens * limits.input_price_per_million
            + self.completion_tokens * limits.output_price_per_million
        ) / 1_000_000

    def replied(
        self, prompt_tokens: int, completion_tokens: int, *, ended_turn: bool
    ) -> BudgetNudge | BudgetStop | None:
        """The run's totals after a reply; ``ended_turn``: it had no tool calls and was not
        cut off, so the run completes unless this answer continues it."""
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens
        budget = self.limits.output_tokens
        if not budget:
            return None
        if self.limits.mode == "target":
            return self._end_of_turn(budget) if ended_turn else None
        if not self.warned and budget * NUDGE_FRACTION <= completion_tokens < budget:
            self.warned = True
            return BudgetNudge(
                WARNING_KIND,
                f"Output-token budget {completion_tokens * 100 // budget}% used "
                f"({completion_tokens:,} / {budget:,}); keep working, do not summarise.",
            )
        return None

    def exhausted(self) -> BudgetStop | None:
        """The first ceiling reached, checked before the next model call."""
        limits = self.limits
        if (
            limits.mode == "ceiling"
            and limits.output_tokens
            and self.completion_tokens >= limits.output_tokens
        ):
            return BudgetStop(
                "budget.output_tokens",
                f"The run produced {self.completion_tokens:,} completion tokens, reaching its "
                f"budget of {limits.output_tokens:,} (budget.max_output_tokens).",
            )
        if limits.input_tokens and self.prompt_tokens >= limits.input_tokens:
            return BudgetStop(
                "budget.input_tokens",
                f"The run's requests sent {self.prompt_tokens:,} prompt tokens, reaching its "
                f"budget of {limits.input_tokens:,} (budget.max_input_tokens).",
            )
        if limits.cost and self.cost >= limits.cost:
            return BudgetStop(
                "budget.cost",
                f"The run cost {self.cost:.4f} ({self.prompt_tokens:,} prompt and "
                f"{self.completion_tokens:,} completion tokens), reaching its budget of "
                f"{limits.cost:g} (budget.max_cost).",
            )
        return None

    def _end_of_turn(self, target: int) -> BudgetNudge | BudgetStop | None:
        total = self.completion_tokens
        increment = total - self.checked_at
        previous, self.last_increment = self.last_increment, increment
        self.checked_at = total
        if total >= target * NUDGE_FRACTION:
            return None  # the target is met: the run completes
        if (
            self.continuations >= DIMINISHING_AFTER
            and increment < DIMINISHING_TOKENS
            and previous is not None
            and previous < DIMINISHING_TOKENS
        ):
            return BudgetStop(
                "budget.diminishing_returns",
                f"After {self.continuations} continuations the last two added only "
                f"{previous:,} and {increment:,} completion tokens (under "
                f"{DIMINISHING_TOKENS} each); {total:,} of the {target:,} target.",
            )
        self.continuations += 1
        return BudgetNudge(
            CONTINUE_KIND,
            f"Output-token target {total * 100 // target}% reached ({total:,} / {target:,}), "
            f"continuation {self.continuations}; keep working, do not summarise.",
            continues=True,
        )
