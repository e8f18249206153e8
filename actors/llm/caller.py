"""The LLM caller: answers each :class:`bus.ModelRequest` with one :class:`bus.ModelReply` or
a final :class:`bus.ModelError`, streaming :class:`bus.ModelTextDelta` on the way.

loopfuse retries itself so every attempt is seen (a :class:`bus.ModelError` with
``final=False`` per retried failure); how an empty, cut or broken stream is asked again and
counted is ``docs/transport.md``'s. Each request runs in a worker task of the caller's task
group (:mod:`actors.workers`), under the worker's cancel scope, which carries the request's
absolute deadline and is cancelled by :class:`bus.ModelCancel`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
import msgspec
from anyio.abc import TaskStatus

from actors.deadlines import Deadlines
from actors.llm.accumulator import ReplyAccumulator
from actors.llm.chunks import decode_completion
from actors.llm.clients import Clients
from actors.llm.errors import Failure, IncompleteStream, classify
from actors.llm.retry import RetryPolicy
from actors.llm.settings import EndpointSettings
from actors.llm.stream import (
    ChunkReader,
    EmptyStream,
    StreamInterrupted,
    StreamTally,
    stream_end,
)
from actors.llm.transport import RUN_ID_HEADER
from actors.llm.wire import (
    CHARS_PER_TOKEN,
    RequestShapes,
    ToolSchemaError,
    WireTools,
    estimate_usage,
    prompt_chars,
)
from actors.workers import Workers
from bus import (
    Bus,
    Message,
    ModelCancel,
    ModelError,
    ModelReply,
    ModelRequest,
    ModelTextDelta,
    Usage,
)

__all__ = ["RUN_ID_HEADER", "LLMCaller"]

logger = logging.getLogger("loopfuse.llm_caller")

SHORT_KEY: Final = 8
"""API keys this short are scrubbed from messages only where they stand alone."""

CLOSE_TIMEOUT_SECONDS: Final = 2.0
"""How long closing an abandoned response (or the client) may take."""

_INCLUDE_USAGE: Final = {"include_usage": True}
_TRACEPARENT: Final = b"traceparent"
_encode = msgspec.json.Encoder().encode
_clock = time.monotonic
"""The event loop's clock, read without anyio's look-up of the backend (``docs/performance.md``)."""


@dataclasses.dataclass(slots=True, eq=False)
class _Call:
    """One request in flight; a :class:`~actors.workers.Job` of the caller's pool."""

    request: ModelRequest
    caller: LLMCaller | None  # until the job starts
    scope: anyio.CancelScope | None = None  # the worker's, while the job runs
    cancel_reason: str | None = None
    acc: ReplyAccumulator = dataclasses.field(default_factory=ReplyAccumulator)
    attempts: int = 0
    started: float = dataclasses.field(default_factory=_clock)
    attempt_started: float = 0.0  # set as each attempt starts
    ttft: float | None = None
    stream: bool = True  # whether the next attempt streams
    fresh: bool = False  # an attempt failed: the next one goes on a new connection
    streaming: bool = False
    done: bool = False
    partial: ReplyAccumulator | None = None  # the last attempt that broke after output
    lost_tokens: int = 0  # output tokens (estimated) of attempts that broke after output

    def keep_broken(self) -> None:
        """The attempt in ``acc`` failed: count its output, keep it if it has any."""
        acc = self.acc
        if acc.has_output and acc is not self.partial:
            self.lost_tokens += -(-acc.completion_chars // CHARS_PER_TOKEN)
            self.partial = acc

    def run(self, scope: anyio.CancelScope) -> Awaitable[None]:
        """The pool's entry point: the request, served under ``scope``."""
        caller = self.caller
        assert caller is not None
        self.caller = None
        return caller._serve(self, scope)

    def cancel(self, reason: str) -> None:
        """Cancel the request (before it started too: it then answers at once)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
            if self.scope is not None:
                self.scope.cancel()


class LLMCaller:
    """The LLM caller actor for one endpoint, shared by every run of a runtime."""

    def __init__(
        self,
        bus: Bus,
        endpoint: EndpointSettings,
        *,
        traceparent: Callable[[ModelRequest], str | None] | None = None,
    ) -> None:
        """:param traceparent: the W3C ``traceparent`` header to send with a request (the
        trace exporter's, naming the request's span), or ``None`` for none."""
        self._bus = bus
        self._endpoint = endpoint
        self._traceparent = traceparent
        self._policy = RetryPolicy(
            max_attempts=endpoint.max_attempts,
            backoff_base=endpoint.backoff_base_seconds,
            backoff_cap=endpoint.backoff_cap_seconds,
            retry_after_cap=endpoint.retry_after_cap_seconds,
        )
        self._tools = WireTools()
        self._shapes = RequestShapes(endpoint)
        self._active: dict[tuple[str, int], _Call] = {}
        self._no_escalation: set[str] = set()
        self._clients: Clients | None = None
        self._workers: Workers | None = None
        self._deadlines: Deadlines | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve requests until the bus subscription closes; then abort what is in flight
        (each such run gets an aborted reply) and close the clients."""
        handlers = self.handlers()
        sub = self._bus.subscribe(*handlers, name="llm_caller", inline=True)
        clients = self._clients = Clients(self._endpoint)
        try:
            async with anyio.create_task_group() as tg:
                self._workers = Workers(tg)
                self._deadlines = Deadlines(tg)
                task_status.started()
                try:
                    await sub.serve_by_type(handlers)
                    for call in list(self._active.values()):
                        call.cancel("caller stopped")
                finally:
                    self._workers.close()
                    self._deadlines.close()
        finally:
            self._bus.unsubscribe(sub)
            self._workers = None
            with anyio.move_on_after(CLOSE_TIMEOUT_SECONDS, shield=True):
                await clients.aclose()

    # ---------------------------------------------------------------- handling

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        """The function of each message type the caller handles (what the bus calls)."""
        return {ModelRequest: self._start, ModelCancel: self._cancel}

    def _cancel(self, msg: ModelCancel) -> None:
        call = self._active.get((msg.run_id, msg.turn))
        if call is not None:
            logger.debug("cancel run %s turn %d: %s", msg.run_id, msg.turn, msg.reason)
            call.cancel(msg.reason)

    def _start(self, request: ModelRequest) -> None:
        key = (request.run_id, request.turn)
        call = _Call(request, self)
        if key in self._active or self._workers is None:
            failure = Failure("bad_request", "a request for this turn is already in flight")
            self._publish_final(call, self._error(call, failure, final=True))
            return
        self._active[key] = call
        self._workers.start(call)

    async def _serve(self, call: _Call, scope: anyio.CancelScope) -> None:
        """Answer one request exactly once, whatever happens (cancellation included).

        ``scope`` is the pool worker's, this call's until it returns: it carries the call's
        absolute deadline too, so cancelled without a cancel reason, it was the deadline.
        Its cancellation passes through here (the worker's scope catches it) once the
        answer is published."""
        request = call.request
        budget = self._endpoint.call_deadline_seconds
        deadlines = self._deadlines
        assert deadlines is not None  # set before the worker pool starts
        try:
            if call.cancel_reason is not None:  # cancelled before it started
                return
            call.scope = scope
            left = budget if request.deadline_at is None else request.deadline_at - time.time()
            if left < budget:  # the run ends before the call deadline would: a timer of its own
                budget = left
                deadline = scope.deadline = _clock() + budget
            else:  # the same limit for every such call: no timer each
                deadline = deadlines.watch(scope, budget)
            self._publish_final(call, await self._attempts(call, deadline))
        except Exception as exc:
            logger.exception("LLM call of run %s turn %d failed", request.run_id, request.turn)
            self._publish_final(call, self._internal_error(call, exc))
        finally:
            call.scope = None  # a late ModelCancel must not reach the worker's next job
            deadlines.forget(scope, budget)  # (a scope not watched is in no limit's list)
            if not call.done:
                if call.cancel_reason is None and scope.cancel_called:
                    call.keep_broken()  # cut by the deadline mid-stream: what streamed counts
                    late = f"no reply within the call deadline of {max(budget, 0.0):.3g}s"
                    answer: ModelReply | ModelError = self._error(
                        call, Failure("deadline", late), final=True
                    )
                else:  # ModelCancel, the caller stopping, or cancelled from outside
                    try:
                        answer = self._reply(call, aborted=True)
                    except Exception as exc:
                        answer = self._internal_error(call, exc)
                self._publish_final(call, answer)
            if self._active.get((request.run_id, request.turn)) is call:
                del self._active[(request.run_id, request.turn)]

    def _publish_final(self, call: _Call, msg: ModelReply | ModelError) -> None:
        call.done = True
        self._bus.publish_nowait(msg)

    async def _attempts(self, call: _Call, deadline: float) -> ModelReply | ModelError:
        request, endpoint = call.request, self._endpoint
        try:
            params = self._shapes(request.model).params(request, self._tools)
        except ToolSchemaError as exc:
            return self._error(call, Failure("bad_request", str(exc)), final=True)
        max_tokens = request.max_tokens or endpoint.default_max_tokens
        cut: ReplyAccumulator | None = None
        failures = 0
        call.stream = self._shapes(request.model).stream
        while True:
            call.attempts += 1
            if call.attempts > 1:  # the first attempt fills the one made with the call
                call.acc = ReplyAccumulator()
            try:
                await self._attempt(call, params, max_tokens)
            except Exception as exc:
                call.keep_broken()
                call.fresh = True
                if isinstance(exc, EmptyStream):
                    # No answer at all (llama-cpp-python's streamed context overflow): ask
                    # once more without streaming (so never twice), the server's own error
                    # deciding; this is an attempt (it counts) but never the last one.
                    call.stream = False
                    failures += 1
                    retry = Failure("stream", f"{exc}; asking again without streaming")
                    self._bus.publish_nowait(self._error(call, retry, final=False))
                    continue
                if isinstance(exc, StreamInterrupted):
                    call.stream = False  # asked again whole, not streamed: docs/transport.md
                    failure = Failure("interrupted", str(exc), None, None, True)
                else:
                    failure = classify(exc, streaming=call.streaming)
                if cut is not None and failure.kind == "bad_request":
                    # The endpoint refuses the escalated output limit (its own cap is lower):
                    # answer with the cut reply, so the conductor's recovery takes over, and
                    # never escalate for this model again.
                    logger.warning(
                        "model %s refused max_tokens=%s; keeping the cut reply (%s)",
                        request.model,
                        max_tokens,
                        failure.message,
                    )
                    self._no_escalation.add(request.model)
                    call.acc = cut
                    return self._reply(call)
                cut = None
                failures += 1
                decision = self._policy.decide(
                    failure, failures=failures, remaining=deadline - _clock()
                )
                if not decision.retry:
                    if failure.retryable:
                        failure = failure._replace(message=f"{failure.message} ({decision.reason})")
                    return self._error(call, failure, final=True)
                self._bus.publish_nowait(self._error(call, failure, final=False))
                await anyio.sleep(decision.delay)
                continue
            escalate = request.escalated_max_tokens or endpoint.escalated_max_tokens
            if (
                call.acc.finish_reason == "length"
                and escalate is not None
                and request.model not in self._no_escalation
                and (max_tokens is None or max_tokens < escalate)
            ):
                max_tokens, cut = escalate, call.acc  # no second escalation: max_tokens is escalate
                logger.info(
                    "run %s turn %d: truncated, retrying with max_tokens=%d",
                    request.run_id,
                    request.turn,
                    escalate,
                )
                continue
            return self._reply(call)

    async def _attempt(self, call: _Call, params: dict[str, Any], max_tokens: int | None) -> None:
        """One HTTP attempt through the run's transport, its text streamed as deltas into
        ``call.acc``."""
        assert self._clients is not None
        transport = self._clients.transport_for_run(call.request.run_id)
        call.attempt_started = _clock()
        call.streaming = False
        call.ttft = None
        body = dict(params)
        if max_tokens is not None:
            body[self._endpoint.max_tokens_param] = max_tokens
        stream = call.stream
        body["stream"] = stream
        if stream:
            body["stream_options"] = _INCLUDE_USAGE
        trace = self._traceparent
        parent = trace(call.request) if trace is not None else None
        response = await transport.post(
            _encode(body),
            call.request.run_id,
            stream=stream,
            headers=((_TRACEPARENT, parent.encode("ascii")),) if parent else (),
            fresh=call.fresh,
        )
        if not stream:
            text = call.acc.feed_completion(decode_completion(response.content))
            call.ttft = _clock() - call.attempt_started
            if text:
                await self._bus.publish(self._delta(call, text))
            if call.acc.finish_reason is None:
                raise IncompleteStream("the completion has no finish reason")
            return
        call.streaming = True
        tally = StreamTally()
        reader = ChunkReader(response, tally)
        acc = call.acc
        try:
            while (batch := await reader.next_batch()) is not None:
                # One delta per network read: text is never held back (a server may send
                # only keep-alives for a while, and the loop detector needs the text).
                text = "".join([acc.feed_chunk(chunk) for chunk in batch])
                if call.ttft is None and acc.has_output:
                    call.ttft = _clock() - call.attempt_started
                if text:
                    await self._bus.publish(self._delta(call, text))
        finally:
            try:
                await reader.aclose()
            finally:
                if not response.close_now():  # a pooled connection's release never waits
                    with anyio.move_on_after(CLOSE_TIMEOUT_SECONDS, shield=True):
                        await response.aclose()
        if acc.finish_reason is None:
            raise stream_end(tally)

    # ---------------------------------------------------------------- messages

    @staticmethod
    def _delta(call: _Call, text: str) -> ModelTextDelta:
        return ModelTextDelta(run_id=call.request.run_id, turn=call.request.turn, text=text)

    def _reply(self, call: _Call, *, aborted: bool = False) -> ModelReply:
        acc, request = call.acc, call.request
        if aborted and not acc.has_output and call.partial is not None:
            acc = call.partial  # aborted between attempts: what the last one streamed
        assembled = acc.assemble(partial=aborted)
        usage = acc.usage
        if usage is None or aborted:
            # The output of call.partial is in call.lost_tokens already.
            chars = 0 if acc is call.partial else acc.completion_chars
            usage = estimate_usage(self._prompt_chars(request), chars)
        return ModelReply(
            run_id=request.run_id,
            turn=request.turn,
            text=acc.text,
            tool_calls=assembled.tool_calls,
            finish_reason=None if aborted else acc.finish_reason,
            usage=_with_lost(usage, call.lost_tokens),
            attempts=call.attempts,
            latency_seconds=_clock() - call.started,
            ttft_seconds=call.ttft,
            aborted=aborted,
            invalid_tool_calls=assembled.invalid,
            response_id=acc.response_id,
            response_model=acc.response_model,
        )

    def _error(self, call: _Call, failure: Failure, *, final: bool) -> ModelError:
        partial, usage = "", Usage()
        if final and call.partial is not None:  # text had streamed: the run keeps it
            partial = call.partial.text
            prompt = estimate_usage(self._prompt_chars(call.request), 0)
            usage = _with_lost(prompt, call.lost_tokens)
        return ModelError(
            run_id=call.request.run_id,
            turn=call.request.turn,
            kind=failure.kind,
            message=self._scrub(failure.message),
            status=failure.status,
            attempt=max(call.attempts, 1),
            final=final,
            retry_after=failure.retry_after,
            partial_text=partial,
            usage=usage,
        )

    @staticmethod
    def _prompt_chars(request: ModelRequest) -> int:
        """The prompt's size in characters, for an estimated usage: the messages and the
        tool schemas (which the context gatekeeper's estimate counts too)."""
        tools = sum(len(t.name) + len(t.description) + len(t.parameters) for t in request.tools)
        return prompt_chars(request.messages) + tools

    def _internal_error(self, call: _Call, exc: Exception) -> ModelError:
        return self._error(call, Failure("stream", f"internal error: {exc!r}"[:500]), final=True)

    def _scrub(self, text: str) -> str:
        """``text`` without the API key, should a server echo it back (a key shorter than
        :data:`SHORT_KEY` only where it stands alone, not inside a word)."""
        key = self._endpoint.api_key
        if not key:
            return text
        if len(key) >= SHORT_KEY:
            return text.replace(key, "***")
        return re.sub(rf"(?<![\w-]){re.escape(key)}(?![\w-])", "***", text)


def _with_lost(usage: Usage, lost: int) -> Usage:
    """``usage`` with ``lost`` estimated output tokens of broken attempts added."""
    if not lost:
        return usage
    return usage + Usage(completion_tokens=lost, estimated=True, partial_output_tokens=lost)
