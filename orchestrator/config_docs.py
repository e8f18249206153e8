"""The tables of ``docs/security.md`` ("Bounded configuration"), generated from the config
types: ``python -m orchestrator.config_docs`` prints them (a test compares)."""

from __future__ import annotations

import msgspec

from actors.loop import LoopConfig
from orchestrator.config import Config, RunSettings
from orchestrator.config_ranges import range_table

__all__ = ["config_roots", "doc_tables"]


def config_roots() -> tuple[tuple[str, type[msgspec.Struct]], ...]:
    """``(prefix, type)`` of everything numeric a config or a run's config can set: the
    config file, a run's keys (``config`` of a request, ``[config]`` of a scenario), and its
    ``loop`` table."""
    return (("", Config), ("config", RunSettings), ("config.loop", LoopConfig))


def doc_tables() -> list[str]:
    """The tables of ``docs/security.md`` ("Bounded configuration"), one per root."""
    return [range_table(kind, prefix) for prefix, kind in config_roots()]


if __name__ == "__main__":
    print("\n\n".join(doc_tables()))
