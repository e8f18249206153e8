"""The config file's sections, one Struct each, and :class:`Config`, which holds them."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from actors.budget.tokens import BudgetMode
from actors.context import DEFAULT_WINDOW, SAFETY_BUFFER, ContextPolicy
from actors.hooks import Hook
from actors.llm.settings import EndpointLimits, Seed, Temperature, ToolChoice
from actors.loop import ResultPattern
from actors.loop.config import PATTERNS_MAX, compile_pattern
from actors.tools.cache import DEFAULT_CACHE_SETTINGS
from actors.tools.limits import FigureSandbox, ToolExecutorSettings
from actors.tools.mcp import McpServer
from orchestrator.settings import (
    CONCURRENT_RUNS_MAX,
    IMAGE_BYTES_MAX,
    MAX_OUTPUT_TOKENS,
    OUTPUT_RESERVE,
    RESULT_CHARS_MAX,
    RETENTION_MAX,
    CacheEntries,
    CacheHits,
    ClientOverrides,
    Cost,
    Grace,
    LoopPreset,
    OnCrash,
    OnStop,
    Price,
    ReplyTokens,
    Reserve,
    RunTokens,
    Seconds,
    Share,
    ToolCalls,
    Turns,
    Window,
    _Settings,
)


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
    """What a model can do, by its exact name (``[models."gpt-4o"]``); ``stream``,
    ``tool_choice`` and ``reset_tool_choice`` replace ``[model]``'s for this model (unset:
    ``[model]``'s stand)."""

    vision: bool = False
    """It reads images: the report workflow offers ``read_image`` to its explore stage."""
    stream: bool | None = None
    tool_choice: ToolChoice | None = None
    reset_tool_choice: bool | None = None


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
            # A LoopConfigError is a ValueError: msgspec reports it as a validation error.
            compile_pattern(f"result_patterns.{index}.pattern", item.pattern)


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
    windows: dict[str, Window] = msgspec.field(default_factory=dict)
    """Model-name prefix → context window in tokens (``"gpt-4o" = 128000``), consulted
    before the server's report and the built-in table (``actors.context.MODEL_WINDOWS``)."""
    safety_buffer_tokens: Reserve = SAFETY_BUFFER
    """Kept free below the window; the default is at most a tenth of the window."""
    output_reserve_tokens: Reserve = OUTPUT_RESERVE
    """Reserved for the answer when ``model.max_output_tokens`` is not set (else that); the
    default is at most a quarter of the window."""
    collapse_at: Share = _POLICY.collapse_at
    """Fold old tool results once the estimate passes this share of the limit; 0: only
    after the endpoint refused a prompt."""
    collapse_to: Annotated[float, msgspec.Meta(gt=0, le=1)] = _POLICY.collapse_to
    """…until it is below this share of the limit."""
    keep_recent_turns: Turns = _POLICY.keep_recent_turns
    """Turns a compaction keeps word for word."""
    fold_min_chars: Annotated[int, msgspec.Meta(ge=1, le=RESULT_CHARS_MAX)] = _POLICY.fold_min_chars
    """Shorter tool results are never folded."""
    summary_max_tokens: ReplyTokens = _POLICY.summary_max_tokens
    """The compaction call's ``max_tokens``."""
    silent_truncation_ratio: Annotated[float, msgspec.Meta(gt=0, lt=1)] = (
        _POLICY.silent_truncation_ratio
    )
    """Reported prompt tokens below this share of the estimate are flagged as a silent
    truncation (an event, not a stop)."""
    tool_result_share: Share = _POLICY.tool_result_share
    """The tool results of one turn the model has not answered yet may take together at most
    this share of the room the system prompt, task and tool schemas leave under the limit;
    past it they are cut to fit, each with a note on how to read the rest (0: never cut)."""


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
    queue_size: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
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
    prices: dict[str, ModelPrice] = msgspec.field(default_factory=dict)
    models: dict[str, ModelCapabilities] = msgspec.field(default_factory=dict)
    """``[models."<name>"]``: per-model capabilities (``vision``); unnamed models have none."""
    daemon: DaemonSettings = DaemonSettings()
    cluster: FleetSettings = FleetSettings()
    tracing: TracingSettings = TracingSettings()
    mcp: McpSettings = McpSettings()
    hooks: tuple[Hook, ...] = ()
    """``[[hooks]]``: every run's hooks unless a run sets its own (``docs/hooks.md``)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
