"""The settings declaration: where a change to a setting starts (docs/architecture.md).

* Every value a setting may take is a type here, with its range on it (``msgspec.Meta``,
  enforced at decode). Upper bounds are generous for real use, and none lets a setting make
  per-call work unbounded (docs/security.md, "Bounded configuration", generated from them).
* A config file setting is a field of its section (:mod:`orchestrator.config_sections`):
  name, type and range, default, doc line; only the operator sets it.
* A run setting is declared once in :data:`RUN_KEYS`: its type and range (the field of
  :class:`RunSettings`), the config key it defaults to, who may set it from an API request
  and its doc line. The run's defaults, the client policy (:class:`ClientOverrides`, its
  ceilings), what a run carries (``RunStarted``, the conductor's settings) and the
  docs table of a run's keys (``docs/scenarios.md``) derive from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, NamedTuple

import msgspec

from actors.budget.tokens import BudgetMode
from actors.context.policy import RESERVE_MAX, WINDOW_MAX
from actors.hooks import Hook

LoopPreset = Literal["strict", "openclaw", "openclaw-current", "gemini", "qwen", "off"]
OnStop = Literal["keep", "answer"]

DAY: Final = 86_400.0
MAX_OUTPUT_TOKENS: Final = 8_192
"""``model.max_output_tokens``'s default: at most a quarter of a small window is asked for."""
OUTPUT_RESERVE: Final = 4_096
"""``context.output_reserve_tokens``'s default (without ``model.max_output_tokens``)."""
CACHE_HITS_MAX: Final = 10_000
RESULT_CHARS_MAX: Final = 100_000_000
IMAGE_BYTES_MAX: Final = 64 * 1024 * 1024
CONCURRENT_RUNS_MAX: Final = 100_000
RETENTION_MAX: Final = 100 * 365 * DAY

Seconds = Annotated[float, msgspec.Meta(gt=0, le=DAY)]
"""A timeout, deadline or period: above 0, at most a day."""
Grace = Annotated[float, msgspec.Meta(ge=0, le=DAY)]
"""A delay or grace period that may be 0, at most a day."""
Turns = Annotated[int, msgspec.Meta(ge=1, le=10_000)]
ToolCalls = Annotated[int, msgspec.Meta(ge=1, le=100_000)]
ReplyTokens = Annotated[int, msgspec.Meta(ge=1, le=RESERVE_MAX)]
"""One request's ``max_tokens``."""
Reserve = Annotated[int, msgspec.Meta(ge=0, le=RESERVE_MAX)]
Window = Annotated[int, msgspec.Meta(ge=1, le=WINDOW_MAX)]
RunTokens = Annotated[int, msgspec.Meta(ge=1, le=10**12)]
"""Token budgets summed over a run (``max_turns`` requests of up to a window each)."""
Cost = Annotated[float, msgspec.Meta(gt=0, le=1e9)]
Price = Annotated[float, msgspec.Meta(ge=0, le=1e6)]
"""A price per million tokens."""
CacheHits = Annotated[int, msgspec.Meta(ge=0, le=CACHE_HITS_MAX)]
CacheEntries = Annotated[int, msgspec.Meta(ge=0, le=10_000)]
Recoveries = Annotated[int, msgspec.Meta(ge=0, le=100)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]


class _Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every section: immutable, and an unknown key is an error."""


OnCrash = Literal["resume", "abort"]


class RunKey(NamedTuple):
    """The declaration of one run setting (a key of :class:`RunSettings`, whose field is its
    type and range): where its default comes from, who may set it, and its doc line. The
    default, the client policy and the docs table (``docs/scenarios.md``) derive from it."""

    default: str | None
    """The config key whose value is the run's default; ``None``: the field's own default."""
    doc: str
    client: Literal["default", "allowed", "operator"] = "operator"
    """``default``: a request may set it unless the operator says no; ``allowed``: if the
    operator allows it (``daemon.client_overrides.allowed``); ``operator``: never."""
    never: str = ""
    """Why no policy can let a request set it (said in the refusal)."""
    ceiling: bool = False
    """A request may lower it, not raise it past the operator's (:data:`ClientCeilings`)."""


def _capped(default: str, doc: str, client: Literal["default", "allowed"] = "default") -> RunKey:
    return RunKey(default, doc, client, ceiling=True)


