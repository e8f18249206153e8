"""The loop monitor: runs a :class:`~actors.loop.LoopDetector` per run on the bus.

It answers (``answers=True``, so settling publishes wait for it) and only ever answers with
:meth:`Bus.publish_nowait`:

* a proposed call at ``warning`` → ``ToolVerdict(warn)`` and a ``Nudge`` (only when the
  warning is not rate-limited); at ``critical`` → ``ToolVerdict(block)`` with the reason the
  model will read as the tool error (plus a ``Nudge`` under gemini's strikes); at ``break``
  → ``StopSignal(hook_stopped, loop.<detector>)``;
* streamed text that loops → ``ModelCancel(reason="loop.content")`` and a ``Nudge`` the first
  time, ``StopSignal(hook_stopped, loop.content)`` (and ``ModelCancel``) when it stops.

Per-run state is created lazily, at the run's first proposed call or streamed delta (a run
parked at its first model request costs the monitor nothing), forgotten at ``RunStarted``
(a run id starting again starts afresh) and dropped at ``RunFinished``. A run's config (an
:meth:`LoopMonitor.override`, else the monitor's) is looked up when its state is created.
Content tracking restarts with each model response (a new turn in the deltas, or a
``ModelReply``) and at each tool call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, assert_never

import anyio
from anyio.abc import TaskStatus

from actors.loop import STRICT, Decision, LoopConfig, LoopDetector
from bus import (
    Bus,
    ExitReason,
    ModelCancel,
    ModelReply,
    ModelTextDelta,
    Nudge,
    RunFinished,
    RunStarted,
    StopSignal,
    ToolCallProposed,
    ToolResult,
    ToolVerdict,
    Verdict,
)

__all__ = ["SOURCE", "LoopMonitor"]

SOURCE: Final = "loop_monitor"

_Message = RunStarted | RunFinished | ToolCallProposed | ToolResult | ModelTextDelta | ModelReply


@dataclass(slots=True)
class _Run:
    detector: LoopDetector
    stream_turn: int | None = None
    stopped: bool = False


class LoopMonitor:
    """Loop detection for every run of a bus.

    :param config: one config for every run, or a function giving each run's config from
        its run id. :meth:`override` sets one run's config before it starts.
    """

    def __init__(
        self,
        bus: Bus,
        config: LoopConfig | Callable[[str], LoopConfig] = STRICT,
        *,
        name: str = SOURCE,
    ) -> None:
        self._bus = bus
        self._config = config
        self._name = name
        self._overrides: dict[str, LoopConfig] = {}
        self._runs: dict[str, _Run] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until the bus closes this subscription; started once subscribed."""
        subscription = self._bus.subscribe(
            RunStarted,
            RunFinished,
            ToolCallProposed,
            ToolResult,
            ModelTextDelta,
            ModelReply,
            name=self._name,
            answers=True,
            inline=True,
        )
        try:
            await subscription.serve(self.handle, task_status=task_status)
        finally:
            self._bus.unsubscribe(subscription)

    def override(self, run_id: str, config: LoopConfig) -> None:
        """Use ``config`` for ``run_id`` (call before the run starts)."""
        self._overrides[run_id] = config

    def active_runs(self) -> int:
        """Runs whose state is held: started, not finished, and past their first proposed
        call or streamed delta."""
        return len(self._runs)

    def handle(self, msg: _Message) -> None:
        """Handle one message; never blocks."""
        # Called inline three times a turn (and at every streamed delta): each type tested
        # by identity (bus messages have no subclasses; a ``match`` of class patterns costs
        # several times more). mypy cannot see this chain is exhaustive, so the last
        # branch does at run time what ``assert_never`` would.
        if type(msg) is ToolCallProposed:
            state = self._runs.get(msg.run_id) or self._new_run(msg.run_id)
            if state.stopped:
                return
            call = msg.call
            decision = state.detector.propose(
                call.name, call.arguments, call_id=call.id, fingerprint=msg.fingerprint
            )
            if decision.level != "none":
                self._answer_call(state, msg, decision)
        elif type(msg) is ModelTextDelta:
            state = self._runs.get(msg.run_id) or self._new_run(msg.run_id)
            if state.stopped:
                return
            if state.stream_turn != msg.turn:
                state.detector.new_stream()
                state.stream_turn = msg.turn
            self._answer_text(state, msg, state.detector.feed_text(msg.text))
        elif type(msg) is ToolResult:
            known = self._runs.get(msg.run_id)
            if known is not None and known.detector.reads_results:
                known.detector.record_result(
                    msg.call_id,
                    msg.content,
                    msg.is_error,
                    result_fingerprint=msg.result_fingerprint,
                )
        elif type(msg) is ModelReply:
            known = self._runs.get(msg.run_id)
            if known is not None and known.stream_turn is not None:
                # (no delta since the last new stream: the content state is fresh)
                known.detector.new_stream()
                known.stream_turn = None
        elif type(msg) is RunStarted:
            self._runs.pop(msg.run_id, None)
        elif type(msg) is RunFinished:
            self._runs.pop(msg.run_id, None)
            self._overrides.pop(msg.run_id, None)
        else:
            raise AssertionError(f"loop monitor: unexpected {type(msg).__name__}")

    # ------------------------------------------------------------------ internals

    def _new_run(self, run_id: str) -> _Run:
        """The state of a run seen for the first time (its first call or delta)."""
        config = self._overrides.pop(run_id, None)
        if config is None:
            config = self._config if isinstance(self._config, LoopConfig) else self._config(run_id)
        state = self._runs[run_id] = _Run(LoopDetector(config))
        return state

    def _answer_call(self, state: _Run, msg: ToolCallProposed, decision: Decision) -> None:
        publish = self._bus.publish_nowait
        verdict: Verdict
        match decision.level:
            case "none":
                return
            case "warning":
                if decision.nudge is None:
                    return
                verdict = "warn"
            case "critical":
                verdict = "block"
            case "break":
                self._stop(state, msg.run_id, decision)
                return
            case _:
                assert_never(decision.level)
        publish(
            ToolVerdict(
                run_id=msg.run_id,
                turn=msg.turn,
                call_id=msg.call.id,
                verdict=verdict,
                source=self._name,
                message=decision.message,
                cause=decision.cause or "",
            )
        )
        self._nudge(msg.run_id, decision)

    def _answer_text(self, state: _Run, msg: ModelTextDelta, decision: Decision) -> None:
        if decision.level == "none":
            return
        self._bus.publish_nowait(
            ModelCancel(run_id=msg.run_id, turn=msg.turn, reason="loop.content")
        )
        if decision.level == "break":
            self._stop(state, msg.run_id, decision)
        else:
            self._nudge(msg.run_id, decision)

    def _nudge(self, run_id: str, decision: Decision) -> None:
        if decision.nudge is not None and decision.cause is not None:
            self._bus.publish_nowait(
                Nudge(run_id=run_id, kind=decision.cause, text=decision.nudge, source=self._name)
            )

    def _stop(self, state: _Run, run_id: str, decision: Decision) -> None:
        state.stopped = True
        self._bus.publish_nowait(
            StopSignal(
                run_id=run_id,
                reason=ExitReason.HOOK_STOPPED,
                cause=decision.cause or "loop.generic_repeat",
                source=self._name,
                detail=decision.message,
                answerable=True,
                per_call=True,
            )
        )
