"""Plays a :class:`~orchestrator.replay.recording.Recording` through the real runtime.

A replay is a live run in everything but its model and its tools, which are scripted
(``docs/replay.md``): the conductor, the monitors, the tool cache, the hooks and the
verdicts are the runtime's own, on a runtime of its own.

* the **model** (:class:`ReplayModel`) answers the n-th request of each purpose with the
  recording's n-th answer of that purpose; past the end it repeats the last answer at most
  :data:`DEFAULT_MAX_EXTRA` times (``beyond="repeat"``) or answers an empty final reply
  (``beyond="end"``), counted in :attr:`ReplayModel.extrapolated`.
* the **tools** (:func:`replay_registry`) answer the n-th run of a call with the
  recording's n-th result for the same tool and arguments (the last repeats); a call the
  recording never ran gets an error saying so.

A recorded abort is played by aborting after the same event. The replay runs under the
recorded model's name, in a scratch folder holding empty files of the names a recorded
nudge listed (at most ``LISTING_MAX``), so the same nudge says the same.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import msgspec
from anyio.abc import TaskStatus

from actors.loop.monitor import LISTING_MAX
from actors.tools import Tool, ToolContext, ToolError, ToolRegistry, default_registry
from actors.tools.schema import argument_checker, inline_refs
from bus import Bus, Message, ModelCancel, ModelReply, ModelRequest, ModelTextDelta
from orchestrator.config import Config
from orchestrator.replay.recording import Answer, Decision, Recording, decisions, result_key
from orchestrator.result import RunResult
from orchestrator.runtime import RunHandle, RunSpec, Runtime

__all__ = ["DEFAULT_MAX_EXTRA", "Beyond", "Played", "ReplayModel", "play", "replay_registry"]

Beyond = Literal["repeat", "end"]

DEFAULT_MAX_EXTRA: Final = 200
"""Answers past the recording at most (then the model gives a final empty reply)."""

_NO_RESULT: Final = "replay: the recording has no result for this call (it never ran)"


class Played(msgspec.Struct, frozen=True, kw_only=True):
    """A replay's result, how many model answers were past the recording, and the price
    per million tokens the replay's run was charged."""

    result: RunResult
    extrapolated: int
    input_price: float
    output_price: float
    decisions: tuple[Decision, ...] = ()
    """The replay's warnings, refusals, nudges and first stop, in order."""


class ReplayModel:
    """The model actor of a replay (see the module docstring)."""

    def __init__(
        self,
        bus: Bus,
        recording: Recording,
        *,
        beyond: Beyond = "repeat",
    ) -> None:
        self._bus = bus
        self._answers = recording.answers
        self._beyond = beyond
        self._asked: dict[str, int] = {}
        self._held: dict[tuple[str, int], ModelReply] = {}
        self.extrapolated = 0
        """Requests answered past the end of the recording."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Answer requests until the bus subscription closes."""
        handlers: dict[type[Message], Callable[[Any], None]] = {
            ModelRequest: self._request,
            ModelCancel: self._cancel,
        }
        sub = self._bus.subscribe(*handlers, name="replay_model", inline=True)
        try:
            await sub.serve_by_type(handlers, task_status=task_status)
        finally:
            self._bus.unsubscribe(sub)

    def _request(self, request: ModelRequest) -> None:
        publish = self._bus.publish_nowait
        answer = self._next(request.purpose)
        if answer.error is not None:
            publish(msgspec.structs.replace(answer.error, run_id=request.run_id, turn=request.turn))
            return
        reply = answer.reply
        assert reply is not None
        reply = msgspec.structs.replace(reply, run_id=request.run_id, turn=request.turn)
        if reply.text:
            publish(ModelTextDelta(run_id=request.run_id, turn=request.turn, text=reply.text))
        if reply.aborted:  # the caller aborted it mid-answer: it ends when cancelled again
            self._held[(request.run_id, request.turn)] = reply
            return
        publish(reply)

    def _cancel(self, msg: ModelCancel) -> None:
        if (reply := self._held.pop((msg.run_id, msg.turn), None)) is not None:
            self._bus.publish_nowait(reply)

    def _next(self, purpose: str) -> Answer:
        recorded = self._answers.get(purpose, ())
        index = self._asked.get(purpose, 0)
        self._asked[purpose] = index + 1
        if index < len(recorded):
            return recorded[index]
        self.extrapolated += 1
        if self._beyond == "repeat" and recorded and self.extrapolated <= DEFAULT_MAX_EXTRA:
            last = recorded[-1]
            if last.reply is not None and not last.reply.aborted:
                calls = tuple(
                    msgspec.structs.replace(call, id=f"{call.id}~{index}")
                    for call in last.reply.tool_calls
                )
                return Answer(reply=msgspec.structs.replace(last.reply, tool_calls=calls))
            if last.error is not None:
                return last
        return Answer(reply=ModelReply(run_id="", turn=0, text="", finish_reason="stop"))


