"""Token estimates of prompt pieces: exact for OpenAI models, bounded otherwise.

OpenAI models (:func:`~actors.context.windows.encoding_for`) are counted with their own
vocabulary from the ``bpe-openai`` wheel, offline, loaded on first use. Any other model gets
three figures: ``tokens`` (the digit-split ``cl100k_base`` count plus
:data:`FALLBACK_MARGIN`, which calibration scales), ``bound`` (UTF-8 bytes and framing at its
largest, :func:`text_bound`) and ``floor`` (the plain cl100k count, for the
silent-truncation check). Images are priced by their pixel size
(:mod:`actors.context.images`); chat framing is added per message, tool call, tool schema and
request. How each figure was measured: ``docs/context.md`` (Estimating a prompt).
"""

from __future__ import annotations

import functools
import importlib
import math
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, assert_never

from actors.context.images import part_tokens
from actors.context.records import Estimate
from actors.context.windows import Encoding, encoding_for
from bus import (
    IMAGE_MARKER,
    ChatMessage,
    ImagePart,
    TextPart,
    ToolSpec,
    message_images,
)

__all__ = [
    "BOUND_CALL_OVERHEAD",
    "BOUND_MESSAGE_OVERHEAD",
    "BOUND_REQUEST_OVERHEAD",
    "BOUND_TOOLS_OVERHEAD",
    "BOUND_TOOL_OVERHEAD",
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
    "text_bound",
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

BOUND_MESSAGE_OVERHEAD: Final = 24
"""The bound's framing of one message: ChatML's ``<|im_start|>assistant\\n``, ``<|im_end|>\\n``
and chatml-function-calling's ``message:\\n`` spelled byte by byte (19) and a margin."""
BOUND_CALL_OVERHEAD: Final = 16
"""The bound's framing of one tool call (``functions.NAME:\\n`` is 12 bytes besides the name)."""
BOUND_TOOL_OVERHEAD: Final = 16
"""The bound's framing of one tool schema, likewise."""
BOUND_REQUEST_OVERHEAD: Final = 96
"""The bound's framing once per request (a generation prompt; Llama-3's date lines)."""
BOUND_TOOLS_OVERHEAD: Final = 640
"""The bound's framing once per request that offers tools: the instructions a chat
template writes around the schemas (chatml-function-calling's are 521 bytes)."""

_DIGITS: Final = re.compile(r"\d+")

CHUNK_CHARS: Final = 32_768
"""Longer texts are counted in pieces this long: ``bpe-openai`` refuses a text of 1,000,000
characters or one that makes more than 200,000 tokens, and a character is at most 4 tokens
(its UTF-8 bytes). A cut costs at most a token or two more than the whole text's count."""
_CUT_WINDOW: Final = 1024

SHORT_TEXT_CHARS: Final = 48
"""Texts up to this long have their estimates kept (see :class:`Estimator`)."""
SHORT_TEXT_CACHE: Final = 8192
"""Short texts whose estimates are kept per way of counting (the lot is dropped when full)."""
TOOL_SETS: Final = 16
"""Tool sets whose estimates each :class:`Estimator` keeps (the lot is dropped when full)."""


_NOTHING: Final = Estimate()


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
    encode = vocabulary.encode_ordinary

    def count(text: str) -> int:
        if len(text) <= CHUNK_CHARS:
            return len(encode(text))
        return sum(len(encode(piece)) for piece in _chunks(text))

    return count


def _chunks(text: str) -> Iterator[str]:
    """``text`` in pieces of at most :data:`CHUNK_CHARS`, cut before a space that follows a
    word where there is one near the end of a piece (where tokenizers start a token anyway)."""
    start, end = 0, len(text)
    while end - start > CHUNK_CHARS:
        stop = start + CHUNK_CHARS
        cut = text.rfind(" ", stop - _CUT_WINDOW, stop)
        while cut > start and text[cut - 1].isspace():
            cut -= 1  # a run of spaces stays whole
        if cut <= stop - _CUT_WINDOW:
            cut = stop
        yield text[start:cut]
        start = cut
    yield text[start:]


def text_bound(text: str) -> int:
    """At most how many tokens any byte-fallback tokenizer makes of ``text``: its UTF-8
    bytes, one for a SentencePiece dummy prefix, and the bytes a chat template that escapes
    its text adds: ``"`` becomes ``&#34;`` (llama-cpp-python's chatml-function-calling
    HTML-escapes every message), ``'<>&`` at most ``\\u0027`` (Jinja's ``tojson``)."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    count = text.count
    escaped = 4 * count('"') + 5 * (count("'") + count("<") + count(">") + count("&"))
    return size + 1 + escaped


@functools.cache
def _short_estimates(encoding: Encoding, exact: bool) -> dict[str, Estimate]:
    """The estimates of short texts kept for one way of counting (shared by every model
    that counts that way)."""
    return {}


class Estimator:
    """Estimates prompt pieces for one model.

    Short texts (tool names, call ids, small arguments: up to :data:`SHORT_TEXT_CHARS`)
    recur turn after turn and across runs, tool sets run after run: with the default
    counter their estimates are kept (at most :data:`SHORT_TEXT_CACHE` texts per way of
    counting, :data:`TOOL_SETS` tool sets per estimator; each lot is dropped when full).
    A ``counter`` passed in is called for every text.

    :param counter: counts text in ``encoding`` (default: :func:`bpe_counter`); tests pass
        a spy here.
    """

    __slots__ = (
        "_call_bound",
        "_counter",
        "_message_bound",
        "_short",
        "_tool_sets",
        "calls",
        "encoding",
        "exact",
    )

    def __init__(self, model: str, *, counter: TextCounter | None = None) -> None:
        own = encoding_for(model)
        self.exact = own is not None
        self.encoding: Encoding = own or FALLBACK_ENCODING
        self._counter = counter
        self._short = _short_estimates(self.encoding, self.exact) if counter is None else None
        self._tool_sets: dict[tuple[ToolSpec, ...], tuple[Estimate, int]] | None = (
            {} if counter is None else None
        )
        # The bound's framing (0 for an exact model: no bound is kept).
        self._message_bound = 0 if self.exact else BOUND_MESSAGE_OVERHEAD
        self._call_bound = 0 if self.exact else BOUND_CALL_OVERHEAD
        self.calls = 0
        """How many texts were estimated, counted or found kept (for tests and stats)."""

    def text(self, text: str) -> Estimate:
        """Tokens of ``text``; nothing is counted for an empty text."""
        if not text:
            return _NOTHING
        self.calls += 1
        short = self._short
        if short is not None and len(text) <= SHORT_TEXT_CHARS:
            found = short.get(text)
            if found is None:
                if len(short) >= SHORT_TEXT_CACHE:
                    short.clear()
                found = short[text] = self._estimate(text)
            return found
        return self._estimate(text)

    def _estimate(self, text: str) -> Estimate:
        counter = self._counter
        if counter is None:
            counter = self._counter = bpe_counter(self.encoding)
        base = counter(text)
        if self.exact:
            return Estimate(base, base)
        extra = sum(len(run) - math.ceil(len(run) / 3) for run in _DIGITS.findall(text))
        return Estimate(math.ceil((base + extra) * FALLBACK_MARGIN), base, text_bound(text))

    def message(self, message: ChatMessage) -> Estimate:
        """Tokens of one transcript message with its framing."""
        text = self.text
        tokens = floor = MESSAGE_OVERHEAD
        bound = self._message_bound
        content, parts = message.content, message.parts
        if parts or (content and IMAGE_MARKER in content):  # else no image to take out
            content, parts = message_images(message)
        if content:
            found = text(content)
            tokens += found.tokens
            floor += found.floor
            bound += found.bound
        if parts:  # images priced by their pixel size, never by their URL's characters
            for part in parts:
                match part:
                    case TextPart(text=part_text):
                        found = text(part_text)
                        tokens += found.tokens
                        floor += found.floor
                        bound += found.bound
                    case ImagePart(image_url=image_url):
                        # Only OpenAI's price of a fixed detail is known; other models (and
                        # "auto", which may pick "low") can charge less: no floor then.
                        price = part_tokens(part)
                        tokens += price
                        if self.exact:
                            if image_url.detail != "auto":
                                floor += price
                        else:
                            bound += price
                    case _:
                        assert_never(part)
        if message.name:
            found = text(message.name)
            tokens += found.tokens + 1
            floor += found.floor + 1
            if not self.exact:
                bound += found.bound + 1
        if message.tool_call_id:
            found = text(message.tool_call_id)
            tokens += found.tokens
            floor += found.floor
            bound += found.bound
        for call in message.tool_calls:
            name = text(call.name)
            arguments = text(call.arguments)
            tokens += CALL_OVERHEAD + name.tokens + arguments.tokens
            floor += CALL_OVERHEAD + name.floor + arguments.floor
            bound += self._call_bound + name.bound + arguments.bound
        return Estimate(tokens, floor, bound)

    def tools(self, specs: Iterable[ToolSpec]) -> Estimate:
        """Tokens of the tool schemas sent with every request, plus the request's framing."""
        key = tuple(specs)
        kept = self._tool_sets
        if kept is None:
            return self._tools(key)
        found = kept.get(key)  # runs of a model mostly share their tool set
        if found is None:
            if len(kept) >= TOOL_SETS:
                kept.clear()
            before = self.calls
            found = kept[key] = (self._tools(key), self.calls - before)
        else:
            self.calls += found[1]
        return found[0]

    def _tools(self, specs: tuple[ToolSpec, ...]) -> Estimate:
        tokens = floor = REQUEST_OVERHEAD
        bound = tool_bound = 0
        if not self.exact:
            bound = BOUND_REQUEST_OVERHEAD + (BOUND_TOOLS_OVERHEAD if specs else 0)
            tool_bound = BOUND_TOOL_OVERHEAD
        for spec in specs:
            name = self.text(spec.name)
            description = self.text(spec.description)
            parameters = self.text(spec.parameters)
            tokens += TOOL_OVERHEAD + name.tokens + description.tokens + parameters.tokens
            floor += TOOL_OVERHEAD + name.floor + description.floor + parameters.floor
            bound += tool_bound + name.bound + description.bound + parameters.bound
        return Estimate(tokens, floor, bound)