_LOOPS: Final = "([loop-detection.md](loop-detection.md))"
_CACHE: Final = "([truncation-and-cache.md](truncation-and-cache.md))"
_NO_PRICE: Final = "prices are the operator's"
RUN_KEYS: Final[dict[str, RunKey]] = {
    "model": RunKey("model.model", "the model the run asks (a scenario: its name)", "default"),
    "max_turns": _capped("budget.max_turns", "turn budget"),
    "max_tool_calls": _capped("budget.max_tool_calls", "tool-call budget"),
    "deadline_seconds": _capped("budget.deadline_seconds", "wall-clock budget"),
    "max_output_tokens": _capped("model.max_output_tokens", "`max_tokens` of a request"),
    "output_token_budget": _capped("budget.max_output_tokens", "completion tokens"),
    "input_token_budget": _capped("budget.max_input_tokens", "prompt tokens, summed"),
    "cost_budget": _capped("budget.max_cost", "cost of the run (needs `[prices]`)"),
    "answer_max_tokens": _capped("budget.answer_max_tokens", "answer's `max_tokens`", "allowed"),
    "budget_mode": RunKey("budget.mode", "`ceiling` or `target`", "allowed"),
    "on_stop": RunKey("budget.on_stop", "`answer`: the answer after a limit", "allowed"),
    "loop_preset": RunKey("loop.preset", f"loop detection preset {_LOOPS}", "default"),
    "loop": RunKey(None, "per-detector overrides merged onto `loop_preset`", "default"),
    "tools": RunKey("tools.enabled", "the tools the run may call", "allowed"),
    "on_crash": RunKey("daemon.on_crash", "after a daemon crash: resume, or end", "default"),
    "escalated_max_tokens": RunKey("model.escalated_max_tokens", "retry after a `length` cut"),
    "truncation_recoveries": RunKey(None, "recovery messages before `truncation.gave_up`"),
    "tool_timeout_seconds": RunKey("tools.timeout_seconds", "a tool call's deadline"),
    "abort_grace_seconds": RunKey("tools.abort_grace_seconds", "tools may finish after an abort"),
    "max_cache_hits": RunKey("tools.max_cache_hits", f"hits per cached result {_CACHE}"),
    "cache_ttl_seconds": RunKey("tools.cache_ttl_seconds", "how long a result is cached"),
    "cache_max_entries": RunKey("tools.cache_max_entries", "cached results (0: no cache)"),
    "context_window": RunKey(None, "the model's window ([context.md](context.md))"),
    "context_safety_buffer": RunKey("context.safety_buffer_tokens", "tokens kept free"),
    "context_output_reserve": RunKey("context.output_reserve_tokens", "kept for the answer"),
    "context_collapse_at": RunKey("context.collapse_at", "share of the limit that folds"),
    "context_keep_turns": RunKey("context.keep_recent_turns", "turns a compaction keeps"),
    "answer_deadline_seconds": RunKey("budget.answer_deadline_seconds", "the answer's deadline"),
    "input_price_per_million": RunKey(None, "from `[prices]`", never=_NO_PRICE),
    "output_price_per_million": RunKey(None, "from `[prices]`", never=_NO_PRICE),
    "hooks": RunKey(
        "hooks",
        "the run's hooks ([hooks.md](hooks.md))",
        never="hooks run commands on the daemon's host: only the operator sets them",
    ),
}
"""Every run setting, once (a test checks the keys are :class:`RunSettings`'s)."""

if TYPE_CHECKING:
    ClientKey = str
else:  # the run settings an operator may let API clients set (docs/security.md)
    ClientKey = Literal[tuple(key for key, run in RUN_KEYS.items() if run.client != "operator")]
DEFAULT_CLIENT_KEYS: Final = tuple(k for k, run in RUN_KEYS.items() if run.client == "default")


class RunSettings(_Settings, frozen=True, kw_only=True):
    """The effective, flat settings of one run: the config's defaults plus run overrides.

    Scenario files and API requests override these keys by name. Each key is declared in
    :data:`RUN_KEYS`; :func:`run_settings` fills every key that has a config section from
    that section, so those keys have no default here: the sections' defaults are the only ones.
    """

    model: str
    max_turns: Turns
    max_tool_calls: ToolCalls
    deadline_seconds: Seconds
    max_output_tokens: ReplyTokens | None
    escalated_max_tokens: ReplyTokens | None
    tools: tuple[str, ...]
    tool_timeout_seconds: Seconds
    abort_grace_seconds: Grace
    truncation_recoveries: Recoveries = 3
    max_cache_hits: CacheHits
    cache_ttl_seconds: Seconds
    cache_max_entries: CacheEntries
    loop_preset: LoopPreset
    context_window: Window | None = None
    context_safety_buffer: Reserve
    context_output_reserve: Reserve
    context_collapse_at: Share
    context_keep_turns: Turns
    hooks: tuple[Hook, ...]
    on_crash: OnCrash
    loop: dict[str, Any] = msgspec.field(default_factory=dict)
    output_token_budget: RunTokens | None
    input_token_budget: RunTokens | None
    cost_budget: Cost | None
    budget_mode: BudgetMode
    input_price_per_million: Price | None = None
    output_price_per_million: Price | None = None
    on_stop: OnStop
    answer_max_tokens: ReplyTokens
    answer_deadline_seconds: Seconds


if TYPE_CHECKING:

    class ClientCeilings(_Settings, frozen=True):
        def __getattr__(self, key: str) -> Any: ...

else:  # a field per run setting declared with a ceiling: its type and range, or unset
    _CEILINGS: Final = [(f.name, f.type | None, None) for f in msgspec.structs.fields(RunSettings)]
    ClientCeilings = msgspec.defstruct(
        "ClientCeilings",
        [field for field in _CEILINGS if RUN_KEYS[field[0]].ceiling],
        bases=(_Settings,),
        module=__name__,
        kw_only=True,
        frozen=True,
    )
    ClientCeilings.__doc__ = """``[daemon.client_overrides.ceilings]``: the most a request
    may ask for (unset: the operator's own value for the run)."""


class ClientOverrides(_Settings, frozen=True, kw_only=True):
    """``[daemon.client_overrides]``: what a request's ``config`` may set (the CLI and the
    library are the operator and may set anything)."""

    allowed: tuple[ClientKey, ...] = DEFAULT_CLIENT_KEYS
    models: tuple[str, ...] = ()
    """Models a request may choose besides ``model.model`` and those named under
    ``[models]`` and ``[prices]``."""
    loop_presets: tuple[LoopPreset, ...] = ("strict", "openclaw", "gemini")
    """Loop presets a request may choose (``off`` turns loop detection off)."""
    ceilings: ClientCeilings = ClientCeilings()
