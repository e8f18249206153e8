"""The hook runner: runs each run's hooks on the bus and answers before the settle returns.

It answers (``answers=True``, only with :meth:`Bus.publish_nowait`):

* ``ToolCallProposed`` → the run's ``pre_tool`` hooks for that tool, concurrently: the first
  ``deny`` → ``StopSignal(hook_stopped, hook.<name>)``, else the first ``block`` →
  ``ToolVerdict(block)`` (the model reads its message as the tool error).
* ``ModelReplied`` of a final answer (not a truncated one) → the ``stop`` hooks, given the
  text of the ``ModelReply`` before it: a ``block`` vetoes it with a
  ``Nudge(kind="hook.<name>", continues=True)``, once per run; a ``deny`` stops the run.

Served per run (:meth:`Subscription.serve_per_run`): a run's hooks hold up only that run.
A second subscription takes ``AbortRequested`` out of turn and cancels that run's hooks at
once (their processes killed). State is kept only for runs with hooks, from ``RunStarted``
to ``RunFinished`` (``docs/hooks.md``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, assert_never

import anyio
import msgspec
from anyio.abc import TaskStatus

from actors.hooks.command import run_command
from actors.hooks.config import CommandHook, Hook, HookFunction, HookInput
from actors.hooks.outcome import HookOutcome, command_outcome, function_outcome, most_severe
from actors.hooks.python import call_function
from bus import (
    AbortRequested,
    Bus,
    Job,
    ModelReplied,
    ModelReply,
    Nudge,
    RunFinished,
    RunStarted,
    ToolCallProposed,
    ToolVerdict,
    stop_signal,
)

__all__ = ["HANDLED_TYPES", "SOURCE", "HookRunner"]

logger = logging.getLogger("loopfuse.hooks")

SOURCE: Final = "hook_runner"

_Message = RunStarted | RunFinished | ToolCallProposed | ModelReply | ModelReplied
HANDLED_TYPES: Final = (RunStarted, RunFinished, ToolCallProposed, ModelReply, ModelReplied)
"""The message types :meth:`HookRunner.handle` takes (its answering subscription's)."""
_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class _Run:
    hooks: tuple[Hook, ...]
    folder: str | None
    text: str = ""
    vetoed: bool = False
    stopped: bool = False
    aborted: bool = False
    scope: anyio.CancelScope | None = None


class HookRunner:
    """Runs the hooks of every run of a bus.

    :param hooks: one tuple of hooks for every run, or a function giving each run's hooks
        from its run id (read once, at ``RunStarted``).
    :param functions: the Python hook functions by name (read when a hook runs).
    :param hide_env: environment variables command hooks do not get (the ones that hold
        secrets, such as the model's API key); the rest of the environment is passed on.
    """

    def __init__(
        self,
        bus: Bus,
        hooks: Sequence[Hook] | Callable[[str], Sequence[Hook]] = (),
        functions: Mapping[str, HookFunction] | None = None,
        *,
        hide_env: Collection[str] = (),
    ) -> None:
        self._bus = bus
        self._hooks = hooks
        self._functions: Mapping[str, HookFunction] = functions if functions is not None else {}
        self._hide_env = frozenset(hide_env)
        self._runs: dict[str, _Run] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until the bus closes these subscriptions; started once subscribed."""
        answering = self._bus.subscribe(*HANDLED_TYPES, name=SOURCE, answers=True, inline=True)
        aborts = self._bus.subscribe(AbortRequested, name=f"{SOURCE}.aborts", inline=True)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(aborts.serve, self._on_abort)
                await tg.start(answering.serve_per_run, self.handle)
                task_status.started()
        finally:
            self._bus.unsubscribe(answering)
            self._bus.unsubscribe(aborts)
            self._runs.clear()

    def active_runs(self) -> int:
        """Runs whose state is held (started with hooks, not finished)."""
        return len(self._runs)

    def running(self) -> int:
        """Runs whose hooks are running now."""
        return sum(state.scope is not None for state in self._runs.values())

    def handle(self, msg: _Message) -> Job | None:
        """Handle one message: ``None`` when done, or the job that runs its hooks."""
        if type(msg) is not RunStarted and msg.run_id not in self._runs:
            return None  # a run without hooks (most runs): every message is a no-op
        match msg:
            case RunStarted():
                configured = self._hooks(msg.run_id) if callable(self._hooks) else self._hooks
                if configured:
                    self._runs[msg.run_id] = _Run(tuple(configured), msg.folder)
            case RunFinished():
                self._runs.pop(msg.run_id, None)
            case ToolCallProposed():
                if (state := self._live(msg.run_id)) is not None:
                    calls = [h for h in state.hooks if h.applies_to("pre_tool", msg.call.name)]
                    if calls:
                        return functools.partial(self._judge_call, state, msg, calls)
            case ModelReply():
                if (state := self._runs.get(msg.run_id)) is not None:
                    state.text = msg.text
            case ModelReplied():
                state = self._live(msg.run_id)
                final = not msg.tool_calls and msg.finish_reason != "length"
                if state is not None and final and not state.vetoed:
                    answers = [h for h in state.hooks if h.applies_to("stop")]
                    if answers:
                        return functools.partial(self._judge_answer, state, msg, answers)
            case _:
                assert_never(msg)
        return None

    # ------------------------------------------------------------------ judging

    def _live(self, run_id: str) -> _Run | None:
        state = self._runs.get(run_id)
        if state is None or state.stopped or state.aborted:
            return None
        return state

    async def _judge_call(self, state: _Run, msg: ToolCallProposed, hooks: list[Hook]) -> None:
        call = msg.call
        arguments: Any = call.arguments  # as decoded JSON, or the raw text when it is not JSON
        with contextlib.suppress(msgspec.DecodeError):
            arguments = msgspec.json.decode(call.arguments)
        blocked = await self._judge(
            state,
            hooks,
            f"the call {call.name} ({call.id})",
            run_id=msg.run_id,
            turn=msg.turn,
            tool=call.name,
            call_id=call.id,
            arguments=arguments,
        )
        if blocked:
            worst = blocked[0]
            self._bus.publish_nowait(
                ToolVerdict(
                    run_id=msg.run_id,
                    turn=msg.turn,
                    call_id=call.id,
                    verdict="block",
                    source=f"hook.{worst.hook}",
                    message=worst.block_message(),
                    cause=f"hook.{worst.hook}",
                )
            )

    async def _judge_answer(self, state: _Run, msg: ModelReplied, hooks: list[Hook]) -> None:
        blocked = await self._judge(
            state, hooks, "the final answer", run_id=msg.run_id, turn=msg.turn, text=state.text
        )
        if blocked:
            state.vetoed = True
        for outcome in blocked:
            self._bus.publish_nowait(
                Nudge(
                    run_id=msg.run_id,
                    kind=f"hook.{outcome.hook}",
                    text=outcome.veto_message(),
                    source=SOURCE,
                    continues=True,
                )
            )

    async def _judge(
        self, state: _Run, hooks: list[Hook], subject: str, **fields: Any
    ) -> list[HookOutcome]:
        """Run ``hooks`` on ``subject``: the outcomes that block, in ``hooks`` order; none
        when the run was aborted or a hook denied (the first ``deny`` stops the run)."""
        outcomes: list[HookOutcome | None] = [None] * len(hooks)
        with anyio.CancelScope() as scope:
            state.scope = scope
            try:
                async with anyio.create_task_group() as tg:
                    for index, hook in enumerate(hooks):
                        payload = HookInput(hook=hook.name, event=hook.event, **fields)
                        tg.start_soon(self._run_one, hook, payload, state.folder, outcomes, index)
            finally:
                state.scope = None
        if state.aborted or scope.cancelled_caught:
            return []
        done = [outcome for outcome in outcomes if outcome is not None]
        worst = most_severe(done)
        if worst is not None and worst.action == "deny":
            state.stopped = True
            detail = worst.deny_detail(subject)
            self._bus.publish_nowait(
                stop_signal(
                    f"hook.{worst.hook}", run_id=fields["run_id"], source=SOURCE, detail=detail
                )
            )
            return []
        return [outcome for outcome in done if outcome.action == "block"]

    async def _run_one(
        self,
        hook: Hook,
        payload: HookInput,
        cwd: str | None,
        outcomes: list[HookOutcome | None],
        index: int,
    ) -> None:
        if isinstance(hook, CommandHook):
            hide = self._hide_env
            env = {k: v for k, v in os.environ.items() if k not in hide} if hide else None
            result = await run_command(
                hook.command,
                _encode(payload) + b"\n",
                time_limit=hook.timeout_seconds,
                cwd=cwd,
                env=env,
            )
            outcome = command_outcome(hook, result)
        else:
            function = self._functions.get(hook.function)
            if function is None:
                why = f"no Python hook function registered as {hook.function!r}"
                outcome = HookOutcome(hook.name, hook.on_error, "", why)
            else:
                called = await call_function(function, payload, time_limit=hook.timeout_seconds)
                outcome = function_outcome(hook, called)
        if outcome.failure is not None:
            logger.warning(
                "hook %s of run %s failed (%s); on_error=%s",
                hook.name,
                payload.run_id,
                outcome.failure,
                hook.on_error,
            )
        outcomes[index] = outcome

    def _on_abort(self, msg: AbortRequested) -> None:
        state = self._runs.get(msg.run_id)
        if state is not None:
            state.aborted = True
            if state.scope is not None:
                state.scope.cancel()
