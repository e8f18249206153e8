"""The loop monitor: runs a :class:`~actors.loop.LoopDetector` per run on the bus.

It answers (``answers=True``, only with :meth:`Bus.publish_nowait`):

* a proposed call at ``warning`` → ``ToolVerdict(warn)`` and a ``Nudge`` (unless the warning
  is rate-limited); at ``critical`` → ``ToolVerdict(block)`` with the reason the model reads
  as the tool error (and a ``Nudge`` under gemini's strikes); at ``break`` →
  ``StopSignal(hook_stopped, loop.<detector>)``;
* streamed text that loops → ``ModelCancel(reason="loop.content")`` and a ``Nudge`` the
  first time, ``StopSignal(hook_stopped, loop.content)`` (and ``ModelCancel``) when it stops.

An error streak's nudge quotes the failures; when they are path errors and the run has a
folder, the folder's real listing (its top level, at most :data:`LISTING_MAX` names) is
added, so a model inventing paths reads the ones that exist.

A run's state is made at its first proposed call or streamed delta (a run parked at its
first model request costs nothing), with its config (:meth:`LoopMonitor.override`, else the
monitor's), and forgotten at ``RunStarted`` and ``RunFinished``. Content tracking restarts
with each model response and at each tool call.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus

from actors.loop import STRICT, Decision, LoopConfig, LoopDetector
from bus import (
    Bus,
    ChatMessage,
    Message,
    ModelCancel,
    ModelError,
    ModelReply,
    ModelRequest,
    ModelTextDelta,
    Notice,
    Nudge,
    RunFinished,
    RunStarted,
    ToolCallProposed,
    ToolResult,
    ToolVerdict,
    stop_signal,
)

__all__ = ["LISTING_MAX", "SOURCE", "LoopMonitor", "folder_listing"]

SOURCE: Final = "loop_monitor"

LISTING_MAX: Final = 50
"""Names of a folder's listing added to an error streak's nudge."""

_PATH_ERRORS: Final = ("does not exist", "no such file", "not found", "is not a directory")
"""Words of an error that says a path is wrong."""


def folder_listing(folder: str, limit: int = LISTING_MAX) -> str:
    """The top level of ``folder`` as the model reads it (directories end with ``/``,
    sorted, at most ``limit`` names); empty when it cannot be read. Names only: nothing
    is followed or opened but the folder itself."""
    try:
        with os.scandir(folder) as entries:
            names = sorted(
                entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "")
                for entry in entries
            )
    except OSError:
        return ""
    shown = ", ".join(names[:limit]) or "(empty)"
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return f"The folder's files (top level): {shown}{more}."


logger = logging.getLogger("loopfuse.loop")


@dataclass(slots=True)
class _Check:
    """What the model-based check reads: the task, the model to ask, the recent history."""

    task: str
    model: str
    history: deque[str]
    request: ModelRequest | None = None
    """The check in flight (asked again once when its answer is not a verdict)."""
    retried: bool = False


@dataclass(slots=True)
class _Run:
    detector: LoopDetector
    stream_turn: int | None = None
    stopped: bool = False
    check: _Check | None = None
    """Only when ``llm_check`` is on."""


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
        self._restored: dict[str, bytes] = {}
        self._folders: dict[str, str] = {}
        """A run's folder, while its error streak may need its listing."""
        self._runs: dict[str, _Run] = {}
        self._table = self.handlers()  # what :meth:`run` serves and :meth:`handle` calls

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until the bus closes this subscription; started once subscribed."""
        subscription = self._bus.subscribe(*self._table, name=self._name, answers=True, inline=True)
        try:
            await subscription.serve_by_type(self._table, task_status=task_status)
        finally:
            self._bus.unsubscribe(subscription)

    def override(self, run_id: str, config: LoopConfig) -> None:
        """Use ``config`` for ``run_id`` (call before the run starts)."""
        self._overrides[run_id] = config

    def snapshot(self, run_id: str) -> bytes | None:
        """The loop state of ``run_id`` (:meth:`LoopDetector.snapshot`), or ``None`` when
        the run has none yet (not started, finished, or no call or delta seen). A run
        restored but not yet resumed gives back what it was restored with."""
        state = self._runs.get(run_id)
        if state is None:
            return self._restored.get(run_id)
        return state.detector.snapshot()

    def restore(self, run_id: str, state: bytes) -> None:
        """Resume ``run_id`` with a :meth:`snapshot` of it (call before the run starts, with
        the run's config set as before): applied when the run's first call or delta
        arrives; ``RunStarted`` does not drop it, ``RunFinished`` does. A snapshot that does
        not fit the run's config is ignored (the run starts from zero)."""
        self._runs.pop(run_id, None)
        self._restored[run_id] = state

    def active_runs(self) -> int:
        """Runs whose state is held: started, not finished, and past their first proposed
        call or streamed delta."""
        return len(self._runs)

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        """The function of each message type the monitor handles (what the bus calls)."""
        return {
            ToolCallProposed: self._call_proposed,
            ModelTextDelta: self._text_delta,
            ToolResult: self._tool_result,
            ModelReply: self._reply,
            ModelError: self._model_error,
            RunStarted: self._run_started,
            RunFinished: self._run_finished,
        }

    def handle(self, msg: Message) -> None:
        """Handle one message as the bus would; never blocks.

        :raises KeyError: the monitor does not handle ``msg``'s type.
        """
        self._table[type(msg)](msg)

    def _call_proposed(self, msg: ToolCallProposed) -> None:
        state = self._runs.get(msg.run_id) or self._new_run(msg.run_id)
        if state.stopped:
            return
        call = msg.call
        decision = state.detector.propose(
            call.name, call.arguments, call_id=call.id, fingerprint=msg.fingerprint
        )
        level = decision.level
        if level == "none" or (level == "warning" and decision.nudge is None):
            return  # nothing found, or a rate-limited warning: nothing to say
        if level == "break":
            self._stop(state, msg.run_id, decision)
            return
        self._bus.publish_nowait(
            ToolVerdict(
                run_id=msg.run_id,
                turn=msg.turn,
                call_id=call.id,
                verdict="warn" if level == "warning" else "block",
                source=self._name,
                message=decision.message,
                cause=decision.cause or "",
            )
        )
        self._nudge(msg.run_id, decision)

    def _text_delta(self, msg: ModelTextDelta) -> None:
        if msg.turn < 0:
            return  # the model-based check's answer streaming
        state = self._runs.get(msg.run_id) or self._new_run(msg.run_id)
        if state.stopped:
            return
        if state.stream_turn != msg.turn:
            state.detector.new_stream()
            state.stream_turn = msg.turn
        decision = state.detector.feed_text(msg.text)
        if decision.level == "none":
            return
        self._bus.publish_nowait(
            ModelCancel(run_id=msg.run_id, turn=msg.turn, reason="loop.content")
        )
        if decision.level == "break":
            self._stop(state, msg.run_id, decision)
        else:
            self._nudge(msg.run_id, decision)

    def _tool_result(self, msg: ToolResult) -> None:
        known = self._runs.get(msg.run_id)
        if known is not None and known.check is not None:
            known.check.history.append(f"{msg.tool} returned: {msg.content}")
        if known is not None and known.detector.reads_results:
            known.detector.record_result(
                msg.call_id,
                msg.content,
                msg.is_error,
                result_fingerprint=msg.result_fingerprint,
                unknown_tool=msg.error_kind == "unknown_tool",
            )

    def _reply(self, msg: ModelReply) -> None:
        if msg.turn < 0:
            self._check_answered(msg.run_id, msg.text)
            return
        known = self._runs.get(msg.run_id)
        if known is None:
            return
        if known.stream_turn is not None:
            # (no delta since the last new stream: the content state is fresh)
            known.detector.new_stream()
            known.stream_turn = None
        if known.check is not None and not known.stopped:
            self._check_turn(known, msg)

    def _model_error(self, msg: ModelError) -> None:
        if msg.turn < 0 and msg.final:
            self._check_answered(msg.run_id, None)

    def _run_started(self, msg: RunStarted) -> None:
        self._runs.pop(msg.run_id, None)
        config = self._config_of(msg.run_id, keep=True)
        if msg.folder and config.error_streak.enabled:
            self._folders[msg.run_id] = msg.folder
        if config.llm_check.enabled:
            # the check reads every reply: the run's state is made now, with its task
            self._new_run(msg.run_id, msg)

    def _run_finished(self, msg: RunFinished) -> None:
        self._runs.pop(msg.run_id, None)
        self._overrides.pop(msg.run_id, None)
        self._restored.pop(msg.run_id, None)
        self._folders.pop(msg.run_id, None)

    # ------------------------------------------------------------------ internals

    def _config_of(self, run_id: str, *, keep: bool = False) -> LoopConfig:
        config = self._overrides.get(run_id) if keep else self._overrides.pop(run_id, None)
        if config is None:
            config = self._config if isinstance(self._config, LoopConfig) else self._config(run_id)
        return config

    def _new_run(self, run_id: str, started: RunStarted | None = None) -> _Run:
        """The state of a run seen for the first time (its first call or delta; its start
        when its config asks for the model-based check)."""
        config = self._config_of(run_id)
        detector = LoopDetector(config)
        restored = self._restored.pop(run_id, None)
        if restored is not None:
            try:
                detector.restore(restored)
            except ValueError:
                logger.warning("run %s: loop state not restored (another config)", run_id)
                detector.reset()
        state = self._runs[run_id] = _Run(detector)
        if started is not None:
            llm = config.llm_check
            state.check = _Check(
                started.task, llm.model or started.model, deque(maxlen=llm.history)
            )
        return state

    # ------------------------------------------------------------------ model-based check

    def _check_turn(self, state: _Run, msg: ModelReply) -> None:
        """Note the reply in the check's history; ask the checking model when due."""
        check = state.check
        assert check is not None
        if msg.text:
            check.history.append(f"assistant said: {msg.text}")
        for call in msg.tool_calls:
            check.history.append(f"assistant called {call.name}({call.arguments})")
        detector = state.detector
        if not detector.llm_check_due(msg.turn):
            return
        messages = tuple(
            ChatMessage(role="system" if role == "system" else "user", content=content)
            for role, content in detector.llm_check_messages(check.task, tuple(check.history))
        )
        check.request = ModelRequest(
            run_id=msg.run_id,
            turn=-msg.turn,  # not a turn of the run: the conductor leaves it alone
            model=check.model,
            messages=messages,
            max_tokens=detector.config.llm_check.max_tokens,
            purpose="loop_check",
        )
        check.retried = False
        self._bus.publish_nowait(check.request)

    def _check_answered(self, run_id: str, text: str | None) -> None:
        state = self._runs.get(run_id)
        if state is None or state.stopped:
            return
        check = state.check
        if text is not None and check is not None and not state.detector.llm_check_readable(text):
            # not a verdict (no JSON, a confidence outside [0, 1]): ask once more, then
            # ignore this check (as an error: no loop, the interval kept) and say so
            if not check.retried and check.request is not None:
                check.retried = True
                self._bus.publish_nowait(check.request)
                return
            self._bus.publish_nowait(
                Notice(
                    run_id=run_id,
                    kind="loop.llm_check",
                    text=(
                        "The loop check's answer was not a verdict twice (a JSON object "
                        "with unproductive_state_confidence from 0 to 1); this check is "
                        f"ignored. Its answer: {text[:200]!r}"
                    ),
                    source=self._name,
                )
            )
            text = None
        decision = state.detector.llm_check_answer(text)
        if decision.level == "break":
            self._stop(state, run_id, decision)
        elif decision.level != "none":
            self._nudge(run_id, decision)

    def _nudge(self, run_id: str, decision: Decision) -> None:
        if decision.nudge is not None and decision.cause is not None:
            text = decision.nudge
            folder = self._folders.get(run_id)
            if (
                decision.detector == "error_streak"
                and folder is not None
                and any(words in text.lower() for words in _PATH_ERRORS)
                and (listing := folder_listing(folder))
            ):
                text = f"{text}\n{listing}"  # after path errors, the folder's listing
            self._bus.publish_nowait(
                Nudge(run_id=run_id, kind=decision.cause, text=text, source=self._name)
            )

    def _stop(self, state: _Run, run_id: str, decision: Decision) -> None:
        state.stopped = True
        self._bus.publish_nowait(
            stop_signal(
                decision.cause or "loop.generic_repeat",
                run_id=run_id,
                source=self._name,
                detail=decision.message,
            )
        )
