"""Result normalisation: volatile parts of a tool result replaced before it is fingerprinted.

A poll that answers "still running (session 7f3a9c21e4, pid 4411, 3.2 s)" and then
"still running (session 91b0cc7d52, pid 4412, 6.5 s)" has made no progress; without
normalisation every result is new and no result-aware detector ever fires (openclaw#34574,
#89090). The built-in patterns, in order:

* ``<hex>``: UUIDs and runs of 7–64 hex digits holding a digit and a letter (digests, git
  hashes, container ids); a plain number (``1048576``) is not one;
* ``<time>``: ISO dates and date-times (``2026-12-03``, ``2026-12-03T12:23:08.5Z``), clock
  times (``12:23:08``), 10- and 13-digit epoch stamps, durations (``12ms``, ``3.5 s``,
  ``2 min``, ``1 h``);
* ``<id>``: a digit-bearing value after an id-like key: ``pid``, ``id``/``Id``/``ID`` (also
  at the end of ``session_id``, ``messageId``), ``session``, ``job``, ``process`` (also
  capitalised), ``container``, ``nonce``, separated by ``:``, ``=``, ``#`` or spaces (``pid=4411``,
  ``"job_id": "j-93"``, ``session 17``);
* ``<tmp>``: paths under ``/tmp``, ``/var/tmp``, ``/var/folders``.

Counts, percentages, sizes and line numbers are not touched: "42% done" then "57% done"
is progress. An operator adds patterns with ``[loop] result_patterns`` (applied after
these, in order). A :class:`Normaliser` is made once per config, never per result.

The cost is a few regular-expression passes over the text (about 20 ns a character), so a
result longer than ``2 × EDGE_CHARS`` is normalised in its first and last ``EDGE_CHARS``
characters only; its middle is fingerprinted as it is.
"""

from __future__ import annotations

import re
from typing import Final

from actors.loop.config import LoopConfig, compile_pattern

__all__ = ["BUILTIN_PATTERNS", "EDGE_CHARS", "Normaliser"]

EDGE_CHARS: Final = 4000
"""Characters normalised at each end of a long result."""

BUILTIN_PATTERNS: Final[tuple[tuple[str, str], ...]] = (
    (r"[0-9a-fA-F]{7,64}\b(?:-[0-9a-fA-F]{4}){0,3}(?:-[0-9a-fA-F]{12}\b)?", "<hex>"),
    (
        r"(?<!\d)\d(?:\d{3}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)?"
        r"|\d?:\d\d:\d\d(?:[.,]\d+)?|\d{9}(?:\d{3})?"
        r"|[\d.]*\s?(?:[nuµm]?s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?))\b",
        "<time>",
    ),
    (
        r"(pid|PID|Pid|id|Id|ID|session|Session|job|Job|process|Process|container|nonce)\b([\"']?\s*[:=#]?\s*[\"']?)"
        r"[\w.:-]*\d[\w.:-]*",
        r"\1\2<id>",
    ),
    (r"(?:/tmp|/var/tmp|/var/folders|/private/var/folders)(?:/[\w.@%+=:,-]+)+", "<tmp>"),
)
"""(pattern, replacement) pairs, applied in this order (``<hex>`` only where the match
holds both a digit and a letter)."""

_DIGIT: Final = frozenset("0123456789")
_HEX_LETTER: Final = frozenset("abcdefABCDEF")


def _hex(match: re.Match[str]) -> str:
    text = match.group()
    chars = set(text)
    if chars & _DIGIT and chars & _HEX_LETTER:
        return "<hex>"
    return text


def _builtin() -> tuple[tuple[re.Pattern[str], object], ...]:
    compiled: list[tuple[re.Pattern[str], object]] = []
    for pattern, replacement in BUILTIN_PATTERNS:
        compiled.append((re.compile(pattern), _hex if replacement == "<hex>" else replacement))
    return tuple(compiled)


_BUILTIN: Final = _builtin()
_ANY_BUILTIN: Final = re.compile("|".join(f"(?:{pattern})" for pattern, _ in BUILTIN_PATTERNS))
"""One pass that finds whether any built-in pattern could change a text: most results have
nothing volatile, and one search costs a quarter of the four substitutions."""


class Normaliser:
    """The patterns of one config, compiled once. ``normalise(text)`` returns ``text``
    itself (the same object) when nothing matched."""

    __slots__ = ("_builtin", "_extra")

    def __init__(self, config: LoopConfig) -> None:
        self._extra: tuple[tuple[re.Pattern[str], object], ...] = tuple(
            (compile_pattern(f"result_patterns.{i}.pattern", item.pattern), item.replacement)
            for i, item in enumerate(config.result_patterns)
        )
        self._builtin = config.normalise_results

    def __bool__(self) -> bool:
        return self._builtin or bool(self._extra)

    def normalise(self, text: str) -> str:
        """``text`` with every pattern's matches replaced (a long text: at both ends)."""
        if len(text) > 2 * EDGE_CHARS:
            middle = text[EDGE_CHARS:-EDGE_CHARS]
            return f"{self._sub(text[:EDGE_CHARS])}\x00{middle}\x00{self._sub(text[-EDGE_CHARS:])}"
        return self._sub(text)

    def _sub(self, text: str) -> str:
        if self._builtin and _ANY_BUILTIN.search(text) is not None:
            for pattern, replacement in _BUILTIN:
                text = pattern.sub(replacement, text)  # type: ignore[call-overload]
        for pattern, replacement in self._extra:
            text = pattern.sub(replacement, text)  # type: ignore[call-overload]
        return text
