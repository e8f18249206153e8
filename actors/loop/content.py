"""Detector 6, content loops: the model's streamed text repeating itself.

gemini-cli's algorithm: a ``chunk_size`` window slides one character at a time over the
last ``max_history`` characters of the stream; the positions of each chunk are kept. A loop
is a chunk seen ``threshold`` times whose last ``threshold`` positions are on average at
most ``max_mean_distance`` apart and have at most ``max_distinct_periods`` different texts
between them (so list items sharing a long prefix do not count).

Markdown that merely looks alike must not trip it: a line that opens or closes a code fence,
or starts a table row, list item, heading or blockquote resets the tracking; nothing inside a
code block is analysed, nor divider deltas. A delta is analysed line by line, so the verdict
does not depend on how the stream was cut (the differences from gemini-cli:
``docs/loop-detection.md``, "Upstream rules and loopfuse").
"""

from __future__ import annotations

import itertools
from typing import Final

import re2

from actors.loop.config import ContentConfig

__all__ = ["ContentLoop"]

_HEAD: Final = 32
"""Characters of the current line kept to recognise line-start markers."""

# RE2 (linear time): the text is the model's. A line that starts a table row, a list item,
# a numbered item, a heading or a blockquote (one search for the five markers).
_MARKER: Final = re2.compile(r"(?:^|\n)(?:\s*(?:\|.*\||[|+-]{3,})|\s*[*+-]\s|\s*\d+\.\s|#+\s|>\s)")
_DIVIDER: Final = re2.compile(r"[+\-_=*\x{2500}-\x{257F}]+")


class ContentLoop:
    """Feed it the stream's deltas; :meth:`feed` returns True when the text loops."""

    __slots__ = (
        "_base",
        "_config",
        "_head",
        "_hit",
        "_in_code",
        "_next",
        "_seen",
        "_text",
        "_ticks",
    )

    def __init__(self, config: ContentConfig) -> None:
        self._config = config
        self._head = ""
        self._ticks = 0
        self._in_code = False
        self._text = ""
        self._base = 0  # absolute position of self._text[0]
        self._next = 0  # absolute position of the next chunk to analyse
        self._seen: dict[str, list[int]] = {}
        self._hit = 0

    def reset(self) -> None:
        """A new stream: forget everything, code-block state included."""
        self._head = ""
        self._ticks = 0
        self._in_code = False
        self.reset_tracking()

    def reset_tracking(self) -> None:
        """Forget the analysed text (gemini-cli's reset on tool calls and elements)."""
        if not self._text:
            return  # nothing was analysed since the last reset: nothing to forget
        self._text = ""
        self._base = 0
        self._next = 0
        self._seen = {}
        self._hit = 0

    def snippet(self) -> str:
        """The text around the last chunk found looping."""
        at = self._hit - self._base
        start = max(0, at - 20)
        return self._text[start : at + self._config.chunk_size].strip()

    def feed(self, delta: str) -> bool:
        """Analyse ``delta`` line by line, so the result does not depend on how the stream
        was cut into deltas."""
        start = 0
        while (end := delta.find("\n", start)) >= 0:
            if self._feed_piece(delta[start : end + 1]):
                return True
            start = end + 1
        return start < len(delta) and self._feed_piece(delta[start:])

    def _feed_piece(self, delta: str) -> bool:
        fences = 0  # code fences (three backticks) completed by ``delta``, runs carried over
        if "`" not in delta:
            self._ticks = 0
        else:
            for char in delta:
                if char != "`":
                    self._ticks = 0
                    continue
                self._ticks += 1
                if self._ticks == 3:
                    fences += 1
                    self._ticks = 0
        probe = self._head + delta
        divider = _DIVIDER.fullmatch(delta) is not None and (
            not self._head or _DIVIDER.fullmatch(self._head) is not None
        )
        newline = delta.rfind("\n")
        self._head = (delta[newline + 1 :] if newline >= 0 else probe)[:_HEAD]
        if fences or divider or _MARKER.search(probe) is not None:
            self.reset_tracking()
        was_in_code = self._in_code
        if fences % 2:
            self._in_code = not self._in_code
        if was_in_code or self._in_code or divider:
            return False
        self._text += delta
        excess = len(self._text) - self._config.max_history
        if excess > 0:  # only the last max_history characters are kept
            self._text = self._text[excess:]
            self._base += excess
            self._next = max(self._next, self._base)
            if len(self._seen) > 2 * self._config.max_history:
                self._seen = {
                    chunk: kept
                    for chunk, positions in self._seen.items()
                    if (kept := [p for p in positions if p >= self._base])
                }
        size = self._config.chunk_size
        end = self._base + len(self._text)
        while self._next + size <= end:
            at = self._next - self._base
            if self._repeats(self._text[at : at + size]):
                self._hit = self._next
                return True
            self._next += 1
        return False

    def _repeats(self, chunk: str) -> bool:
        cfg = self._config
        positions = self._seen.get(chunk)
        if positions is None:
            self._seen[chunk] = [self._next]
            return False
        if positions[0] < self._base:
            positions[:] = [p for p in positions if p >= self._base]
        positions.append(self._next)
        if len(positions) < cfg.threshold:
            return False
        recent = positions[-cfg.threshold :]
        if (recent[-1] - recent[0]) / (cfg.threshold - 1) > cfg.max_mean_distance:
            return False
        if cfg.max_distinct_periods is None:
            return True
        periods = {
            self._text[a - self._base : b - self._base] for a, b in itertools.pairwise(recent)
        }
        return len(periods) <= cfg.max_distinct_periods
