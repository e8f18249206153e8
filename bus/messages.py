"""Every message spoken on the bus: frozen, tagged msgspec Structs that carry a ``run_id``.

Messages are data, never callables or live objects, so any of them can be encoded with
msgspec and cross a process boundary unchanged; the cycle collector does not track them
(``gc=False``: ``docs/performance.md``). :data:`BusMessage` is the closed union;
:data:`ENCODER` and :data:`DECODER` are built once and reused.

Flow of one turn (who publishes what; the context gatekeeper's part: ``docs/context.md``)::

    conductor     TurnStarted ─settle─▶ ModelRequest ───────────────▶ LLM caller
    LLM caller    ModelTextDelta* ▶ ModelError* ▶ ModelReply ──────▶ conductor (inbox)
    conductor     ModelReplied ─settle─▶ ToolCallProposed ─settle─▶ monitors
    monitors      ToolVerdict / Nudge / StopSignal ─────────────────▶ conductor (inbox)
    conductor     ToolExecute ──────────────────────────────────────▶ tool executor
    tool executor ToolResult* ──────────────────────────────────────▶ conductor (inbox)
    conductor     TurnEnded ─settle─▶ (budget monitor: max_turns …)
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from bus.exit import ExitReason, Outcome
from bus.transcript import ChatMessage, ToolCall, ToolSpec, Usage

__all__ = [
    "DECODER",
    "ENCODER",
    "INBOX_TYPES",
    "MESSAGE_TYPES",
    "AbortRequested",
    "ActorFailed",
    "BusMessage",
    "ContextAction",
    "ContextActionKind",
    "Fold",
    "LogReader",
    "Message",
    "ModelCancel",
    "ModelError",
    "ModelErrorKind",
    "ModelReplied",
    "ModelReply",
    "ModelRequest",
    "ModelTextDelta",
    "Notice",
    "Nudge",
    "Progress",
    "ProgressStatus",
    "PromptRejected",
    "RunEnding",
    "RunFinished",
    "RunStarted",
    "StopSignal",
    "ToolCallProposed",
    "ToolExecute",
    "ToolResult",
    "ToolVerdict",
    "ToolsCancel",
    "TurnEnded",
    "TurnStarted",
    "Verdict",
    "for_the_log",
]


class Message(msgspec.Struct, frozen=True, tag=True, kw_only=True, gc=False):
    """Base of every bus message."""

    run_id: str


# --------------------------------------------------------------------------- run lifecycle


class RunStarted(Message, frozen=True, kw_only=True):
    """A run began: what per-run actors need. Its run settings (declared in
    ``orchestrator/settings.py``) have no default here; a budget of 0 means none."""

    trace_id: str
    task: str
    model: str
    stage: str = "agent"
    plan: tuple[str, ...] = ("agent",)
    folder: str | None = None
    tools: tuple[str, ...]
    max_turns: int
    max_tool_calls: int
    deadline_seconds: float
    started_at: float = 0.0
    tool_specs: tuple[ToolSpec, ...] = ()
    """The schemas of ``tools`` as the model sees them (the context gatekeeper counts them)."""
    output_token_budget: int
    """Completion tokens of the whole run: a ceiling (``budget_mode``)."""
    input_token_budget: int
    """Prompt tokens summed over the run's requests."""
    cost_budget: float
    """Cost ceiling in the currency of the prices below."""
    budget_mode: Literal["ceiling", "target"]
    """``target``: ``output_token_budget`` is a volume to reach, not a ceiling."""
    input_price_per_million: float
    output_price_per_million: float
    resumed_from_turn: int | None = None
    """Set when a run goes on after a restart: the last turn it had completed before
    (0: it starts over from its task). ``None`` for a run's first start."""
    max_cache_hits: int
    """Hits allowed on one cached tool result; the next identical call is a loop."""
    cache_ttl_seconds: float
    """How long a cached result of an idempotent tool is served."""
    cache_max_entries: int
    """Cached results kept for the run (least recently used evicted); 0: no result cache."""
    tool_timeout_seconds: float
    """A tool call's time limit for tools without one of their own (0: the executor's)."""
    traceparent: str = ""
    """The W3C ``traceparent`` of the caller's span this run continues (its trace id is
    ``trace_id``); empty: the run's trace starts here."""


