"""A real bus, a run's inbox and scripted actors: drive the conductor (or an actor) without
a runtime, and read back every message in the order it was published.

:func:`serving` runs real actors on a bus for a block; :func:`settle` and :func:`drain`
play the conductor's side of a checkpoint (publish settled, read the answers).

:class:`Script` plays the actors the conductor talks to. It answers inline, during the
publish, as the monitors do: a settling checkpoint returns with its answers in the inbox.
By default the model answers each request with the next of ``replies``, the tool executor
answers each call, and a cancellation is confirmed; :meth:`Script.on` makes a message of a
type (at a turn, an index) answered with given messages instead, once.

A real :class:`bus.Bus`, never a stand-in: compiled classes cannot be subclassed from
Python, and the compiled build checks the types it is given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import msgspec
from anyio.abc import TaskStatus

from bus import (
    Bus,
    Inbox,
    Message,
    ModelCancel,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolExecute,
    ToolResult,
    ToolsCancel,
    Usage,
)
from orchestrator.conductor import ConductorSettings, RunInputs
from orchestrator.runtime.runtime import CONTEXT_FUNCTIONS
from tests.published import Published
from tests.started import NO_BUDGETS

__all__ = [
    "RUN_ID",
    "Harness",
    "Script",
    "calls",
    "drain",
    "inputs",
    "open_harness",
    "said",
    "serving",
    "settings",
    "settle",
]

RUN_ID = "run-1"


def settings(**overrides: Any) -> ConductorSettings:
    """The conductor's settings for a test: generous limits, no token or cost budget, no
    result cache, ``overrides`` on top."""
    values: dict[str, Any] = {
        "model": "scripted",
        "max_turns": 50,
        "max_tool_calls": 50,
        "deadline_seconds": 600.0,
        "max_output_tokens": 1000,
        "escalated_max_tokens": None,
        "tool_timeout_seconds": 30.0,
        "abort_grace_seconds": 1.0,
        "truncation_recoveries": 3,
        "max_cache_hits": 2,
        "cache_ttl_seconds": 300.0,
        "cache_max_entries": 0,
        "answer_max_tokens": 100,
        "answer_deadline_seconds": 30.0,
        "on_stop": "keep",
        "budget_mode": "ceiling",
        **NO_BUDGETS,
    }
    values.update(overrides)
    return ConductorSettings(**values)


def inputs(task: str = "Do the task.", **overrides: Any) -> RunInputs:
    """A run's inputs with :func:`settings` (pass ``settings=`` to change them)."""
    overrides.setdefault("settings", settings())
    overrides.setdefault("context", CONTEXT_FUNCTIONS)
    return RunInputs(run_id=RUN_ID, trace_id="trace-1", task=task, **overrides)


def said(text: str, *, finish: str = "stop", completion_tokens: int = 5) -> ModelReply:
    """A model reply with ``text`` (its run and turn are set when it is sent)."""
    return ModelReply(
        run_id="",
        turn=0,
        text=text,
        finish_reason=finish,
        usage=Usage(prompt_tokens=10, completion_tokens=completion_tokens),
    )


def calls(*tool_calls: ToolCall) -> ModelReply:
    """A model reply that asks for ``tool_calls``."""
    return ModelReply(
        run_id="",
        turn=0,
        text="",
        tool_calls=tool_calls,
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=10, completion_tokens=5),
    )


@dataclass
class _Rule:
    kind: type[Message]
    turn: int | None
    index: int | None
    answers: tuple[Message, ...]

    def matches(self, msg: Message) -> bool:
        return (
            type(msg) is self.kind
            and (self.turn is None or getattr(msg, "turn", None) == self.turn)
            and (self.index is None or getattr(msg, "index", None) == self.index)
        )


