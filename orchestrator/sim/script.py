"""Which reply a request gets: the track and step derived from the request, and attempts.

The simulator keeps no conversation state. The step is the number of assistant messages
since the current track began; a nudge named by a branch starts a track. Only attempts of
one step (to fail the first N of them) are counted, keyed by run, track and step.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any, Final, NamedTuple

from actors.loop.llm_check import SYSTEM_PREFIX as LOOP_CHECK_PREFIX
from bus import NUDGE_MARKER
from orchestrator.sim.scenario import MAIN_TRACK, Fault, Scenario, Step

__all__ = [
    "ATTEMPTS_KEPT",
    "LOOP_CHECK_TRACK",
    "AttemptCounter",
    "Position",
    "fault_for",
    "filler",
    "find_track",
    "locate",
    "render_arguments",
    "step_at",
]

LOOP_CHECK_TRACK: Final = "loop_check"
"""The track that answers the loop monitor's model-based checks."""

# How many (run, track, step) attempt counters are remembered; the oldest are forgotten.
ATTEMPTS_KEPT: Final = 65_536

_STOCK = (
    "The measurements were repeated across all samples and the variation stayed within the "
    "expected range, so the analysis continues with the next group of readings. "
)


class Position(NamedTuple):
    """Where a request is: the track, the 0-based step on it, and replies so far."""

    track: str
    step: int
    replies: int


def find_track(scenarios: Mapping[str, Scenario], model: str) -> tuple[Scenario, str] | None:
    """The scenario and track that ``model`` plays (a pipeline stage's ``SCENARIO/TRACK``
    plays ``TRACK``), or ``None`` when it names none."""
    scenario = scenarios.get(model)
    if scenario is not None:
        return scenario, MAIN_TRACK
    name, _, track = model.partition("/")
    scenario = scenarios.get(name)
    return (scenario, track) if scenario is not None and track in scenario.tracks else None


def locate(
    scenario: Scenario, messages: Iterable[tuple[str, str]], *, track: str = MAIN_TRACK
) -> Position:
    """The position for a conversation given as ``(role, text)`` pairs, starting on
    ``track`` (a pipeline stage's model ``SCENARIO/TRACK`` starts on ``TRACK``). The loop
    monitor's model-based check (its system message starts with
    :data:`actors.loop.llm_check.SYSTEM_PREFIX`) plays the ``loop_check`` track, if the
    scenario has one: each check is a conversation of its own, so its first step."""
    start, assistants = 0, 0
    seen: Counter[str] = Counter()
    messages = list(messages)
    if LOOP_CHECK_TRACK in scenario.tracks and messages[:1]:
        role, text = messages[0]
        if role == "system" and text.startswith(LOOP_CHECK_PREFIX):
            return Position(LOOP_CHECK_TRACK, 0, 0)
    for role, text in messages:
        if role == "assistant":
            assistants += 1
            continue
        if role == "tool" or not text.startswith(NUDGE_MARKER):
            continue
        kind = text[len(NUDGE_MARKER) :].split("]", 1)[0]
        seen[kind] += 1
        for branch in scenario.branches:
            if (
                branch.nudge == kind
                and branch.nth in (None, seen[kind])
                and branch.from_track in (None, track)
            ):
                track, start = branch.track, assistants
                break
    return Position(track, assistants - start, assistants)


def step_at(scenario: Scenario, position: Position) -> Step | None:
    """The step to play at ``position``; the last step repeats, or the track starts over
    (``cycle``), if it says so."""
    steps = scenario.steps if position.track == MAIN_TRACK else scenario.tracks[position.track]
    if position.step < len(steps):
        return steps[position.step]
    last = steps[-1]
    if last.cycle:
        return steps[position.step % len(steps)]
    return last if last.repeat else None


def fault_for(step: Step, attempt: int) -> Fault | None:
    """The fault of the ``attempt``-th (0-based) try of ``step``, or ``None`` to succeed."""
    used = 0
    for fault in step.faults:
        used += fault.times
        if fault.forever or attempt < used:
            return fault
    return None


class AttemptCounter:
    """Counts tries per key, forgetting the least recently used beyond ``capacity``."""

    def __init__(self, capacity: int = ATTEMPTS_KEPT) -> None:
        self._capacity = capacity
        self._counts: OrderedDict[Hashable, int] = OrderedDict()

    def next(self, key: Hashable) -> int:
        """The 0-based number of this attempt for ``key``, counting it."""
        attempt = self._counts.pop(key, 0)
        self._counts[key] = attempt + 1
        if len(self._counts) > self._capacity:
            self._counts.popitem(last=False)
        return attempt

    def __len__(self) -> int:
        return len(self._counts)


def render_arguments(value: Any, n: int) -> Any:
    """``value`` with ``{n}`` replaced by ``n``; a string that is exactly ``{n}`` becomes an int."""
    if isinstance(value, str):
        return n if value == "{n}" else value.replace("{n}", str(n))
    if isinstance(value, dict):
        return {k: render_arguments(v, n) for k, v in value.items()}
    if isinstance(value, list):
        return [render_arguments(v, n) for v in value]
    return value


def filler(text: str, chars: int) -> Iterator[str]:
    """``chars`` characters of ``text`` (or a stock paragraph) repeated, lazily, in pieces."""
    paragraph = text or _STOCK
    while chars > 0:
        piece = paragraph[:chars]
        chars -= len(piece)
        yield piece
