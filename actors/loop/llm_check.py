"""Detector 13, the model-based loop check (gemini-cli's LLM check), without the bus.

:class:`LlmCheck` keeps one run's schedule: :meth:`LlmCheck.due` says at which turns a
model is to be asked; :func:`check_messages` builds what it is asked (a system message that
starts with :data:`SYSTEM_PREFIX`, then the task and the run's recent history);
:func:`parse_answer` reads its answer, a JSON object
``{"unproductive_state_analysis": str, "unproductive_state_confidence": float}`` (as
gemini-cli's schema; a fenced ```json block is accepted).

An answer whose confidence is outside [0, 1] (a checker answering ``5`` for 5 %) is not a
verdict: it is never read as certainty. The caller asks once more and then ignores the
check (``actors.loop.monitor`` says so in a ``Notice``). The interval is rounded half up,
as upstream's ``Math.round``, not to even (as Python's ``round``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import msgspec
import re2

from actors.loop.config import LlmCheckConfig

__all__ = [
    "SYSTEM_PREFIX",
    "SYSTEM_PROMPT",
    "LlmCheck",
    "Verdict",
    "check_messages",
    "parse_answer",
]

SYSTEM_PREFIX: Final = "You decide whether an AI agent is stuck in an unproductive loop."
"""How every check's system message starts (a simulator recognises a check by it)."""

SYSTEM_PROMPT: Final = (
    f"{SYSTEM_PREFIX} You are given the agent's task and its most recent history: its "
    "messages, the tools it called and what they returned.\n\n"
    "It is stuck when BOTH hold: (1) it repeats a pattern over at least five actions (the "
    "same calls, the same small set of calls in a cycle, or the same text), and (2) those "
    "actions make no net progress: the results tell it nothing new and change nothing.\n\n"
    "These are NOT loops: the same operation applied to many different files or items; "
    "incremental edits of one file, each different; reading a file or a listing piece by "
    "piece; retrying with a changed command or approach; polling a status that changes; "
    "re-running a build or a test to check a fix.\n\n"
    "Answer with one JSON object and nothing else: "
    '{"unproductive_state_analysis": "<your reasoning, short>", '
    '"unproductive_state_confidence": <a number from 0.0 to 1.0: how sure you are that the '
    "agent is stuck>}"
)

_ENTRY_CHARS: Final = 600
"""Characters of one history entry put into the prompt (the rest is cut)."""
_FENCE: Final = re2.compile(r"(?s)```(?:json)?\s*(\{.*?\})\s*```")  # RE2: model text


class Verdict(msgspec.Struct):
    """The checker's answer: its confidence that the run is stuck, and why (the JSON
    object's keys are gemini-cli's)."""

    confidence: float = msgspec.field(name="unproductive_state_confidence")
    analysis: str = msgspec.field(default="", name="unproductive_state_analysis")


_decode = msgspec.json.Decoder(Verdict).decode


def parse_answer(text: str) -> Verdict | None:
    """The checker's verdict in ``text``, or ``None`` when it is not one: no JSON object
    with a numeric confidence, or a confidence outside [0, 1] (a malformed answer, never
    read as certainty)."""
    candidates = [text.strip()]
    fenced = _FENCE.search(text)
    if fenced is not None:
        candidates.insert(0, fenced.group(1))
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            answer = _decode(candidate)
        except msgspec.DecodeError:
            continue
        if 0.0 <= answer.confidence <= 1.0:  # NaN and out-of-range values are not verdicts
            return answer
    return None


def _cut(text: str) -> str:
    return text if len(text) <= _ENTRY_CHARS else text[:_ENTRY_CHARS] + " […]"


def check_messages(task: str, history: Sequence[str]) -> list[tuple[str, str]]:
    """The check's messages as ``(role, content)``: the system prompt, then one user
    message with the task and the history entries (oldest first, each cut)."""
    lines = "\n".join(f"{n}. {_cut(entry)}" for n, entry in enumerate(history, 1))
    user = (
        f"The agent's task:\n{_cut(task)}\n\nIts most recent history (oldest first):\n"
        f"{lines or '(none)'}\n\nIs the agent stuck in an unproductive loop?"
    )
    return [("system", SYSTEM_PROMPT), ("user", user)]


class LlmCheck:
    """One run's check schedule: the next turn to check at and the current interval."""

    __slots__ = ("_config", "asked", "in_flight", "interval", "next_turn", "offences")

    def __init__(self, config: LlmCheckConfig) -> None:
        self._config = config
        self.next_turn = config.first_turn
        self.interval = config.interval
        self.asked = 0
        self.in_flight = False
        self.offences = 0

    def due(self, turn: int) -> bool:
        """Whether a check is to be asked now, at ``turn`` (one at a time)."""
        if self.in_flight or turn < self.next_turn:
            return False
        self.in_flight = True
        self.asked = turn
        return True

    def answered(self, verdict: Verdict | None) -> bool:
        """Record the answer to the check in flight (``None``: an error or an answer that
        is not a verdict); True when it says the run loops. The next check comes
        ``interval`` turns after the turn this one was asked at."""
        self.in_flight = False
        cfg = self._config
        looping = verdict is not None and verdict.confidence >= cfg.confidence
        if looping:
            self.offences += 1
        elif verdict is not None:  # errors keep the interval (as gemini-cli)
            span = cfg.max_interval - cfg.min_interval
            # rounded half up (gemini-cli's ``Math.round``; Python's ``round`` rounds to even)
            self.interval = math.floor(cfg.min_interval + span * (1.0 - verdict.confidence) + 0.5)
        self.next_turn = self.asked + self.interval
        return looping