def replay_registry(recording: Recording) -> ToolRegistry:
    """A registry of the tools ``recording``'s run offered, each answering from the
    recording (a built-in's flags are kept: idempotent, finishing a stage)."""
    builtins = default_registry()
    registry = ToolRegistry()
    for spec in recording.tools:
        builtin = builtins.get(spec.name)
        try:  # a schema a tool can take (a recording's may predate the check)
            schema = msgspec.json.decode(spec.parameters)
            if not isinstance(schema, dict):
                raise ValueError("not an object")
            argument_checker(inline_refs(schema))
            if schema.get("type") != "object":
                raise ValueError("not an object")
        except ValueError:  # msgspec.DecodeError too
            schema = {"type": "object", "properties": {}}
        registry.add(
            Tool.from_json_schema(
                spec.name,
                spec.description,
                schema,
                _answerer(spec.name, recording),
                idempotent=spec.name in recording.idempotent
                or (builtin is not None and builtin.idempotent),
                finishes_stage=builtin is not None and builtin.finishes_stage,
            )
        )
    return registry


def _answerer(name: str, recording: Recording) -> Callable[[dict[str, Any], ToolContext], Any]:
    async def answer(params: dict[str, Any], ctx: ToolContext) -> str:
        key = result_key(name, msgspec.json.encode(params).decode())
        outcomes = recording.results.get(key)
        if not outcomes:
            raise ToolError("replay", _NO_RESULT)
        counts: dict[str, int] = ctx.state.setdefault("replay", {})
        nth = counts.get(key, 0)
        counts[key] = nth + 1
        outcome = outcomes[min(nth, len(outcomes) - 1)]
        if outcome.aborted:
            await anyio.sleep_forever()  # it was running when the caller aborted
        if outcome.is_error:
            raise ToolError(outcome.error_kind or "replay", outcome.content)
        return outcome.content

    return answer


async def play(
    config: Config,
    recording: Recording,
    *,
    overrides: Mapping[str, Any] | None = None,
    beyond: Beyond = "repeat",
) -> Played:
    """Replay ``recording`` under ``config`` with the run's own overrides, then
    ``overrides`` (e.g. a ``loop_preset``) over them."""
    models: list[ReplayModel] = []

    def model_actor(bus: Bus) -> ReplayModel:
        model = ReplayModel(bus, recording, beyond=beyond)
        models.append(model)
        return model

    point = recording.abort

    async def abort_at(handle: RunHandle) -> None:
        """Abort the replay after the event the recording's abort came."""
        assert point is not None
        seen = 0
        async for event in handle.events():
            if type(event).__name__ == point.after and getattr(event, "turn", 0) == point.turn:
                seen += 1
                if seen >= point.count:
                    await handle.abort(point.detail or "Aborted (replayed from the recording).")
                    return

    settings: dict[str, Any] = {**recording.overrides, **(overrides or {})}
    settings["tools"] = tuple(spec.name for spec in recording.tools)
    settings.pop("model", None)  # the replay's model is the recording, under its name:
    if recording.model:  # the context estimates, window and prices are looked up by it
        settings["model"] = recording.model
    with tempfile.TemporaryDirectory(prefix="loopfuse-replay-") as scratch:
        folder = _recreate_folder(recording.folder_listing, Path(scratch))
        async with Runtime(config, tools=replay_registry(recording), model_actor=model_actor) as rt:
            handle = await rt.start(
                RunSpec(
                    task=recording.task,
                    system=recording.system,
                    folder=folder,
                    overrides=settings,
                ),
                watch=abort_at if point is not None else None,
            )
            result = await handle.result()
            events = rt.event_log.events(handle.run_id)
    started = events[0] if events else None  # the RunStarted, with the prices charged
    return Played(
        result=result,
        extrapolated=models[0].extrapolated,  # the runtime made its model on entering
        input_price=getattr(started, "input_price_per_million", 0.0),
        output_price=getattr(started, "output_price_per_million", 0.0),
        decisions=decisions(events),
    )


def _recreate_folder(listing: str | None, scratch: Path) -> str | None:
    """A folder whose top level is ``listing``'s names (empty files, ``name/``
    directories), so a nudge that lists the folder says what it said; ``None`` without."""
    if listing is None:
        return None
    shown, _, more = listing.partition(" (and ")
    names = [] if shown == "(empty)" else shown.split(", ")[:LISTING_MAX]
    count = more.split(" ", 1)[0][:16]  # a recording's text: at most 1,000 placeholders
    extra = min(int(count), 1_000) if count.isdecimal() else 0
    names += [f"\x7freplay-{n:06d}" for n in range(extra)]  # sorted after the shown names
    for name in names:
        path = scratch / name.rstrip("/")
        if path.parent != scratch or not path.name or path.name in (".", ".."):
            continue  # not a top-level name
        if name.endswith("/"):
            path.mkdir(exist_ok=True)
        else:
            path.touch()
    return str(scratch)
