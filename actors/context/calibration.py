"""Calibration: how many prompt tokens an endpoint reports per estimated token, per model.

Every reply's ``usage.prompt_tokens`` is compared with the estimate of the prompt that was
sent; the ratio is learned per model (the first sample, then an exponential moving average)
and applied to later estimates. It is clamped: an endpoint that counts more than estimated
(an unknown tokenizer with a small vocabulary, framing) raises estimates up to
:data:`HIGH` times, but estimates are lowered by at most ``1 - LOW``, because the estimate
of a run's next prompt, unlike the sample, may be made of content the fallback counts
more closely (see ``tokens``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

__all__ = ["ALPHA", "HIGH", "LOW", "Calibration"]

ALPHA: Final = 0.3
"""Weight of a new sample in the moving average."""
LOW: Final = 0.8
HIGH: Final = 4.0


@dataclass(slots=True)
class _Ratio:
    value: float
    samples: int


class Calibration:
    """Per-model ratios of reported to estimated prompt tokens (shared by all runs)."""

    def __init__(self, *, alpha: float = ALPHA, low: float = LOW, high: float = HIGH) -> None:
        self._alpha = alpha
        self._low = low
        self._high = high
        self._ratios: dict[str, _Ratio] = {}

    def ratio(self, model: str) -> float:
        """The factor applied to ``model``'s estimates (1.0 before any sample)."""
        found = self._ratios.get(model)
        return 1.0 if found is None else found.value

    def samples(self, model: str) -> int:
        found = self._ratios.get(model)
        return 0 if found is None else found.samples

    def observe(self, model: str, estimated: int, reported: int) -> float:
        """Learn from one reply: the prompt was estimated at ``estimated`` tokens and the
        endpoint reported ``reported``. Returns the new ratio."""
        if estimated <= 0 or reported <= 0:
            return self.ratio(model)
        sample = reported / estimated  # clamped as min(max(sample, low), high), sooner
        sample = self._low if sample < self._low else sample
        sample = self._high if sample > self._high else sample
        found = self._ratios.get(model)
        if found is None:
            self._ratios[model] = _Ratio(sample, 1)
            return sample
        found.value += self._alpha * (sample - found.value)
        found.samples += 1
        return found.value

    def apply(self, model: str, tokens: int) -> int:
        """``tokens`` (an estimate) calibrated for ``model``."""
        found = self._ratios.get(model)  # no call to ratio(): this runs before every request
        return tokens if found is None else math.ceil(tokens * found.value)
