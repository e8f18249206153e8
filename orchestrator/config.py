"""Typed configuration: a TOML file, then ``LOOPFUSE_*`` environment overrides, then defaults.

A nested key is written ``LOOPFUSE_SECTION__KEY`` in the environment (``LOOPFUSE_BUDGET__
MAX_TURNS=5``); values are read as TOML scalars (``5``, ``true``, ``"text"``) and as plain
text otherwise. Every bad key or value fails at load time with a :class:`ConfigError` that
names the key and the reason. Secrets never live here: the API key is read from the
environment variable named by ``model.api_key_env`` when the endpoint is opened.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, NamedTuple, TypeVar

import msgspec

from actors.budget.tokens import BudgetMode
from actors.context import (
    DEFAULT_WINDOW,
    SAFETY_BUFFER,
    ContextPolicy,
    match_model,
    policy_problems,
    warn_default_window,
    window_for,
)
from actors.context.policy import (
    OUTPUT_SHARE,
    RESERVE_MAX,
    SAFETY_SHARE,
    WINDOW_MAX,
    scaled_reserve,
)
from actors.hooks import Hook
from actors.llm.settings import (
    TOOL_CHOICE_MODES,
    EndpointLimits,
    RequestOptions,
    Seed,
    Temperature,
    ToolChoice,
)
from actors.loop import LoopConfig, LoopConfigError, ResultPattern, check_config
from actors.loop.config import PATTERNS_MAX, compile_pattern
from actors.tools.cache import DEFAULT_CACHE_SETTINGS
from actors.tools.limits import FigureSandbox, ToolExecutorSettings
from actors.tools.mcp import INSTALL_HINT, McpServer, mcp_installed
from orchestrator.config_ranges import range_at
from orchestrator.errors import ConfigError

__all__ = [
    "RUN_KEYS",
    "BudgetSettings",
    "ClientCeilings",
    "ClientOverrides",
    "Config",
    "ContextSettings",
    "DaemonSettings",
    "FleetSettings",
    "LoopSettings",
    "McpSettings",
    "ModelCapabilities",
    "ModelPrice",
    "ModelSettings",
    "RunKey",
    "RunSettings",
    "RuntimeSettings",
    "ToolSettings",
    "TracingSettings",
    "check_tool_choice",
    "context_policy",
    "load_config",
    "merge_loop_overrides",
    "model_reads_images",
    "request_options",
    "run_settings",
]

ENV_PREFIX: Final = "LOOPFUSE_"
ENV_CONFIG_FILE: Final = "LOOPFUSE_CONFIG"
ENV_NOT_CONFIG: Final = frozenset(
    {
        ENV_CONFIG_FILE,
        "LOOPFUSE_URL",
        "LOOPFUSE_TOKEN",
        "LOOPFUSE_API_TOKENS",
        "LOOPFUSE_OPERATOR_TOKENS",
    }
)
"""Variables with the prefix that are not config keys: the config file, the daemon's API
tokens (``daemon.token_env``) and the URL and token its command-line clients use."""

LoopPreset = Literal["strict", "openclaw", "openclaw-current", "gemini", "qwen", "off"]
Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
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


class ModelSettings(EndpointLimits, frozen=True, kw_only=True):
    """The model endpoint. With no ``base_url`` the embedded simulator serves the runs.

    Its timeouts, retries and deadline (``timeout_seconds`` … ``call_deadline_seconds``),
    with their defaults and ranges, are the LLM caller's :class:`EndpointLimits`."""

    base_url: str | None = None
    model: str = "completed"
    api_key_env: str = "OPENAI_API_KEY"
    max_output_tokens: ReplyTokens | None = MAX_OUTPUT_TOKENS
    """``max_tokens`` of one request (``None``: send none, the server decides)."""
    escalated_max_tokens: ReplyTokens | None = 65536
    """A reply cut by ``max_output_tokens`` is retried once, silently, with this limit."""
    stream: bool = True
    """Stream replies (``false``: ask for whole completions)."""
    tool_choice: ToolChoice = "auto"
    """Sent beside the tools (only to requests that offer tools): ``"auto"``, ``"none"``,
    ``"required"``, or a tool's name to force that tool. A name must be among the run's
    tools (checked when a run starts)."""
    reset_tool_choice: bool = True
    """Once the model has called a tool, send ``"auto"`` instead of a forcing choice
    (``"required"`` or a name), so a forced call cannot repeat forever."""
    temperature: Temperature | None = None
    """Sampling temperature sent with every request (unset: none is sent)."""
    seed: Seed | None = None
    """Sampling seed sent with every request, for servers that honour one (unset: none)."""


