"""Calibration: how many prompt tokens an endpoint counts per estimated token, per model.

A sample is a reply's ``usage.prompt_tokens`` against the estimate of the prompt sent
(source ``usage``) or, where replies carry no usage, the server's tokenizer's count of a
sample (source ``tokenizer``). The ratio is learned per model (the first sample, then an
exponential moving average), clamped to [:data:`LOW`, :data:`HIGH`], and applied to later
estimates. A model whose tokenizer is unknown also learns a ratio over the ``bound``: its
calibrated estimate is the larger of the two scaled figures, never above the bound (before
any sample, the bound itself). Why: ``docs/context.md`` (Estimating a prompt).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["ALPHA", "HIGH", "LOW", "Calibration", "Source"]

ALPHA: Final = 0.3
"""Weight of a new sample in the moving average."""
LOW: Final = 0.8
HIGH: Final = 8.0
"""A tokenizer that spells text character by character makes ~4-5 tokens per cl100k token."""

Source = Literal["usage", "tokenizer"]
"""Where a model's samples came from: replies' reported usage, or the server's tokenizer."""


@dataclass(slots=True)
class _Ratio:
    value: float
    samples: int
    source: Source
    of_bound: float = 0.0
    """Reported over the bound (0: no bound was given)."""


class Calibration:
    """Per-model ratios of reported to estimated prompt tokens (shared by all runs)."""

    def __init__(self, *, low: float = LOW, high: float = HIGH) -> None:
        self._low = low
        self._high = high
        self._ratios: dict[str, _Ratio] = {}

    def ratio(self, model: str) -> float:
        """The factor applied to ``model``'s estimates (1.0 before any sample)."""
        found = self._ratios.get(model)
        return 1.0 if found is None else found.value

    def ratio_of_bound(self, model: str) -> float:
        """Reported tokens per bound token for ``model`` (0.0 before any bounded sample)."""
        found = self._ratios.get(model)
        return 0.0 if found is None else found.of_bound

    def samples(self, model: str) -> int:
        found = self._ratios.get(model)
        return 0 if found is None else found.samples

    def source(self, model: str) -> Source | None:
        """Where ``model``'s ratio came from (``None``: no sample yet)."""
        found = self._ratios.get(model)
        return None if found is None else found.source

    def observe(
        self,
        model: str,
        estimated: int,
        reported: int,
        source: Source = "usage",
        bound: int = 0,
    ) -> float:
        """Learn from one sample: the prompt was estimated at ``estimated`` tokens (at most
        ``bound``; 0: no bound) and the endpoint counted ``reported``. A reported usage
        replaces what a tokenizer sample taught (it counts the chat template too). Returns
        the new ratio."""
        if estimated <= 0 or reported <= 0:
            return self.ratio(model)
        sample = reported / estimated  # clamped as min(max(sample, low), high), sooner
        sample = self._low if sample < self._low else sample
        sample = self._high if sample > self._high else sample
        of_bound = 0.0
        if bound > 0:
            of_bound = reported / bound
            of_bound = 1.0 if of_bound > 1.0 else of_bound
        found = self._ratios.get(model)
        if found is None or found.source != source:
            if found is not None and source == "tokenizer":
                return found.value  # usage counts what the tokenizer sample cannot (framing)
            self._ratios[model] = _Ratio(sample, 1, source, of_bound)
            return sample
        found.value += ALPHA * (sample - found.value)
        if bound > 0:
            found.of_bound += ALPHA * (of_bound - found.of_bound)
        found.samples += 1
        return found.value

    def apply(self, model: str, tokens: int, bound: int = 0) -> int:
        """``tokens`` (an estimate) calibrated for ``model``, never above ``bound`` when
        one is given (> 0); before any sample, ``bound`` itself."""
        found = self._ratios.get(model)  # no call to ratio(): this runs before every request
        if found is None:
            return bound or tokens
        calibrated = math.ceil(tokens * found.value)
        if not bound:
            return calibrated
        by_bytes = bound * found.of_bound  # the larger of the two, at most the bound
        if by_bytes > calibrated:
            calibrated = math.ceil(by_bytes)
        return calibrated if calibrated < bound else bound
