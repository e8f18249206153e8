"""Calling a Python hook: async functions are awaited, plain ones run in a worker thread
(so a slow one never blocks the event loop), both under a timeout."""

from __future__ import annotations

import inspect
from typing import NamedTuple

import anyio
import anyio.to_thread

from actors.hooks.config import ACTIONS, HookDecision, HookFunction, HookInput

__all__ = ["FunctionResult", "call_function"]


class FunctionResult(NamedTuple):
    """The function's decision, or why there is none (``failure``)."""

    decision: HookDecision | None
    failure: str | None = None


async def call_function(
    function: HookFunction, payload: HookInput, *, time_limit: float
) -> FunctionResult:
    """Call ``function``; never raises for the function's own faults."""
    result: object = None
    with anyio.move_on_after(time_limit) as scope:
        try:
            if inspect.iscoroutinefunction(function):
                result = await function(payload)
            else:
                # A thread that outlives the timeout is abandoned: its late answer is discarded.
                result = await anyio.to_thread.run_sync(function, payload, abandon_on_cancel=True)
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:
            return FunctionResult(None, f"raised {exc!r}"[:500])
    if scope.cancelled_caught:
        return FunctionResult(None, f"timed out after {time_limit:g} s")
    if result is None:
        return FunctionResult(HookDecision(action="allow"))
    if not isinstance(result, HookDecision):
        return FunctionResult(
            None, f"returned {type(result).__name__}, expected a HookDecision or None"
        )
    if result.action not in ACTIONS:
        return FunctionResult(None, f"answered the unknown action {result.action!r}")
    return FunctionResult(result)