class BudgetSettings(_Settings, frozen=True, kw_only=True):
    """Hard limits of one run; any of them ends it with ``max_turns``."""

    max_turns: Turns = 20
    max_tool_calls: ToolCalls = 100
    deadline_seconds: Seconds = 600.0
    max_output_tokens: RunTokens | None = None
    """Completion tokens of the whole run (``model.max_output_tokens`` caps one reply)."""
    max_input_tokens: RunTokens | None = None
    """Prompt tokens summed over the run's requests."""
    max_cost: Cost | None = None
    """In the currency of ``[prices]``; needs a price for the run's model."""
    mode: BudgetMode = "ceiling"
    """``target``: ``max_output_tokens`` is a volume to reach (continue below 90%)."""
    on_stop: OnStop = "keep"
    """``answer``: after a budget or loop stop, one last model call without tools."""
    answer_max_tokens: ReplyTokens = 1024
    answer_deadline_seconds: Seconds = 60.0


class ModelPrice(_Settings, frozen=True, kw_only=True):
    """A model's price per million tokens (``[prices."gpt-4o"]``), for cost budgets."""

    input_per_million: Price
    output_per_million: Price


class ModelCapabilities(_Settings, frozen=True, kw_only=True):
    """What a model can do, by its exact name (``[models."gpt-4o"]``)."""

    vision: bool = False
    """It reads images: the report workflow offers ``read_image`` to its explore stage."""
    stream: bool | None = None
    """``model.stream`` for this model (unset: ``[model]``'s)."""
    tool_choice: ToolChoice | None = None
    """``model.tool_choice`` for this model (unset: ``[model]``'s)."""
    reset_tool_choice: bool | None = None
    """``model.reset_tool_choice`` for this model (unset: ``[model]``'s)."""


class LoopSettings(_Settings, frozen=True, kw_only=True):
    """Loop detection: a named preset (``off`` turns the loop monitor off for a run)."""

    preset: LoopPreset = "strict"
    result_patterns: Annotated[
        tuple[ResultPattern, ...], msgspec.Meta(max_length=PATTERNS_MAX)
    ] = ()
    """More result normalisation patterns (``{pattern, replacement}``), for every run;
    operator config only (a run's ``loop`` table may not set them)."""
    llm_check_model: str = ""
    """The model the model-based loop check asks (``loop.llm_check``, off unless a run's
    ``loop`` table or preset turns it on); empty: the run's own model. Operator config only."""

    def __post_init__(self) -> None:
        for index, item in enumerate(self.result_patterns):
            try:
                compile_pattern(f"result_patterns.{index}.pattern", item.pattern)
            except LoopConfigError as exc:
                raise ValueError(str(exc)) from None


_EXECUTOR: Final = ToolExecutorSettings()
"""The tool executor's defaults, which ``[tools]`` takes as its own (as it takes the
result cache's, ``DEFAULT_CACHE_SETTINGS``)."""


class ToolSettings(_Settings, frozen=True, kw_only=True):
    """Which tools a run gets and where they may read."""

    folder: str | None = None
    enabled: tuple[str, ...] = ("list_dir", "read_file", "finish_exploration")
    timeout_seconds: Seconds = _EXECUTOR.default_timeout_seconds
    abort_grace_seconds: Grace = 5.0
    max_cache_hits: CacheHits = DEFAULT_CACHE_SETTINGS.max_hits
    """An idempotent tool's cached result is reused this often; the next identical call
    stops the run (``loop.cache_hits``)."""
    cache_ttl_seconds: Seconds = DEFAULT_CACHE_SETTINGS.ttl_seconds
    """How long a cached result is served before the tool runs again."""
    cache_max_entries: CacheEntries = DEFAULT_CACHE_SETTINGS.max_entries
    """Cached results kept per run (least recently used evicted first); 0 turns the cache off."""
    max_result_chars: Annotated[int, msgspec.Meta(ge=1, le=RESULT_CHARS_MAX)] = (
        _EXECUTOR.max_result_chars
    )
    """A tool result longer than this is cut, with a note saying how much was left out."""
    image_max_bytes: Annotated[int, msgspec.Meta(ge=1, le=IMAGE_BYTES_MAX)] = (
        _EXECUTOR.limits.image_max_bytes
    )
    """``read_image`` refuses larger files. An image travels base64-encoded in its tool
    result, so it must fit ``max_result_chars`` (4/3 of its size, plus about 1,000)."""
    figure_sandbox: FigureSandbox = _EXECUTOR.limits.figure_sandbox
    """How ``make_figure`` runs model-written code: ``"bubblewrap"`` (an OS sandbox; the
    tool is refused where bubblewrap cannot run) or ``"unsafe-process"`` (a plain child
    process, no isolation: the operator's explicit opt-out, logged at start-up)."""


class RuntimeSettings(_Settings, frozen=True, kw_only=True):
    """How many runs one runtime runs at once, and how the process keeps its heap."""

    max_concurrent_runs: Annotated[int, msgspec.Meta(ge=1, le=CONCURRENT_RUNS_MAX)] = 64
    freeze_heap: bool = True
    """At the first runtime's start, move the heap of the process (modules, the
    tokenizer) out of the cycle collector's reach (``gc.freeze``): full collections then
    walk only the runs' objects (``docs/performance.md``)."""


