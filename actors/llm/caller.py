"""The LLM caller: answers each :class:`bus.ModelRequest` with one :class:`bus.ModelReply` or
a final :class:`bus.ModelError`, streaming :class:`bus.ModelTextDelta` on the way.

A few ``openai.AsyncOpenAI`` clients (``max_retries=0``) per endpoint, a run always on the
same one (:mod:`actors.llm.clients`); loopfuse retries itself so every attempt is seen (a
:class:`bus.ModelError` with ``final=False`` per retried failure). Each request goes out
through its client's connection pool with the headers the SDK built for that client
(:mod:`actors.llm.transport`); the body is encoded by msgspec and the streamed reply read
by :mod:`actors.llm.stream`.
Each request runs in a worker task of the caller's task group (:mod:`actors.workers`: a
task is reused, not started per request), under one cancel scope of its own that carries
its absolute deadline (keep-alive bytes do not extend it) and is cancelled by
:class:`bus.ModelCancel`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import aclosing
from functools import partial
from typing import Any, Final, NamedTuple

import anyio
import msgspec
from anyio.abc import TaskStatus

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.chunks import decode_completion
from actors.llm.clients import Clients
from actors.llm.errors import Failure, IncompleteStream, classify
from actors.llm.retry import RetryPolicy
from actors.llm.settings import EndpointSettings
from actors.llm.stream import read_chunks
from actors.llm.transport import RUN_ID_HEADER
from actors.llm.wire import (
    RequestShapes,
    ToolSchemaError,
    WireTools,
    estimate_usage,
    prompt_chars,
)
from actors.workers import Workers
from bus import Bus, Message, ModelCancel, ModelError, ModelReply, ModelRequest, ModelTextDelta

__all__ = ["RUN_ID_HEADER", "LLMCaller", "LLMCallerStatistics"]

logger = logging.getLogger("loopfuse.llm_caller")

CLOSE_TIMEOUT_SECONDS: Final = 2.0
"""How long closing an abandoned response (or the client) may take."""

_INCLUDE_USAGE: Final = {"include_usage": True}
_TRACEPARENT: Final = b"traceparent"
_encode = msgspec.json.Encoder().encode


class LLMCallerStatistics(NamedTuple):
    """The caller at a glance."""

    in_flight: int
    requests: int
    replies: int
    final_errors: int
    retries: int


class _Call:
    """One request in flight."""

    __slots__ = (
        "acc",
        "attempt_started",
        "attempts",
        "cancel_reason",
        "done",
        "request",
        "scope",
        "started",
        "streaming",
        "ttft",
    )

    def __init__(self, request: ModelRequest) -> None:
        self.request = request
        self.scope = anyio.CancelScope()
        self.cancel_reason: str | None = None
        self.acc = ReplyAccumulator()
        self.attempts = 0
        self.started = anyio.current_time()
        self.attempt_started = self.started
        self.ttft: float | None = None
        self.streaming = False
        self.done = False

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
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
        self._requests = self._replies = self._final_errors = self._retries = 0

    def statistics(self) -> LLMCallerStatistics:
        return LLMCallerStatistics(
            len(self._active), self._requests, self._replies, self._final_errors, self._retries
        )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve requests until the bus subscription closes; then abort what is in flight
        (each such run gets an aborted reply) and close the clients."""
        handlers = self.handlers()
        sub = self._bus.subscribe(*handlers, name="llm_caller", inline=True)
        clients = self._clients = Clients(self._endpoint)
        try:
            async with anyio.create_task_group() as tg:
                self._workers = Workers(tg)
                task_status.started()
                try:
                    await sub.serve_by_type(handlers)
                    for call in list(self._active.values()):
                        call.cancel("caller stopped")
                finally:
                    self._workers.close()
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
        self._requests += 1
        key = (request.run_id, request.turn)
        call = _Call(request)
        if key in self._active or self._workers is None:
            failure = Failure("bad_request", "a request for this turn is already in flight")
            self._publish_final(call, self._error(call, failure, final=True))
            return
        self._active[key] = call
        self._workers.submit(partial(self._serve, call))

    async def _serve(self, call: _Call) -> None:
        """Answer one request exactly once, whatever happens (cancellation included).

        ``call.scope`` carries the call's absolute deadline too: caught without a cancel
        reason, it was the deadline."""
        request = call.request
        try:
            budget = self._endpoint.call_deadline_seconds
            if request.deadline_at is not None:
                budget = min(budget, request.deadline_at - time.time())
            deadline = call.scope.deadline = anyio.current_time() + budget
            with call.scope:
                result = await self._attempts(call, deadline)
                self._publish_final(call, result)
            if not call.done and call.cancel_reason is None and call.scope.cancelled_caught:
                self._publish_final(call, self._deadline_error(call, budget))
            if not call.done:  # ModelCancel, or the caller stopping
                self._publish_final(call, self._reply(call, aborted=True))
        except Exception as exc:
            logger.exception("LLM call of run %s turn %d failed", request.run_id, request.turn)
            self._publish_final(call, self._internal_error(call, exc))
        finally:
            if not call.done:  # cancelled from outside: the run still gets its answer
                try:
                    aborted: ModelReply | ModelError = self._reply(call, aborted=True)
                except Exception as exc:
                    aborted = self._internal_error(call, exc)
                self._publish_final(call, aborted)
            if self._active.get((request.run_id, request.turn)) is call:
                del self._active[(request.run_id, request.turn)]

    def _publish_final(self, call: _Call, msg: ModelReply | ModelError) -> None:
        call.done = True
        if isinstance(msg, ModelReply):
            self._replies += 1
        else:
            self._final_errors += 1
        self._bus.publish_nowait(msg)

    @staticmethod
    def _deadline_error(call: _Call, budget: float) -> ModelError:
        return ModelError(
            run_id=call.request.run_id,
            turn=call.request.turn,
            kind="deadline",
            message=f"no reply within the call deadline of {max(budget, 0.0):.3g}s",
            attempt=max(call.attempts, 1),
            final=True,
        )

    async def _attempts(self, call: _Call, deadline: float) -> ModelReply | ModelError:
        request, endpoint = call.request, self._endpoint
        try:
            params = self._params(request)
        except ToolSchemaError as exc:
            return self._error(call, Failure("bad_request", str(exc)), final=True)
        max_tokens = request.max_tokens or endpoint.default_max_tokens
        escalated = False
        cut: ReplyAccumulator | None = None
        failures = 0
        while True:
            call.attempts += 1
            call.acc = ReplyAccumulator()
            try:
                await self._attempt(call, params, max_tokens)
            except Exception as exc:
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
                    failure, failures=failures, remaining=deadline - anyio.current_time()
                )
                if not decision.retry:
                    if failure.retryable:
                        failure = failure._replace(message=f"{failure.message} ({decision.reason})")
                    return self._error(call, failure, final=True)
                self._retries += 1
                self._bus.publish_nowait(self._error(call, failure, final=False))
                await anyio.sleep(decision.delay)
                continue
            escalate = request.escalated_max_tokens or endpoint.escalated_max_tokens
            if (
                call.acc.finish_reason == "length"
                and escalate is not None
                and not escalated
                and request.model not in self._no_escalation
                and (max_tokens is None or max_tokens < escalate)
            ):
                escalated, max_tokens, cut = True, escalate, call.acc
                logger.info(
                    "run %s turn %d: truncated, retrying with max_tokens=%d",
                    request.run_id,
                    request.turn,
                    escalate,
                )
                continue
            return self._reply(call)

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        """The request body's fields that every attempt shares (with ``tool_choice`` as
        the model's settings say: :class:`~actors.llm.wire.RequestShape`)."""
        return self._shapes(request.model).params(request, self._tools)

    async def _attempt(self, call: _Call, params: dict[str, Any], max_tokens: int | None) -> None:
        """One HTTP attempt, its text streamed as deltas into ``call.acc``.

        The request goes out through the run's ``openai`` client (:mod:`actors.llm.transport`:
        headers the SDK built, its connection pool, its exceptions); the body is encoded by
        msgspec and the response read by :mod:`actors.llm.stream`.
        """
        assert self._clients is not None
        transport = self._clients.transport_for_run(call.request.run_id)
        call.attempt_started = anyio.current_time()
        call.streaming = False
        call.ttft = None
        body = dict(params)
        if max_tokens is not None:
            body[self._endpoint.max_tokens_param] = max_tokens
        stream = self._shapes(call.request.model).stream
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
        )
        if not stream:
            text = call.acc.feed_completion(decode_completion(response.content))
            call.ttft = anyio.current_time() - call.attempt_started
            if text:
                await self._bus.publish(self._delta(call, text))
            if call.acc.finish_reason is None:
                raise IncompleteStream("the completion has no finish reason")
            return
        call.streaming = True
        try:
            async with aclosing(read_chunks(response)) as batches:
                async for batch in batches:
                    # One delta per network read: text is never held back (a server may send
                    # only keep-alives for a while, and the loop detector needs the text).
                    pieces = [call.acc.feed_chunk(chunk) for chunk in batch]
                    if call.ttft is None and call.acc.has_output:
                        call.ttft = anyio.current_time() - call.attempt_started
                    text = "".join(pieces)
                    if text:
                        await self._bus.publish(self._delta(call, text))
        finally:
            with anyio.move_on_after(CLOSE_TIMEOUT_SECONDS, shield=True):
                await response.aclose()
        if call.acc.finish_reason is None:
            raise IncompleteStream("the stream ended without a finish reason")

    # ---------------------------------------------------------------- messages

    @staticmethod
    def _delta(call: _Call, text: str) -> ModelTextDelta:
        return ModelTextDelta(run_id=call.request.run_id, turn=call.request.turn, text=text)

    def _reply(self, call: _Call, *, aborted: bool = False) -> ModelReply:
        acc, request = call.acc, call.request
        assembled = acc.assemble(partial=aborted)
        usage = acc.usage
        if usage is None or aborted:
            usage = estimate_usage(prompt_chars(request.messages), acc.completion_chars)
        return ModelReply(
            run_id=request.run_id,
            turn=request.turn,
            text=acc.text,
            tool_calls=assembled.tool_calls,
            finish_reason=None if aborted else acc.finish_reason,
            usage=usage,
            attempts=call.attempts,
            latency_seconds=anyio.current_time() - call.started,
            ttft_seconds=call.ttft,
            aborted=aborted,
            invalid_tool_calls=assembled.invalid,
        )

    def _error(self, call: _Call, failure: Failure, *, final: bool) -> ModelError:
        return ModelError(
            run_id=call.request.run_id,
            turn=call.request.turn,
            kind=failure.kind,
            message=self._scrub(failure.message),
            status=failure.status,
            attempt=max(call.attempts, 1),
            final=final,
            retry_after=failure.retry_after,
        )

    def _internal_error(self, call: _Call, exc: Exception) -> ModelError:
        return self._error(call, Failure("stream", f"internal error: {exc!r}"[:500]), final=True)

    def _scrub(self, text: str) -> str:
        """``text`` without the API key, should a server echo it back."""
        key = self._endpoint.api_key
        return text.replace(key, "***") if key else text
