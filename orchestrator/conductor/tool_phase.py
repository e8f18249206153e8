"""The tool phase: every call proposed at a checkpoint, approved ones run, results in order."""

from __future__ import annotations

from actors.fingerprint import fingerprint_call
from bus import (
    Bus,
    ChatMessage,
    ToolCall,
    ToolCallProposed,
    ToolExecute,
    ToolResult,
    ToolsCancel,
    ToolVerdict,
)
from orchestrator.conductor.inbox import ControlInbox
from orchestrator.conductor.inputs import RunInputs
from orchestrator.conductor.state import RunRecord
from orchestrator.result import CallLogEntry

__all__ = ["ToolPhase"]


class ToolPhase:
    """Proposed calls through the monitors, approved calls to the executor, results back."""

    __slots__ = ("_bus", "_control", "_finishing", "_grace", "_run")

    def __init__(self, bus: Bus, run: RunRecord, control: ControlInbox, inputs: RunInputs) -> None:
        self._bus = bus
        self._run = run
        self._control = control
        self._finishing = inputs.finishing_tools
        self._grace = inputs.settings.abort_grace_seconds

    async def run(self, calls: tuple[ToolCall, ...]) -> str | None:
        """Propose, run and record ``calls``; returns the name of the finishing tool that
        succeeded, if one did. A stop received meanwhile ends the run once every call has
        its result (or its "not run") in the transcript."""
        run, control = self._run, self._control
        fingerprints = [fingerprint_call(call.name, call.arguments) for call in calls]
        approved: list[int] = []
        blocked: dict[int, str] = {}
        verdicts: dict[str, ToolVerdict] = {}  # what monitors answered, by call id
        control.verdicts = verdicts
        try:
            for index, call in enumerate(calls):
                await control.settle(
                    ToolCallProposed(
                        run_id=run.run_id,
                        turn=run.turn,
                        call=call,
                        fingerprint=fingerprints[index],
                        index=index,
                    )
                )
                if control.stop is not None:
                    break
                verdict = verdicts.get(call.id)
                if verdict is not None and verdict.verdict == "block":
                    blocked[index] = verdict.message or "This call was blocked."
                else:
                    approved.append(index)
        finally:
            control.verdicts = None

        results: dict[int, ToolResult] = {}
        stop = control.stop
        if approved and (stop is None or stop.per_call):
            # A stop decided on one call (a budget or loop verdict) still lets the calls
            # approved before it run, so their work is kept; any other stop runs nothing.
            results = await self._execute(calls, fingerprints, approved)

        finished: str | None = None
        for index, call in enumerate(calls):
            verdict = verdicts.get(call.id)
            result = results.get(index)
            if result is not None:
                content = result.content
                run.tool_calls += 1 if result.executed else 0
                if call.name in self._finishing and not result.is_error and finished is None:
                    run.output = call.arguments
                    finished = call.name
            elif index in blocked:
                content = f"Error: {blocked[index]}"
            else:
                content = "Error: not run: the run was stopping."
            run.transcript.append(ChatMessage(role="tool", tool_call_id=call.id, content=content))
            run.call_log.append(
                CallLogEntry(
                    turn=run.turn,
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
        control.end_if_stopped()
        return finished

    async def _execute(
        self, calls: tuple[ToolCall, ...], fingerprints: list[str], approved: list[int]
    ) -> dict[int, ToolResult]:
        run, control = self._run, self._control
        run.enter("ACT", f"running {len(approved)} tool call(s)")
        every = len(approved) == len(calls)
        await self._bus.publish(
            ToolExecute(
                run_id=run.run_id,
                turn=run.turn,
                calls=calls if every else tuple(calls[i] for i in approved),
                fingerprints=tuple(fingerprints)
                if every
                else tuple(fingerprints[i] for i in approved),
            )
        )
        by_id = {calls[i].id: i for i in approved}
        results: dict[int, ToolResult] = {}
        cancelled = False
        while len(results) < len(approved):
            stop = control.stop
            if stop is not None and not cancelled and not stop.per_call:
                cancelled = True
                await self._bus.publish(
                    ToolsCancel(
                        run_id=run.run_id,
                        turn=run.turn,
                        grace_seconds=self._grace,
                        reason=stop.cause,
                    )
                )
            msg = control.receive_nowait()  # quick tools answered during the publish
            if msg is None:
                msg = await (
                    control.receive_confirming(extra=self._grace)
                    if cancelled
                    else control.receive()
                )
            if msg is None:
                break
            match msg:
                case ToolResult(turn=turn, call_id=call_id) if (
                    turn == run.turn and call_id in by_id
                ):
                    results[by_id[call_id]] = msg
                case _:
                    control.take(msg)
        return results
