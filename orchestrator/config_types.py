"""The value types of the config: each numeric setting's range, on its type (enforced at
decode), and the base of every section. Upper bounds are generous for real use, and none
lets a setting make per-call work unbounded (docs/security.md, "Bounded configuration";
the table there is generated from these types)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from actors.context.policy import (
    RESERVE_MAX,
    WINDOW_MAX,
)

LoopPreset = Literal["strict", "openclaw", "openclaw-current", "gemini", "qwen", "off"]
OnStop = Literal["keep", "answer"]

# Upper bounds of the numeric settings, enforced at decode: generous for real use, and
# none lets a setting make per-call work unbounded (docs/security.md, "Bounded
# configuration"; the table there is generated from these types).
DAY: Final = 86_400.0
MAX_OUTPUT_TOKENS: Final = 8_192
"""``model.max_output_tokens``'s default: at most a quarter of a small window is asked for."""
OUTPUT_RESERVE: Final = 4_096
"""``context.output_reserve_tokens``'s default (without ``model.max_output_tokens``)."""
TURNS_MAX: Final = 10_000
TOOL_CALLS_MAX: Final = 100_000
RUN_TOKENS_MAX: Final = 10**12
"""Token budgets summed over a run (``max_turns`` requests of up to a window each)."""
COST_MAX: Final = 1e9
PRICE_MAX: Final = 1e6
"""A price per million tokens."""
RECOVERIES_MAX: Final = 100
CACHE_HITS_MAX: Final = 10_000
CACHE_ENTRIES_MAX: Final = 10_000
RESULT_CHARS_MAX: Final = 100_000_000
IMAGE_BYTES_MAX: Final = 64 * 1024 * 1024
CONCURRENT_RUNS_MAX: Final = 100_000
RETENTION_MAX: Final = 100 * 365 * DAY

Seconds = Annotated[float, msgspec.Meta(gt=0, le=DAY)]
"""A timeout, deadline or period: above 0, at most a day."""
Grace = Annotated[float, msgspec.Meta(ge=0, le=DAY)]
"""A delay or grace period that may be 0, at most a day."""
Turns = Annotated[int, msgspec.Meta(ge=1, le=TURNS_MAX)]
ToolCalls = Annotated[int, msgspec.Meta(ge=1, le=TOOL_CALLS_MAX)]
ReplyTokens = Annotated[int, msgspec.Meta(ge=1, le=RESERVE_MAX)]
"""One request's ``max_tokens``."""
Reserve = Annotated[int, msgspec.Meta(ge=0, le=RESERVE_MAX)]
Window = Annotated[int, msgspec.Meta(ge=1, le=WINDOW_MAX)]
RunTokens = Annotated[int, msgspec.Meta(ge=1, le=RUN_TOKENS_MAX)]
Cost = Annotated[float, msgspec.Meta(gt=0, le=COST_MAX)]
Price = Annotated[float, msgspec.Meta(ge=0, le=PRICE_MAX)]
CacheHits = Annotated[int, msgspec.Meta(ge=0, le=CACHE_HITS_MAX)]
CacheEntries = Annotated[int, msgspec.Meta(ge=0, le=CACHE_ENTRIES_MAX)]
Recoveries = Annotated[int, msgspec.Meta(ge=0, le=RECOVERIES_MAX)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]


class _Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


OnCrash = Literal["resume", "abort"]