_POLICY: Final = ContextPolicy(window=DEFAULT_WINDOW)
"""The context gatekeeper's defaults, which ``[context]`` takes as its own."""


class ContextSettings(_Settings, frozen=True, kw_only=True):
    """The context gatekeeper: each model's window and what is kept free of it
    (``docs/context.md``). A request is sent only if its prompt estimate is at most
    ``window - safety_buffer_tokens - output reservation``."""

    default_window: Window = DEFAULT_WINDOW
    """Tokens of a model that neither ``windows`` nor the built-in table names."""
    windows: dict[str, Window] = {}
    """Model-name prefix → context window in tokens (``"gpt-4o" = 128000``), consulted
    before the built-in table (``actors.context.MODEL_WINDOWS``)."""
    safety_buffer_tokens: Reserve = SAFETY_BUFFER
    output_reserve_tokens: Reserve = OUTPUT_RESERVE
    """Reserved for the answer when ``model.max_output_tokens`` is not set (else that)."""
    collapse_at: Share = _POLICY.collapse_at
    """Fold old tool results once the estimate passes this share of the limit; 0: only
    after the endpoint refused a prompt."""
    collapse_to: Annotated[float, msgspec.Meta(gt=0, le=1)] = _POLICY.collapse_to
    """…until it is below this share of the limit."""
    keep_recent_turns: Turns = _POLICY.keep_recent_turns
    """Turns a compaction keeps word for word."""
    fold_min_chars: Annotated[int, msgspec.Meta(ge=1, le=RESULT_CHARS_MAX)] = _POLICY.fold_min_chars
    summary_max_tokens: ReplyTokens = _POLICY.summary_max_tokens
    silent_truncation_ratio: Annotated[float, msgspec.Meta(gt=0, lt=1)] = (
        _POLICY.silent_truncation_ratio
    )
    """Reported prompt tokens below this share of the estimate are flagged as a silent
    truncation (an event, not a stop)."""
    tool_result_share: Share = _POLICY.tool_result_share
    """The tool results of one turn the model has not answered yet may take together at most
    this share of the room the system prompt, task and tool schemas leave under the limit;
    past it they are cut to fit, each with a note on how to read the rest (0: never cut)."""


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


_BUDGETS: Final = "([budgets.md](budgets.md))"
_CONTEXT: Final = "the context gatekeeper ([context.md](context.md))"
_CACHE: Final = "the idempotent result cache ([truncation-and-cache.md](truncation-and-cache.md))"
RUN_KEYS: Final[dict[str, RunKey]] = {
    "model": RunKey("model.model", "the model the run asks (a scenario: its name)", "default"),
    "max_turns": RunKey("budget.max_turns", "turn budget (`budget.max_turns`)", "default"),
    "max_tool_calls": RunKey("budget.max_tool_calls", "tool-call budget", "default"),
    "deadline_seconds": RunKey("budget.deadline_seconds", "wall-clock budget", "default"),
    "max_output_tokens": RunKey(
        "model.max_output_tokens", "`max_tokens` of each request (not a budget)", "default"
    ),
    "output_token_budget": RunKey(
        "budget.max_output_tokens", f"completion tokens of the run {_BUDGETS}", "default"
    ),
    "input_token_budget": RunKey(
        "budget.max_input_tokens", "prompt tokens summed over the run", "default"
    ),
    "cost_budget": RunKey("budget.max_cost", "cost of the run (needs `[prices]`)", "default"),
    "answer_max_tokens": RunKey(
        "budget.answer_max_tokens", "`max_tokens` of the last answer", "allowed"
    ),
    "budget_mode": RunKey("budget.mode", "`ceiling` or `target`", "allowed"),
    "on_stop": RunKey(
        "budget.on_stop", f"`answer`: one last answer after a limit {_BUDGETS}", "allowed"
    ),
    "loop_preset": RunKey(
        "loop.preset", "loop detection preset ([loop-detection.md](loop-detection.md))", "default"
    ),
    "loop": RunKey(None, "per-detector overrides merged onto `loop_preset`", "default"),
    "tools": RunKey("tools.enabled", "the tools the run may call", "allowed"),
    "on_crash": RunKey("daemon.on_crash", "after a daemon crash: resume, or end", "default"),
    "escalated_max_tokens": RunKey(
        "model.escalated_max_tokens", "the silent retry's `max_tokens` after a `length` cut"
    ),
    "truncation_recoveries": RunKey(None, "recovery messages before `truncation.gave_up`"),
    "tool_timeout_seconds": RunKey("tools.timeout_seconds", "a tool call's deadline"),
    "abort_grace_seconds": RunKey(
        "tools.abort_grace_seconds", "how long running tools may finish after an abort"
    ),
    "max_cache_hits": RunKey("tools.max_cache_hits", f"hits per cached result; {_CACHE}"),
    "cache_ttl_seconds": RunKey("tools.cache_ttl_seconds", "how long a result is cached"),
    "cache_max_entries": RunKey("tools.cache_max_entries", "cached results (0: no cache)"),
    "context_window": RunKey(None, f"the model's window (unset: by model name); {_CONTEXT}"),
    "context_safety_buffer": RunKey("context.safety_buffer_tokens", "tokens kept free"),
    "context_output_reserve": RunKey(
        "context.output_reserve_tokens", "reserved for the answer without `max_output_tokens`"
    ),
    "context_collapse_at": RunKey("context.collapse_at", "share of the limit that folds"),
    "context_keep_turns": RunKey("context.keep_recent_turns", "turns a compaction keeps"),
    "answer_deadline_seconds": RunKey(
        "budget.answer_deadline_seconds", "deadline of the last answer"
    ),
    "input_price_per_million": RunKey(
        None, "prices for the cost budget (from `[prices]`)", never="prices are the operator's"
    ),
    "output_price_per_million": RunKey(
        None, "prices for the cost budget (from `[prices]`)", never="prices are the operator's"
    ),
    "hooks": RunKey(
        "hooks",
        "the run's hooks, replacing the config's ([hooks.md](hooks.md))",
        never="hooks run commands on the daemon's host: only the operator sets them",
    ),
}
"""Every run setting, once (a test checks the keys are :class:`RunSettings`'s)."""

