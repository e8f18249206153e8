"""The loop detectors, listed here only (``tests/test_loop_registry.py`` counts).

A detector is its module, its config section (a ``Section`` field of ``LoopConfig`` named
after it), one line here, and its cause ``loop.<name>`` (``bus.exit``); see
``docs/architecture.md``, "Adding a loop detector". :data:`REGISTRY` is in the order a
call is judged; ``build`` is ``None`` for a detector that does not judge tool calls
(``content``, ``llm_check``: :class:`~actors.loop.LoopDetector` calls them itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, NamedTuple

from actors.loop.config import LoopConfig
from actors.loop.cycle import Cycle
from actors.loop.error_streak import ErrorStreak
from actors.loop.generic import GenericRepeat
from actors.loop.global_breaker import GlobalBreaker
from actors.loop.history import ToolDetector
from actors.loop.no_new_information import NoNewInformation
from actors.loop.ping_pong import PingPong
from actors.loop.poll import PollNoProgress
from actors.loop.qwen import CallCap, ReadLoop, ShellStagnation, ToolStagnation
from actors.loop.unknown_tool import UnknownTool

__all__ = ["DETECTORS", "REGISTRY", "Registered", "tool_detectors"]


class Registered(NamedTuple):
    """One detector: ``name`` (its config section and its cause ``loop.<name>``), how to
    build it, and the other names its findings may carry (``findings``)."""

    name: str
    build: Callable[[LoopConfig], ToolDetector] | None
    findings: tuple[str, ...] = ()


def _ping_pong(config: LoopConfig) -> PingPong:
    # a refusal not recorded still counts (the end of refusals can end it)
    refused = not config.record_blocked and config.refusal_limit is not None
    return PingPong(config.ping_pong, continue_refused=refused)


REGISTRY: Final = (
    Registered("unknown_tool", lambda c: UnknownTool(c.unknown_tool)),
    Registered("error_streak", lambda c: ErrorStreak(c.error_streak)),
    Registered("global_breaker", lambda c: GlobalBreaker(c.global_breaker)),
    Registered("poll_no_progress", lambda c: PollNoProgress(c.poll_no_progress)),
    Registered("ping_pong", _ping_pong),
    Registered("generic_repeat", lambda c: GenericRepeat(c.generic_repeat), ("progress_ceiling",)),
    Registered("cycle", lambda c: Cycle(c.cycle)),
    Registered("no_new_information", lambda c: NoNewInformation(c.no_new_information)),
    # qwen-code's order: its always-on guards, then its heuristics
    Registered("shell_stagnation", lambda c: ShellStagnation(c.shell_stagnation)),
    Registered("call_cap", lambda c: CallCap(c.call_cap)),
    Registered("read_loop", lambda c: ReadLoop(c.read_loop)),
    Registered("tool_stagnation", lambda c: ToolStagnation(c.tool_stagnation)),
    Registered("content", None),
    Registered("llm_check", None),
)

DETECTORS: Final = tuple(name for entry in REGISTRY for name in (entry.name, *entry.findings))
"""Every name a finding (:attr:`Decision.detector`) may carry."""


def tool_detectors(config: LoopConfig) -> tuple[ToolDetector, ...]:
    """The enabled tool-call detectors of ``config``, in the order they judge a call."""
    return tuple(
        entry.build(config)
        for entry in REGISTRY
        if entry.build is not None and getattr(config, entry.name).enabled
    )
