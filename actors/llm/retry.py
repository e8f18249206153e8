"""When to try a failed model call again, and after how long.

Exponential backoff with jitter, a ``Retry-After`` honoured up to a cap (a longer one gives
up at once), a bounded number of attempts, and never a wait that would pass the deadline.
"""

from __future__ import annotations

import dataclasses
import random
from typing import NamedTuple

from actors.llm.errors import Failure

__all__ = ["RetryDecision", "RetryPolicy"]


class RetryDecision(NamedTuple):
    """``retry`` after ``delay`` seconds, or give up for ``reason``."""

    retry: bool
    delay: float = 0.0
    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Decides, after a failed attempt, whether to make another one."""

    max_attempts: int
    backoff_base: float
    backoff_cap: float
    retry_after_cap: float
    rng: random.Random = dataclasses.field(default_factory=random.Random)

    def backoff(self, failures: int) -> float:
        """Delay after the ``failures``-th failure: base·2ⁿ⁻¹ capped, minus up to 25 % jitter."""
        delay = min(self.backoff_cap, self.backoff_base * 2.0 ** max(failures - 1, 0))
        return delay * (1.0 - 0.25 * self.rng.random())

    def decide(self, failure: Failure, *, failures: int, remaining: float) -> RetryDecision:
        """After ``failures`` failed attempts, with ``remaining`` seconds before the deadline."""
        if not failure.retryable:
            return RetryDecision(False, reason="not retryable")
        if failures >= self.max_attempts:
            return RetryDecision(False, reason=f"gave up after {failures} attempts")
        if failure.retry_after is not None:
            if failure.retry_after > self.retry_after_cap:
                return RetryDecision(
                    False,
                    reason=f"retry-after {failure.retry_after:g}s exceeds the cap "
                    f"of {self.retry_after_cap:g}s",
                )
            delay = failure.retry_after
        else:
            delay = self.backoff(failures)
        if delay >= remaining:
            return RetryDecision(False, reason=f"a retry in {delay:.3g}s would pass the deadline")
        return RetryDecision(True, delay)
