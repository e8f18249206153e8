"""The tool phase: every call proposed at a checkpoint, approved ones run, results in order."""

from __future__ import annotations

import logging

from actors.fingerprint import fingerprint_call
from bus import (
    ChatMessage,
    ExitReason,
    StopSignal,
    ToolCall,
    ToolCallProposed,
    ToolExecute,
    ToolResult,
    ToolsCancel,
    ToolVerdict,
)
from orchestrator.conductor.context_recovery import ContextRecovery
from orchestrator.conductor.state import Stopped
from orchestrator.result import CallLogEntry

__all__ = ["ToolPhase", "call_specific"]

logger = logging.getLogger("loopfuse.conductor")


class ToolPhase(ContextRecovery):
    """Proposed calls through the monitors, approved calls to the executor, results back."""

    __slots__ = ()

    async def _act(self, calls: tuple[ToolCall, ...]) -> StopSignal | None:
        verdicts: dict[str, ToolVerdict] = {}  # what monitors answered, by call id
        fingerprints = [fingerprint_call(call.name, call.arguments) for call in calls]
        approved: list[int] = []
        blocked: dict[int, str] = {}
        for index, call in enumerate(calls):
            await self._checkpoint(
                ToolCallProposed(
                    run_id=self._run_id,
                    turn=self._turn,
                    call=call,
                    fingerprint=fingerprints[index],
                    index=index,
                ),
                verdicts=verdicts,
                raise_on_stop=False,
            )
            if self._stop is not None:
                break
            verdict = verdicts.get(call.id)
            if verdict is not None and verdict.verdict == "block":
                blocked[index] = verdict.message or "This call was blocked."
            else:
                approved.append(index)

        results: dict[int, ToolResult] = {}
        if approved and (self._stop is None or call_specific(self._stop)):
            # A stop decided on one call (a budget or loop verdict) still lets the calls
            # approved before it run, so their work is kept; any other stop runs nothing.
            results = await self._execute(calls, fingerprints, approved)

        finished: StopSignal | None = None
        for index, call in enumerate(calls):
            verdict = verdicts.get(call.id)
            result = results.get(index)
            if result is not None:
                content = result.content
                self._tool_calls += 1 if result.executed else 0
                if (
                    call.name in self._in.finishing_tools
                    and not result.is_error
                    and finished is None
                ):
                    self._output = call.arguments
                    finished = self._make_stop(
                        ExitReason.COMPLETED,
                        "model.end_turn",
                        "conductor",
                        f"The model called {call.name} to finish.",
                    )
            elif index in blocked:
                content = f"Error: {blocked[index]}"
            else:
                content = "Error: not run: the run was stopping."
            self._transcript.append(ChatMessage(role="tool", tool_call_id=call.id, content=content))
            self._call_log.append(
                CallLogEntry(
                    turn=self._turn,
                    call_id=call.id,
                    tool=call.name,
                    arguments=call.arguments,
                    fingerprint=fingerprints[index],
                    verdict=(
                        "block"
                        if index in blocked
                        else "not_run"
                        if result is None or not result.executed
                        else (verdict.verdict if verdict is not None else "allow")
                    ),
                    cache=result.cache if result is not None else "none",
                    is_error=result.is_error if result is not None else True,
                    error_kind=result.error_kind if result is not None else None,
                    duration_seconds=result.duration_seconds if result is not None else 0.0,
                )
            )
        if self._stop is not None:
            raise Stopped(self._stop)
        return finished

    async def _execute(
        self, calls: tuple[ToolCall, ...], fingerprints: list[str], approved: list[int]
    ) -> dict[int, ToolResult]:
        self._enter("ACT", f"running {len(approved)} tool call(s)")
        every = len(approved) == len(calls)
        await self._bus.publish(
            ToolExecute(
                run_id=self._run_id,
                turn=self._turn,
                calls=calls if every else tuple(calls[i] for i in approved),
                fingerprints=tuple(fingerprints[i] for i in approved)
                if not every
                else tuple(fingerprints),
            )
        )
        by_id = {calls[i].id: i for i in approved}
        results: dict[int, ToolResult] = {}
        cancelled = False
        while len(results) < len(approved):
            if self._stop is not None and not cancelled and not call_specific(self._stop):
                cancelled = True
                await self._bus.publish(
                    ToolsCancel(
                        run_id=self._run_id,
                        turn=self._turn,
                        grace_seconds=self._settings.abort_grace_seconds,
                        reason=self._stop.cause,
                    )
                )
            msg = self._inbox.receive_nowait()  # quick tools answered during the publish
            if msg is None:
                msg = await (
                    self._receive(confirming=True, extra=self._settings.abort_grace_seconds)
                    if cancelled
                    else self._inbox.receive()
                )
            if msg is None:
                break
            match msg:
                case ToolResult(turn=turn, call_id=call_id) if (
                    turn == self._turn and call_id in by_id
                ):
                    results[by_id[call_id]] = msg
                case _:
                    self._control(msg)
        return results


def call_specific(stop: StopSignal) -> bool:
    return stop.cause == "budget.max_tool_calls" or stop.cause.startswith(("loop.", "hook."))