CLIENT_KEYS: Final = tuple(key for key, run in RUN_KEYS.items() if run.client != "operator")
if TYPE_CHECKING:
    ClientKey = str
else:
    ClientKey = Literal[CLIENT_KEYS]
"""The run settings an operator may let API clients set (``docs/security.md``)."""
DEFAULT_CLIENT_KEYS: Final = tuple(k for k, run in RUN_KEYS.items() if run.client == "default")


class ClientCeilings(_Settings, frozen=True, kw_only=True):
    """``[daemon.client_overrides.ceilings]``: the most a request may ask for. Unset: the
    operator's own value for the run (a request may lower a budget, never raise it)."""

    max_turns: Turns | None = None
    max_tool_calls: ToolCalls | None = None
    deadline_seconds: Seconds | None = None
    max_output_tokens: ReplyTokens | None = None
    output_token_budget: RunTokens | None = None
    input_token_budget: RunTokens | None = None
    cost_budget: Cost | None = None
    answer_max_tokens: ReplyTokens | None = None


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


_HOST_NAME: Final = r"^(\*|[^\s:\[\]/]+(:[0-9]*)?|\[[0-9A-Fa-f:.]+\](:[0-9]*)?)$"
"""A ``Host`` name as ``daemon.allowed_hosts`` takes it: ``name``, ``name:port``, ``[v6]``,
or ``*``."""


