"""loopfuse's exceptions.

Tool failures, model failures and stops are data (results and exit reasons), never
exceptions. What is left is a short tree::

    LoopfuseError
    ├── ConfigError (also ValueError)    a config key or value is wrong: .key, .reason
    ├── ScenarioError (also ValueError)  a scenario is wrong: .source, .path (key path), .reason
    └── RuntimeClosedError               the runtime is not running (not entered, or closed)
"""

from __future__ import annotations

__all__ = ["ConfigError", "LoopfuseError", "RuntimeClosedError", "ScenarioError"]


class LoopfuseError(Exception):
    """Root of loopfuse's exceptions."""


class ConfigError(LoopfuseError, ValueError):
    """A configuration key has a bad value; the message names the key and the reason."""

    def __init__(self, key: str, reason: str, *, source: str | None = None) -> None:
        self.key = key
        self.reason = reason
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}config key {key!r}: {reason}")


class ScenarioError(LoopfuseError, ValueError):
    """A scenario that cannot be used: the ``source`` file, the key ``path`` and the ``reason``."""

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = path
        self.reason = reason
        super().__init__(f"{source}: {path}: {reason}" if path else f"{source}: {reason}")


class RuntimeClosedError(LoopfuseError, RuntimeError):
    """The runtime was used outside its ``async with`` block."""