@dataclass
class Script:
    """The actors around the conductor, answering from a script."""

    replies: Sequence[ModelReply] = ()
    _replies: deque[ModelReply] = field(init=False)
    _rules: list[_Rule] = field(default_factory=list)
    _running: tuple[ToolCall, ...] = ()  # the calls of the last ToolExecute
    _turn: int = 0

    def __post_init__(self) -> None:
        self._replies = deque(self.replies)

    def on(
        self,
        kind: type[Message],
        *answers: Message,
        turn: int | None = None,
        index: int | None = None,
    ) -> Script:
        """Answer the first ``kind`` message (of ``turn``, at ``index``) with ``answers``
        instead of the default answer (there is none to a checkpoint)."""
        self._rules.append(_Rule(kind, turn, index, answers))
        return self

    def __call__(self, msg: Message) -> tuple[Message, ...]:
        for rule in self._rules:
            if rule.matches(msg):
                self._rules.remove(rule)
                if type(msg) is ToolExecute:
                    self._running, self._turn = msg.calls, msg.turn
                return rule.answers
        match msg:
            case ModelRequest():
                reply = self._replies.popleft()
                return (msgspec.structs.replace(reply, run_id=msg.run_id, turn=msg.turn),)
            case ModelCancel():
                return (ModelReply(run_id=msg.run_id, turn=msg.turn, text="", aborted=True),)
            case ToolExecute():
                return tuple(
                    ToolResult(
                        run_id=msg.run_id,
                        turn=msg.turn,
                        call_id=call.id,
                        tool=call.name,
                        content=f"result of {call.name}",
                    )
                    for call in msg.calls
                )
            case ToolsCancel():
                running, self._running = self._running, ()
                return tuple(
                    ToolResult(
                        run_id=msg.run_id,
                        turn=self._turn,
                        call_id=call.id,
                        tool=call.name,
                        content="Error: cancelled",
                        is_error=True,
                        error_kind="cancelled",
                        executed=False,
                    )
                    for call in running
                )
            case _:
                return ()


@dataclass
class Harness:
    """The bus, the run's inbox, and everything published so far."""

    bus: Bus
    inbox: Inbox
    _published: Published

    @property
    def messages(self) -> list[Message]:
        """Every message published on the bus so far, in order."""
        return self._published.messages

    def kinds(self) -> list[str]:
        """The type names of :attr:`messages`."""
        return [type(msg).__name__ for msg in self.messages]

    def of(self, kind: type[Any]) -> list[Any]:
        """The published messages of type ``kind``."""
        return [msg for msg in self.messages if type(msg) is kind]


@asynccontextmanager
async def open_harness(script: Script, run_id: str = RUN_ID) -> AsyncIterator[Harness]:
    """A bus on which ``script`` answers, and the inbox of ``run_id``."""
    published = Published()
    bus = published.bus
    actors = bus.subscribe(name="script", answers=True, inline=True)

    def answer(msg: Message) -> None:
        for reply in script(msg):
            bus.publish_nowait(reply)

    async with anyio.create_task_group() as tg:
        await tg.start(actors.serve, answer)
        try:
            with bus.open_inbox(run_id) as inbox:
                yield Harness(bus, inbox, published)
        finally:
            bus.close()


class Actor(Protocol):
    """What the runtime starts: ``run`` subscribes, reports started, and serves."""

    async def run(self, *, task_status: TaskStatus[None] = ...) -> None: ...


@asynccontextmanager
async def serving(bus: Bus, *actors: Actor) -> AsyncIterator[Bus]:
    """``actors`` serving on ``bus`` for the block (each started, so subscribed, in order);
    then the bus closes, so each finishes what it has queued and stops."""
    async with anyio.create_task_group() as tg:
        for actor in actors:
            await tg.start(actor.run)
        try:
            yield bus
        finally:
            bus.close()


def drain(inbox: Inbox) -> list[Message]:
    """Every message ``inbox`` holds now, in order."""
    messages: list[Message] = []
    while (msg := inbox.receive_nowait()) is not None:
        messages.append(msg)
    return messages


async def settle(bus: Bus, inbox: Inbox, msg: Message) -> list[Message]:
    """Publish ``msg`` as a checkpoint does (settled) and return what ``inbox`` got
    meanwhile: the answers of every answering subscriber."""
    await bus.publish_settled(msg)
    return drain(inbox)