class RunEnding(Message, frozen=True, kw_only=True):
    """Checkpoint (settled) once the run has decided how it ends, before ``RunFinished``:
    answers to it (the last progress events) still precede ``RunFinished``."""

    exit_reason: ExitReason
    cause: str


class RunFinished(Message, frozen=True, kw_only=True):
    """A run ended: the last message of every run."""

    exit_reason: ExitReason
    cause: str
    outcome: Outcome
    detail: str
    hint: str
    turns: int
    llm_requests: int
    tool_calls: int
    usage: Usage
    incomplete: bool = False
    degraded: bool = False


class TurnStarted(Message, frozen=True, kw_only=True):
    """Checkpoint before a model call (settled)."""

    turn: int
    stage: str
    prompt_messages: int
    appended: tuple[ChatMessage, ...] = ()
    """The transcript's messages added since the previous checkpoint that carried them
    (its last ``prompt_messages`` − ``len(appended)`` messages are unchanged): how the
    context gatekeeper follows the prompt, counting each message once."""
    already_sent: int = 0
    """How many of ``appended``'s first messages the run's previous turn request carried
    (the very messages: nudges injected after the previous checkpoint; set by the
    conductor). A logged checkpoint (:func:`for_the_log`) leaves them out."""


class TurnEnded(Message, frozen=True, kw_only=True):
    """Checkpoint after the turn's tools ran, before the next model call (settled)."""

    turn: int
    tool_calls: int


ProgressStatus = Literal["started", "running", "finished", "skipped"]


class Progress(Message, frozen=True, kw_only=True):
    """A milestone of a plan fixed before the run: ``index`` of ``total`` (1-based)."""

    stage: str
    index: int
    total: int
    status: ProgressStatus
    detail: str = ""
    turn: int = 0
    """The turn a ``running`` event reports (the progress reporter's, one per turn); 0: none."""
    tokens: int = 0
    """Tokens the run used so far (pipelines report it at every stage boundary)."""
    elapsed_seconds: float = 0.0


# --------------------------------------------------------------------------- model calls


class ModelRequest(Message, frozen=True, kw_only=True):
    """Ask the LLM caller for one completion of ``messages``."""

    turn: int
    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None
    deadline_at: float | None = None
    purpose: Literal["turn", "compact", "loop_check"] = "turn"
    """``compact``: a summary of early history asked for by the context gatekeeper (no
    tools), not a turn of the run's transcript. ``loop_check``: the loop monitor's
    model-based check (``turn`` is minus the run's turn, so no turn takes its reply)."""
    escalated_max_tokens: int | None = None
    """After ``finish_reason == "length"``, retry once with this ``max_tokens`` (``None``:
    the LLM caller's endpoint setting)."""
    unchanged: int = 0
    """How many leading messages are the very messages of the run's previous turn request
    (set by the conductor; 0 when unknown). Lets an event log keep only what is new."""
    checkpointed: int = 0
    """Set by the conductor when the prompt's first ``checkpointed`` messages are the very
    messages the run's last ``TurnStarted`` or ``PromptRejected`` stood for (its
    ``prompt_messages`` is ``checkpointed``, and its ``appended`` ends with the prompt's
    messages ``unchanged`` to ``checkpointed``); 0 when not. Lets an event log keep each
    message once."""
    run_tools: bool = False
    """``tools`` are the run's tools: its ``RunStarted.tool_specs`` (set by the conductor).
    A logged request then carries none: read them there."""
    first_message: int = 0
    """Index in the prompt of ``messages[0]``. On the bus always 0 (the whole prompt); a
    logged request (:func:`for_the_log`) carries only what the log does not hold yet:
    see :func:`for_the_log` for how its prompt is rebuilt (:class:`LogReader` does it)."""