class DaemonSettings(_Settings, frozen=True, kw_only=True):
    """``loopfuse serve``: where it listens, who may call it, its limits and its store.

    API tokens are never in the file: ``token_env`` names the environment variable that
    holds them (comma-separated); with none set, the API is open (bind to loopback only).
    """

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8470
    token_env: str = "LOOPFUSE_API_TOKENS"
    operator_token_env: str = "LOOPFUSE_OPERATOR_TOKENS"
    """The variable holding the operator's tokens (``POST /v1/replay``, docs/replay.md)."""
    metrics_auth: bool = False
    queue_size: Annotated[int, msgspec.Meta(ge=0, le=CONCURRENT_RUNS_MAX)] = 256
    retry_after_seconds: Annotated[int, msgspec.Meta(ge=1, le=3_600)] = 2
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1, le=1024 * 1024 * 1024)] = 1_048_576
    max_task_chars: Annotated[int, msgspec.Meta(ge=1, le=100_000_000)] = 200_000
    """The longest ``task``, ``system``, ``pipeline.goal``, ``folder`` or ``scenario`` a
    request may carry, in characters (longer: 422). Library and CLI runs have no such limit."""
    max_folder_chars: Annotated[int, msgspec.Meta(ge=1, le=65_536)] = 4096
    """The longest ``folder`` a request may name, in characters (longer: 422, before any
    path is resolved)."""
    event_cap: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 20_000
    memory_tail_events: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 512
    """Committed events per run kept in memory for event streams (the newest; 0: none, every
    stream reads the store)."""
    memory_tail_bytes: Annotated[int, msgspec.Meta(ge=0, le=16 * 1024**3)] = 64 * 1024**2
    """Bytes of events kept in memory over all runs; past it the oldest go (streams then
    read them from the store)."""
    heartbeat_seconds: Seconds = 15.0
    drain_seconds: Grace = 20.0
    store_path: str = ""
    """The SQLite file; empty: ``$XDG_STATE_HOME/loopfuse/daemon.db``."""
    retention_seconds: Annotated[float, msgspec.Meta(gt=0, le=RETENTION_MAX)] = 7 * 24 * 3600.0
    retention_max_runs: Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)] = 100_000
    on_crash: OnCrash = "resume"
    """What a restart does with a run that was running: resume it from its last completed
    turn, or end it (``abort.crash``). A run's ``config.on_crash`` overrides it."""
    scenarios: tuple[str, ...] = ()
    """Scenario files served besides the shipped ones (``{"scenario": NAME}`` runs)."""
    folder_roots: tuple[Annotated[str, msgspec.Meta(pattern="^/")], ...] = ()
    """Absolute folders whose insides a request's ``folder`` may name; none: a request
    may not name a folder at all."""
    client_overrides: ClientOverrides = ClientOverrides()
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024, le=16 * 1024 * 1024)] = 32_768
    """The longest request line plus headers, in bytes (longer: 431, connection closed)."""
    max_headers: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 100
    """The most header lines a request may carry (more: 431, connection closed)."""
    header_timeout_seconds: Seconds = 10.0
    """A request's head must arrive within this of the connection opening (or of its first
    byte on a kept-alive connection); else 408 and the connection is closed."""
    body_timeout_seconds: Seconds = 30.0
    """A request's whole body must arrive within this of its head; else the connection is
    closed."""
    keep_alive_seconds: Annotated[int, msgspec.Meta(ge=1, le=3_600)] = 5
    """An idle kept-alive connection is closed after this many seconds."""
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1024
    """Open connections in all (event streams included); past it a new one gets 503."""
    max_connections_per_client: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 256
    """Open connections from one client address; past it a new one gets 503."""
    allowed_hosts: tuple[Annotated[str, msgspec.Meta(pattern=_HOST_NAME)], ...] = ()
    """Names a request's ``Host`` header may carry besides ``localhost``, IP addresses and
    ``host`` (any port); ``"*"``: any (no DNS-rebinding defence). Other names, or none: 400."""
    cors_origins: tuple[Annotated[str, msgspec.Meta(pattern=r"^(\*|https?://[^/\s]+)$")], ...] = ()
    """Origins (``https://dash.example``) a browser page may call the API from; none (the
    default): no CORS headers, so browsers keep other sites' pages out."""
    max_page_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1024 * 1024 * 1024)] = 1_048_576
    """``GET /v1/runs`` stops a page before its answer passes this many bytes (the rest
    is on the next page, through ``next_cursor``)."""


class FleetSettings(_Settings, frozen=True, kw_only=True):
    """``[cluster]``: join a fleet of daemons on NATS JetStream (``docs/scale-out.md``).

    With ``nats_url`` empty (the default) the daemon is single-node (SQLite, in-process
    queue). Every daemon of a fleet uses the same ``fleet`` name, from which the streams,
    subjects and buckets are named.
    """

    nats_url: str = ""
    fleet: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]+$")] = "loopfuse"
    node_name: str = ""
    """This daemon's name in the fleet; empty: a random one."""
    ack_wait_seconds: Seconds = 30.0
    """A taken run is delivered again if its daemon has not signalled progress for this long."""
    node_ttl_seconds: Seconds = 15.0
    """A daemon without a heartbeat for this long is dead: its runs are taken over."""


SPAN_QUEUE_MAX: Final = 1_000_000


class TracingSettings(_Settings, frozen=True, kw_only=True):
    """``[tracing]``: OpenTelemetry spans of every run, exported over OTLP/HTTP
    (``docs/tracing.md``; needs the ``otel`` extra). Operator-only: no request sets these.

    A key left unset falls back to the standard ``OTEL_*`` variable the SDK reads.
    """

    enabled: bool = False
    endpoint: Annotated[str, msgspec.Meta(pattern=r"^(https?://.+)?$")] = ""
    """The OTLP/HTTP traces URL (``http://host:4318/v1/traces``); empty:
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` +
    ``/v1/traces``, else ``http://localhost:4318/v1/traces``."""
    service_name: str = ""
    """The resource's ``service.name``; empty: ``OTEL_SERVICE_NAME``, else ``loopfuse``."""
    capture_content: bool = False
    """Put prompts, replies, tool arguments and results, nudge texts and stop details on
    the spans (off by default, as the GenAI conventions advise: they may hold anything)."""
    queue_size: Annotated[int, msgspec.Meta(ge=1, le=SPAN_QUEUE_MAX)] | None = None
    """Finished spans waiting for export at most (beyond: dropped and counted); unset:
    ``OTEL_BSP_MAX_QUEUE_SIZE``, else 2048."""
    export_delay_seconds: Annotated[float, msgspec.Meta(gt=0, le=3_600)] | None = None
    """The longest a finished span waits before its batch is sent; unset:
    ``OTEL_BSP_SCHEDULE_DELAY``, else 5 s."""
    provider_name: Annotated[str, msgspec.Meta(max_length=64, pattern=r"^[a-z0-9_.]*$")] = ""
    """``gen_ai.provider.name`` of the chat and run spans; empty: derived from
    ``model.base_url`` (``api.openai.com``: ``openai``, ``api.deepseek.com``: ``deepseek`` …,
    another host: ``openai_compatible``, no endpoint: ``loopfuse.simulator``)."""


