"""``RunStarted`` for tests that drive actors without a conductor.

The message's run settings have no defaults (the conductor fills each from the run's
settings, ``orchestrator/settings.py``). :func:`run_started` fills those a test leaves out
with a run of no budgets and no result cache, the declaration's cache hit limit, TTL and
budget mode, and the executor's own tool timeout.
"""

from __future__ import annotations

from typing import Any, Final

from bus import RunStarted
from orchestrator.config import Config, run_settings

__all__ = ["NO_BUDGETS", "UNSET", "run_started"]

NO_BUDGETS: Final[dict[str, Any]] = {
    "output_token_budget": 0,
    "input_token_budget": 0,
    "cost_budget": 0.0,
    "input_price_per_million": 0.0,
    "output_price_per_million": 0.0,
}
"""No token or cost budget (0: none), no prices."""

_DECLARED: Final = run_settings(Config())

UNSET: Final[dict[str, Any]] = {
    "trace_id": "t",
    "task": "x",
    "model": "m",
    "tools": (),
    "max_turns": 0,
    "max_tool_calls": 0,
    "deadline_seconds": 0.0,
    "budget_mode": _DECLARED.budget_mode,
    "max_cache_hits": _DECLARED.max_cache_hits,
    "cache_ttl_seconds": _DECLARED.cache_ttl_seconds,
    "cache_max_entries": 0,
    "tool_timeout_seconds": 0.0,
    **NO_BUDGETS,
}
"""What :func:`run_started` fills in: no turn, call or time limit (0: none), no cache."""


def run_started(run_id: str = "r", **fields: Any) -> RunStarted:
    """A ``RunStarted`` of ``run_id`` with ``fields``, the rest from :data:`UNSET`."""
    return RunStarted(run_id=run_id, **{**UNSET, **fields})