def for_the_log(msg: Message) -> Message:
    """``msg`` as an event log stores it. Each request carries the whole prompt and the
    tools, so a log that stored them all would grow with the square of the run's length
    and hold every tool schema once per request. A turn request is logged with:

    * ``first_message`` = ``unchanged``: the previous logged turn request's prompt's first
      ``first_message`` messages are the prompt's first messages;
    * then, if ``checkpointed``, the last ``checkpointed - first_message`` messages of the
      ``appended`` of the run's last ``TurnStarted`` or ``PromptRejected`` before it;
    * then ``messages``: the prompt from index ``max(unchanged, checkpointed)`` on;
    * ``tools`` empty if ``run_tools``: they are the run's last ``RunStarted.tool_specs``.

    A ``TurnStarted`` or ``PromptRejected`` is logged without the ``already_sent`` first
    messages of its ``appended``: they are the previous logged turn request's prompt's
    messages from index ``prompt_messages - already_sent - len(appended)`` on. Any other
    message is logged as it is."""
    if not isinstance(msg, ModelRequest):
        if isinstance(msg, TurnStarted | PromptRejected) and msg.already_sent:
            return msgspec.structs.replace(msg, appended=msg.appended[msg.already_sent :])
        return msg
    start = msg.checkpointed if msg.checkpointed > msg.unchanged else msg.unchanged
    if start == 0 and not (msg.run_tools and msg.tools):
        return msg
    return msgspec.structs.replace(
        msg,
        messages=msg.messages[start:] if start else msg.messages,
        first_message=msg.unchanged,
        tools=() if msg.run_tools else msg.tools,
    )


class LogReader:
    """Reads one run's logged messages (:func:`for_the_log`), in the order they were
    logged from its first event, and gives back each as it was on the bus: a logged
    ``ModelRequest`` with its whole prompt and its tools again, a ``TurnStarted`` or
    ``PromptRejected`` with its whole ``appended``, anything else as it is.

    :raises ValueError: a message stands on one the log does not hold (the log did not
        start at the run's first event, or was not written by :func:`for_the_log`)."""

    __slots__ = ("_appended", "_checkpointed", "_prompt", "_tools")

    def __init__(self) -> None:
        self._tools: tuple[ToolSpec, ...] = ()
        self._appended: tuple[ChatMessage, ...] = ()
        self._checkpointed = 0
        self._prompt: tuple[ChatMessage, ...] = ()  # the last turn request's

    def read(self, msg: Message) -> Message:
        """``msg``, the run's next logged message, as it was on the bus."""
        if isinstance(msg, ModelRequest):
            return self._request(msg)
        if isinstance(msg, TurnStarted | PromptRejected):
            if msg.already_sent:
                start = msg.prompt_messages - msg.already_sent - len(msg.appended)
                sent = self._prompt[start : start + msg.already_sent]
                if start < 0 or len(sent) < msg.already_sent:
                    raise ValueError(
                        f"a {type(msg).__name__} of turn {msg.turn} stands on messages "
                        "of a request the log does not hold"
                    )
                msg = msgspec.structs.replace(msg, appended=sent + msg.appended)
            self._appended, self._checkpointed = msg.appended, msg.prompt_messages
        elif isinstance(msg, RunStarted):
            self._tools = msg.tool_specs
        return msg

    def _request(self, logged: ModelRequest) -> ModelRequest:
        first, checkpointed = logged.first_message, logged.checkpointed
        if len(self._prompt) < first:
            raise ValueError(f"a ModelRequest of turn {logged.turn} has no previous prompt")
        prompt = self._prompt[:first]
        if checkpointed > first:
            if checkpointed != self._checkpointed or checkpointed - first > len(self._appended):
                raise ValueError(
                    f"a ModelRequest of turn {logged.turn} stands on a checkpoint of "
                    f"{checkpointed} messages, the log's last has {self._checkpointed}"
                )
            prompt += self._appended[len(self._appended) - (checkpointed - first) :]
        prompt += logged.messages
        whole = msgspec.structs.replace(
            logged,
            messages=prompt,
            tools=self._tools if logged.run_tools else logged.tools,
            first_message=0,
        )
        if logged.purpose == "turn":
            self._prompt = prompt
        return whole


class ModelTextDelta(Message, frozen=True, kw_only=True):
    """A piece of streamed assistant text (observers and the content-loop detector)."""

    turn: int
    text: str


ModelErrorKind = Literal[
    "rate_limited",
    "server_error",
    "timeout",
    "connection",
    "context_length",
    "bad_request",
    "auth",
    "stream",
    "deadline",
    "interrupted",
]