class McpSettings(_Settings, frozen=True, kw_only=True):
    """``[mcp]``: the MCP servers whose tools the runtime offers (``docs/mcp.md``; needs the
    ``mcp`` extra). Operator-only: a run gets the tools its ``tools`` setting names, and a
    request can never add one."""

    servers: tuple[McpServer, ...] = ()
    """``[[mcp.servers]]``: started with the runtime, their tools listed then."""

    def __post_init__(self) -> None:
        names = [server.name for server in self.servers]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"server names must be unique; used more than once: {twice}")


class Config(_Settings, frozen=True, kw_only=True):
    """Everything loopfuse reads at start."""

    model: ModelSettings = ModelSettings()
    budget: BudgetSettings = BudgetSettings()
    tools: ToolSettings = ToolSettings()
    loop: LoopSettings = LoopSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    context: ContextSettings = ContextSettings()
    prices: dict[str, ModelPrice] = {}
    models: dict[str, ModelCapabilities] = {}
    """``[models."<name>"]``: per-model capabilities (``vision``); unnamed models have none."""
    daemon: DaemonSettings = DaemonSettings()
    cluster: FleetSettings = FleetSettings()
    tracing: TracingSettings = TracingSettings()
    mcp: McpSettings = McpSettings()
    hooks: tuple[Hook, ...] = ()
    """``[[hooks]]``: every run's hooks unless a run sets its own (``docs/hooks.md``)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"


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
    loop: dict[str, Any] = {}
    output_token_budget: RunTokens | None
    input_token_budget: RunTokens | None
    cost_budget: Cost | None
    budget_mode: BudgetMode
    input_price_per_million: Price | None = None
    output_price_per_million: Price | None = None
    on_stop: OnStop
    answer_max_tokens: ReplyTokens
    answer_deadline_seconds: Seconds


_S = TypeVar("_S", bound=msgspec.Struct)

_AT_PATH = re.compile(r"^(?P<reason>.*?) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


def _convert(data: Mapping[str, Any], kind: type[_S], *, prefix: str, source: str | None) -> _S:
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise _config_error(str(exc), prefix=prefix, source=source, kind=kind) from None


def _choices(kind: type[msgspec.Struct], key: str) -> tuple[object, ...]:
    """The values a ``Literal`` field at dotted ``key`` of ``kind`` allows (else empty)."""
    node: Any = kind
    for part in key.split("."):
        if part.isdigit() and typing.get_origin(node) is tuple:  # an item of a list
            node = typing.get_args(node)[0]
            continue
        fields = getattr(node, "__struct_fields__", None)
        if fields is None or part not in fields:
            return ()
        node = typing.get_type_hints(node)[part]
    for candidate in (node, *typing.get_args(node)):
        if typing.get_origin(candidate) is Literal:
            return typing.get_args(candidate)
    return ()


def _config_error(
    message: str, *, prefix: str, source: str | None, kind: type[msgspec.Struct] | None = None
) -> ConfigError:
    reason, path = message, ""
    match = _AT_PATH.match(message)
    if match:
        reason, path = match["reason"], match["path"]
    key = path.lstrip(".").replace("[", ".").replace("]", "")
    unknown = _UNKNOWN.match(reason)
    if unknown:
        key = f"{key}.{unknown['field']}" if key else unknown["field"]
        reason = "unknown key"
    if reason.startswith("Invalid enum value") and kind is not None:
        choices = _choices(kind, key)
        if choices:
            reason += f" (one of: {', '.join(repr(c) for c in choices)})"
    elif reason.startswith("Expected `") and kind is not None:
        bounds = range_at(kind, key)
        if bounds is not None and bounds.bounded:
            reason += f" ({bounds.describe()})"
    full_key = ".".join(part for part in (prefix, key) if part) or "(root)"
    return ConfigError(full_key, reason, source=source)


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_environment(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_CONFIG:
            continue
        parts = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            raise ConfigError(name, "malformed variable name (empty key part)", source="env")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(".".join(parts), "is not a section", source=f"env {name}")
            node = child
        node[parts[-1]] = _env_value(text)


def load_config(
    path: str | Path | None = None, *, environ: Mapping[str, str] | None = None
) -> Config:
    """Load the config file (``path``, else ``$LOOPFUSE_CONFIG``, else none) plus the env.

    :raises ConfigError: a key is unknown or its value is invalid; names the key and why.
    """
    environ = os.environ if environ is None else environ
    path = path or environ.get(ENV_CONFIG_FILE) or None
    data: dict[str, Any] = {}
    source = None
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError("(file)", "file not found", source=source) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("(file)", f"not valid TOML: {exc}", source=source) from None
    _apply_environment(data, environ)
    _check_context_windows(data.get("context"), source=source or "env")
    _check_prices(data.get("prices"), source=source or "env")
    _check_models(data.get("models"), source=source or "env")
    config = _convert(data, Config, prefix="", source=source or "env")
    if config.mcp.servers and not mcp_installed():
        raise ConfigError("mcp.servers", INSTALL_HINT, source=source or "env")
    return config


def _check_prices(prices: Any, *, source: str) -> None:
    """Check each ``[prices."<model>"]`` table alone, so an error names its model."""
    if isinstance(prices, Mapping):
        for model, price in prices.items():
            _convert(price, ModelPrice, prefix=f'prices."{model}"', source=source)


def _check_models(models: Any, *, source: str) -> None:
    """Check each ``[models."<name>"]`` table alone, so an error names its model."""
    if isinstance(models, Mapping):
        for model, capabilities in models.items():
            _convert(capabilities, ModelCapabilities, prefix=f'models."{model}"', source=source)


def model_reads_images(config: Config, model: str) -> bool:
    """Whether ``[models."<model>"]`` says ``vision = true`` (default: no)."""
    capabilities = config.models.get(model)
    return capabilities is not None and capabilities.vision


def request_options(config: Config) -> tuple[RequestOptions, dict[str, RequestOptions]]:
    """How requests are shaped: ``[model]``'s options, and each ``[models."<id>"]`` that
    sets one of them (its unset keys ``[model]``'s)."""
    model = config.model
    default = RequestOptions(
        stream=model.stream,
        tool_choice=model.tool_choice,
        reset_tool_choice=model.reset_tool_choice,
        temperature=model.temperature,
        seed=model.seed,
    )
    own: dict[str, RequestOptions] = {}
    for name, caps in config.models.items():
        if caps.stream is None and caps.tool_choice is None and caps.reset_tool_choice is None:
            continue
        own[name] = RequestOptions(
            stream=default.stream if caps.stream is None else caps.stream,
            tool_choice=default.tool_choice if caps.tool_choice is None else caps.tool_choice,
            reset_tool_choice=default.reset_tool_choice
            if caps.reset_tool_choice is None
            else caps.reset_tool_choice,
            temperature=default.temperature,
            seed=default.seed,
        )
    return default, own


def check_tool_choice(config: Config, model: str, tools: tuple[str, ...]) -> None:
    """A ``tool_choice`` naming a tool must name one of a run's ``tools`` (nothing is sent
    to a run without tools, so nothing is checked).

    :raises ConfigError: naming the key that set it (``model.tool_choice`` or
        ``models."<model>".tool_choice``).
    """
    caps = config.models.get(model)
    key = f'models."{model}".tool_choice'
    choice = caps.tool_choice if caps is not None else None
    if choice is None:
        key, choice = "model.tool_choice", config.model.tool_choice
    if not tools or choice in TOOL_CHOICE_MODES or choice in tools:
        return
    raise ConfigError(
        key,
        f"names the tool {choice!r}, which is not among the run's tools "
        f"({', '.join(tools)}); use one of them, or 'auto', 'none' or 'required'",
    )


def _with_prices(config: Config, settings: RunSettings, *, source: str) -> RunSettings:
    """``settings`` with the run model's prices filled in; a cost budget needs them."""
    price = config.prices.get(settings.model)
    if price is not None:
        settings = msgspec.structs.replace(
            settings,
            input_price_per_million=(
                price.input_per_million
                if settings.input_price_per_million is None
                else settings.input_price_per_million
            ),
            output_price_per_million=(
                price.output_per_million
                if settings.output_price_per_million is None
                else settings.output_price_per_million
            ),
        )
    if settings.cost_budget is not None and (
        settings.input_price_per_million is None or settings.output_price_per_million is None
    ):
        raise ConfigError(
            f'prices."{settings.model}"',
            f"a cost budget needs the price of model {settings.model!r}: set "
            "input_per_million and output_per_million",
            source=source,
        )
    return settings


_CONTEXT_KEYS: Final = {
    "window": "config.context_window",
    "safety_buffer": "config.context_safety_buffer",
    "output_reserve": "config.context_output_reserve",
    "collapse_at": "config.context_collapse_at",
    "keep_recent_turns": "config.context_keep_turns",
}


def context_policy(config: Config, settings: RunSettings) -> ContextPolicy:
    """The context limits of a run: its window (``context_window``, else by model name
    from ``[context]``) and the room kept free of it: the safety buffer and the output
    reservation; at their defaults each is capped at its share of the window
    (:func:`~actors.context.policy.scaled_reserve`), values the operator set are kept.

    :raises ConfigError: they leave no room for a prompt, or a value is out of range.
    """
    context = config.context
    configured = settings.context_window or match_model(settings.model, context.windows)
    window = configured or window_for(settings.model, default=context.default_window)
    if configured is None and config.model.base_url and window_for(settings.model, default=0) == 0:
        warn_default_window(settings.model, window)  # once per model
    collapse_at = settings.context_collapse_at
    safety_buffer = scaled_reserve(
        settings.context_safety_buffer, default=SAFETY_BUFFER, window=window, share=SAFETY_SHARE
    )
    reserve, default = (
        (settings.max_output_tokens, MAX_OUTPUT_TOKENS)
        if settings.max_output_tokens
        else (settings.context_output_reserve, OUTPUT_RESERVE)
    )
    output_reserve = scaled_reserve(reserve, default=default, window=window, share=OUTPUT_SHARE)
    policy = ContextPolicy(
        window=window,
        safety_buffer=safety_buffer,
        output_reserve=output_reserve,
        collapse_at=collapse_at,
        collapse_to=min(context.collapse_to, collapse_at) if collapse_at else context.collapse_to,
        keep_recent_turns=settings.context_keep_turns,
        fold_min_chars=context.fold_min_chars,
        summary_max_tokens=context.summary_max_tokens,
        silent_truncation_ratio=context.silent_truncation_ratio,
        tool_result_share=context.tool_result_share,
        window_configured=configured is not None,
    )
    for name, reason in policy_problems(policy):
        key = _CONTEXT_KEYS.get(name, f"context.{name}")
        raise ConfigError(key, f"{reason} (model {settings.model!r})")
    return policy


def _check_context_windows(context: Any, *, source: str) -> None:
    """Check ``[context.windows]`` entry by entry, so an error names its model."""
    windows = context.get("windows") if isinstance(context, Mapping) else None
    if not isinstance(windows, Mapping):
        return
    for model, window in windows.items():
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= WINDOW_MAX:
            raise ConfigError(
                f'context.windows."{model}"',
                f"must be a whole number of tokens, at least 1 and at most {WINDOW_MAX:,} "
                f"(got {window!r})",
                source=source,
            )


def run_settings(
    config: Config, overrides: Mapping[str, Any] | None = None, *, source: str = "run"
) -> RunSettings:
    """The flat settings of one run: ``config``'s defaults with ``overrides`` on top.

    :raises ConfigError: an override names an unknown key or has a bad value, or a cost
        budget is set for a model with no price (key ``prices."<model>"``).
    """
    data = {key: _at(config, run.default) for key, run in RUN_KEYS.items() if run.default}
    data.update(overrides or {})
    settings = _convert(data, RunSettings, prefix="config", source=source)
    return _with_prices(config, settings, source=source)


def _at(config: Config, key: str) -> Any:
    return functools.reduce(getattr, key.split("."), config)


def _merged(base: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base) if isinstance(base, dict) else {}
    for key, value in overrides.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, dict):
            merged[key] = _merged(below, value)
        else:
            merged[key] = value
    return merged


