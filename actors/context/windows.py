"""Which context window and which tokenizer a model name implies.

Names are matched case-insensitively, the whole id first (``models/tiny.gguf``, the id a
llama.cpp server reports), then its last path segment (``openai/gpt-4o`` and
``meta-llama/Llama-3.1-8B`` count as ``gpt-4o`` and ``llama-3.1-8b``), against prefixes: a
prefix matches the whole name or a name that goes on with a separator (``-:._@/`` or a
space), and the longest matching prefix wins, so ``gpt-4`` does not claim ``gpt-4o`` but
claims ``gpt-4-0613``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, TypeVar

__all__ = [
    "DEFAULT_WINDOW",
    "MODEL_ENCODINGS",
    "MODEL_WINDOWS",
    "Encoding",
    "encoding_for",
    "match_model",
    "warn_default_window",
    "window_for",
]

logger = logging.getLogger("loopfuse.context")

Encoding = Literal["o200k_base", "cl100k_base"]

DEFAULT_WINDOW: Final = 32_768
"""Tokens assumed for a model no table names: the window most current open-weight chat
models serve at least. A smaller real window shows up as a refusal (collapse, compaction)
or, on servers that cut silently (Ollama), as a ``silent_truncation`` event."""

MODEL_WINDOWS: Final[Mapping[str, int]] = MappingProxyType(
    {
        # OpenAI
        "gpt-5": 400_000,
        "gpt-4.1": 1_047_576,
        "gpt-4.5": 128_000,
        "gpt-4o": 128_000,
        "chatgpt-4o": 128_000,
        "gpt-4-turbo": 128_000,
        "gpt-4-1106": 128_000,
        "gpt-4-0125": 128_000,
        "gpt-4-32k": 32_768,
        "gpt-4": 8_192,
        "gpt-3.5-turbo": 16_385,
        "gpt-3.5-turbo-instruct": 4_096,
        "gpt-oss": 131_072,
        "o1": 200_000,
        "o1-mini": 128_000,
        "o1-preview": 128_000,
        "o3": 200_000,
        "o3-mini": 200_000,
        "o4-mini": 200_000,
        # DeepSeek (API and open weights)
        "deepseek": 131_072,
        # Qwen: open weights serve 32k natively; the hosted plus/turbo models more
        "qwen": 32_768,
        "qwen2": 32_768,
        "qwen2.5": 32_768,
        "qwen3": 32_768,
        "qwen-plus": 131_072,
        "qwen-turbo": 131_072,
        # Llama: 3 and 3.x
        "llama": 8_192,
        "llama2": 4_096,
        "llama-2": 4_096,
        "llama3": 8_192,
        "llama-3": 8_192,
        "llama3.1": 131_072,
        "llama-3.1": 131_072,
        "llama3.2": 131_072,
        "llama-3.2": 131_072,
        "llama3.3": 131_072,
        "llama-3.3": 131_072,
        "llama4": 131_072,
        "llama-4": 131_072,
        # Mistral
        "mistral": 32_768,
        "mixtral": 32_768,
        "mistral-large": 131_072,
        "mistral-nemo": 131_072,
        # Gemma
        "gemma": 8_192,
        "gemma2": 8_192,
        "gemma-2": 8_192,
        "gemma3": 131_072,
        "gemma-3": 131_072,
        # Others reached through OpenAI-compatible gateways
        "claude": 200_000,
        "gemini": 1_048_576,
    }
)
"""Context windows (tokens) by model-name prefix."""

MODEL_ENCODINGS: Final[Mapping[str, Encoding]] = MappingProxyType(
    {
        "gpt-5": "o200k_base",
        "gpt-4.1": "o200k_base",
        "gpt-4.5": "o200k_base",
        "gpt-4o": "o200k_base",
        "chatgpt-4o": "o200k_base",
        "gpt-oss": "o200k_base",
        "o1": "o200k_base",
        "o3": "o200k_base",
        "o4": "o200k_base",
        "gpt-4": "cl100k_base",
        "gpt-3.5": "cl100k_base",
        "gpt-35": "cl100k_base",
    }
)
"""OpenAI tokenizers by model-name prefix; any other model is estimated (see ``tokens``)."""

_SEPARATORS: Final = frozenset("-:._@/ ")
_V = TypeVar("_V")


def match_model(model: str, table: Mapping[str, _V]) -> _V | None:
    """The value of the longest prefix in ``table`` that names ``model``'s whole id, else
    the longest that names its last path segment, or ``None``."""
    full = model.strip().lower()
    found = _longest(full, table)
    base = full.rsplit("/", 1)[-1]
    if found is None and base != full:
        found = _longest(base, table)
    return None if found is None else table[found]


def _longest(name: str, table: Mapping[str, _V]) -> str | None:
    best: str | None = None
    for key in table:
        prefix = key.lower()
        names_it = name == prefix or (name.startswith(prefix) and name[len(prefix)] in _SEPARATORS)
        if prefix and names_it and (best is None or len(prefix) > len(best)):
            best = key
    return best


def window_for(
    model: str, overrides: Mapping[str, int] | None = None, *, default: int = DEFAULT_WINDOW
) -> int:
    """The context window of ``model``: ``overrides`` (same prefix rules) first, then
    :data:`MODEL_WINDOWS`, then ``default``."""
    found = match_model(model, overrides) if overrides else None
    if found is None:
        found = _builtin_window(model)
    return default if found is None else found


_WARNED: Final[set[str]] = set()
_WARNED_MAX: Final = 1024


def warn_default_window(model: str, default: int) -> None:
    """Log, once per model (per process), that ``model``'s window is unknown."""
    if model in _WARNED or len(_WARNED) >= _WARNED_MAX:
        return
    _WARNED.add(model)
    logger.warning(
        "the context window of model %r is unknown: assuming %s tokens "
        '(set [context.windows] "%s" = N; a server that reports max_model_len, as '
        "vLLM does, replaces this at the first run)",
        model,
        f"{default:,}",
        model,
    )


@functools.lru_cache(maxsize=1024)
def _builtin_window(model: str) -> int | None:
    return match_model(model, MODEL_WINDOWS)


@functools.lru_cache(maxsize=1024)
def encoding_for(model: str) -> Encoding | None:
    """The OpenAI tokenizer ``model`` uses, or ``None`` when it is not an OpenAI model."""
    return match_model(model, MODEL_ENCODINGS)