class ModelError(Message, frozen=True, kw_only=True):
    """One failed attempt; ``final`` when the LLM caller gives up on this request.

    A final error after text had streamed carries it: ``partial_text`` (what the last such
    attempt streamed; the run keeps it, as it keeps an aborted reply's) and ``usage`` (the
    streamed output, estimated: ``Usage.partial_output_tokens``)."""

    turn: int
    kind: ModelErrorKind
    message: str
    status: int | None = None
    attempt: int = 1
    final: bool = False
    retry_after: float | None = None
    partial_text: str = ""
    usage: Usage = Usage()


class ModelReply(Message, frozen=True, kw_only=True):
    """The assembled answer to a :class:`ModelRequest` (possibly partial when aborted)."""

    turn: int
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Usage = Usage()
    attempts: int = 1
    latency_seconds: float = 0.0
    ttft_seconds: float | None = None
    aborted: bool = False
    invalid_tool_calls: tuple[str, ...] = ()
    response_id: str = ""
    """The completion's ``id`` as the server sent it (empty: none sent)."""
    response_model: str = ""
    """The model the server says answered (its ``model`` field; empty: none sent)."""
    in_process: bool = False
    """Answered in process by the embedded simulator's script: no server was contacted."""


class ModelCancel(Message, frozen=True, kw_only=True):
    """Stop reading the model's response for ``turn`` and reply with what arrived."""

    turn: int
    reason: str


class ModelReplied(Message, frozen=True, kw_only=True):
    """Checkpoint after each reply (settled): what the run accepted from the model."""

    turn: int
    text_chars: int
    tool_calls: int
    finish_reason: str | None
    usage: Usage
    total_usage: Usage


# --------------------------------------------------------------------------- tools


class ToolCallProposed(Message, frozen=True, kw_only=True):
    """Checkpoint before a tool call (settled); monitors answer with a :class:`ToolVerdict`."""

    turn: int
    call: ToolCall
    fingerprint: str
    index: int


Verdict = Literal["allow", "warn", "block"]


class ToolVerdict(Message, frozen=True, kw_only=True):
    """A monitor's or hook's answer about one proposed call; ``block`` sends ``message`` back."""

    turn: int
    call_id: str
    verdict: Verdict
    source: str
    message: str = ""
    cause: str = ""
    """The cause this verdict is about (``loop.<detector>``, ``hook.<name>``), if known."""


class ToolExecute(Message, frozen=True, kw_only=True):
    """Run these approved calls concurrently; results come back one per call."""

    turn: int
    calls: tuple[ToolCall, ...]
    fingerprints: tuple[str, ...]


class ToolResult(Message, frozen=True, kw_only=True):
    """The outcome of one call. Errors are results (``is_error``), never exceptions."""

    turn: int
    call_id: str
    tool: str
    content: str
    is_error: bool = False
    error_kind: str | None = None
    duration_seconds: float = 0.0
    fingerprint: str = ""
    result_fingerprint: str = ""
    cache: Literal["hit", "miss", "none"] = "none"
    executed: bool = True


class ToolsCancel(Message, frozen=True, kw_only=True):
    """Start no more tools of ``turn``; cancel running ones after ``grace_seconds``."""

    turn: int
    grace_seconds: float
    reason: str


# --------------------------------------------------------------------------- control


class Nudge(Message, frozen=True, kw_only=True):
    """Text injected (as a user message) before the next model call."""

    kind: str
    text: str
    source: str
    continues: bool = False
    """An answer to a reply without tool calls: continue the run (inject this nudge and
    call the model again) instead of completing it."""
    keeps_answer: bool = False
    """With ``continues``: the reply it answers stays part of the answer (a token target:
    the answer grows); without, that reply is dropped and only the next one counts (a stop
    hook's veto)."""