def merge_loop_overrides(
    base: LoopConfig,
    overrides: Mapping[str, Any],
    *,
    source: str = "run",
    result_patterns: tuple[ResultPattern, ...] = (),
    llm_check_model: str = "",
    notes: list[str] | None = None,
) -> LoopConfig:
    """``base`` (a loop preset) with a run's ``loop`` table on top: tables merge key by key
    (``ping_pong = {break_at = 30}`` keeps the preset's other ping-pong keys), anything else
    replaces (``poll_tools = [...]`` replaces the preset's list). ``result_patterns`` (the
    operator's ``[loop] result_patterns``) and ``llm_check_model`` are set last; a run's
    table may not set them. With ``notes``, each threshold clamped is said there (a
    sentence naming it and the value used) as well as logged.

    :raises ConfigError: a key is unknown or a value is bad, as the loop package checks
        them; the key is named ``config.loop.<key>``.
    """
    if "result_patterns" in overrides:
        raise ConfigError(
            "config.loop.result_patterns",
            "operator config only: set [loop] result_patterns in the config file",
            source=source,
        )
    llm_check = overrides.get("llm_check")
    if isinstance(llm_check, Mapping) and "model" in llm_check:
        raise ConfigError(
            "config.loop.llm_check.model",
            "operator config only: set [loop] llm_check_model in the config file",
            source=source,
        )
    if result_patterns:
        base = msgspec.structs.replace(base, result_patterns=result_patterns)
    if llm_check_model:
        llm = msgspec.structs.replace(base.llm_check, model=llm_check_model)
        base = msgspec.structs.replace(base, llm_check=llm)
    if not overrides:
        return check_config(base, notes=notes) if result_patterns or llm_check_model else base
    data = _merged(msgspec.to_builtins(base), overrides)
    try:
        config = msgspec.convert(data, LoopConfig)
    except msgspec.ValidationError as exc:
        raise _config_error(
            str(exc), prefix="config.loop", source=source, kind=LoopConfig
        ) from None
    try:
        return check_config(config, notes=notes)
    except LoopConfigError as exc:
        key, _, reason = str(exc).partition(": ")
        raise ConfigError(f"config.loop.{key}", reason or str(exc), source=source) from None