class Fold(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A tool result to fold: the transcript ``index`` of the tool message answering
    ``call_id``, and the ``stub`` that replaces its content."""

    index: int
    call_id: str
    stub: str


ContextActionKind = Literal["collapse", "compact", "blocked", "silent_truncation", "counting"]


class PromptRejected(Message, frozen=True, kw_only=True):
    """Checkpoint (settled) after the endpoint refused a turn's prompt as too long (the LLM
    caller's final ``ModelError(kind="context_length")``): the context gatekeeper answers
    with a :class:`ContextAction` (collapse, then compact) or a ``prompt_too_long`` stop,
    and the conductor sends the turn again. ``attempt`` counts this turn's refusals;
    ``prompt_messages``, ``appended`` and ``already_sent`` are as in :class:`TurnStarted`."""

    turn: int
    attempt: int
    prompt_messages: int
    appended: tuple[ChatMessage, ...] = ()
    already_sent: int = 0
    status: int | None = None
    message: str = ""


class ContextAction(Message, frozen=True, kw_only=True):
    """What the context gatekeeper did to a run's prompt, or asks the conductor to do.

    * ``collapse``: put each fold's ``stub`` in place of its tool result, before the limit
      (``reactive`` false) or after a refusal;
    * ``compact``: summarise transcript messages ``start``..``end`` (exclusive; turns
      ``first_turn``..``last_turn``) with a model call without tools (at most
      ``summary_max_tokens``, shown at most ``history_chars`` of them) and put the summary
      in their place;
    * ``blocked``: the prompt does not fit; a ``blocking_limit`` stop follows, no request;
    * ``silent_truncation``: the endpoint reported ``reported_tokens``, far below the
      estimate: it probably cut the prompt without saying so.
    * ``counting``: how the run's prompt tokens are counted (``detail``), at its first
      check and whenever that changes (a bound, then a calibrated estimate).

    Token figures are the gatekeeper's estimates: before (``estimate_tokens``) and after
    (``after_tokens``) the action, against ``limit_tokens``.
    """

    turn: int
    kind: ContextActionKind
    reactive: bool = False
    estimate_tokens: int = 0
    after_tokens: int = 0
    limit_tokens: int = 0
    reported_tokens: int = 0
    folds: tuple[Fold, ...] = ()
    start: int = 0
    end: int = 0
    first_turn: int = 0
    last_turn: int = 0
    summary_max_tokens: int = 0
    history_chars: int = 0
    detail: str = ""


class StopSignal(Message, frozen=True, kw_only=True):
    """End the run for ``cause``; built by :func:`bus.stop_signal`, which takes the reason
    and the two flags (what the conductor does with it) from the cause table
    (:mod:`bus.causes`). An event stored before the flags existed decodes with both false;
    stored stops are only read back for display, never fed to a conductor."""

    reason: ExitReason
    cause: str
    source: str
    detail: str = ""
    answerable: bool = False
    per_call: bool = False


class AbortRequested(Message, frozen=True, kw_only=True):
    """Someone (caller, API, shutdown) asked the run to stop now."""

    source: Literal["caller", "api", "shutdown", "crash"]
    detail: str = ""


class ActorFailed(Message, frozen=True, kw_only=True):
    """An actor's handler raised while handling a message of this run."""

    actor: str
    error: str


class Notice(Message, frozen=True, kw_only=True):
    """Something a person should know about a run that neither stops nor nudges it (a
    threshold clamped, a loop check's answer ignored): recorded in the run's events.
    ``kind`` names what it is about (``loop.config``, ``loop.llm_check``)."""

    kind: str
    text: str
    source: str


BusMessage = (
    RunStarted
    | RunEnding
    | RunFinished
    | TurnStarted
    | TurnEnded
    | Progress
    | ModelRequest
    | ModelTextDelta
    | ModelError
    | ModelReply
    | ModelCancel
    | ModelReplied
    | ToolCallProposed
    | ToolVerdict
    | ToolExecute
    | ToolResult
    | ToolsCancel
    | Nudge
    | StopSignal
    | AbortRequested
    | ActorFailed
    | Notice
    | PromptRejected
    | ContextAction
)

MESSAGE_TYPES: tuple[type[Message], ...] = get_args(BusMessage)
"""Every message type, in the order of :data:`BusMessage`."""

# Messages that the bus also delivers to the run's own control inbox (the conductor).
INBOX_TYPES: frozenset[type[Message]] = frozenset(
    {
        ModelReply,
        ModelError,
        ToolResult,
        ToolVerdict,
        Nudge,
        StopSignal,
        AbortRequested,
        ActorFailed,
        ContextAction,
    }
)

ENCODER = msgspec.json.Encoder()
DECODER: msgspec.json.Decoder[BusMessage] = msgspec.json.Decoder(BusMessage)
