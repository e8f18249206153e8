"""Hooks: commands and Python functions that judge tool calls and final answers.

A run's hooks come from its config (:class:`CommandHook`, :class:`PythonHook`); the
:class:`HookRunner` actor runs them on the bus. See ``docs/hooks.md``.
"""

from __future__ import annotations

from actors.hooks.command import MAX_OUTPUT_BYTES, CommandResult, run_command
from actors.hooks.config import (
    ACTIONS,
    EXIT_ALLOW,
    EXIT_BLOCK,
    EXIT_DENY,
    PYTHON_PLACEHOLDER,
    Action,
    CommandHook,
    Hook,
    HookDecision,
    HookEvent,
    HookFunction,
    HookInput,
    OnError,
    PythonHook,
    check_hooks,
)
from actors.hooks.outcome import HookOutcome, command_outcome, function_outcome
from actors.hooks.python import FunctionResult, call_function
from actors.hooks.runner import HookRunner

__all__ = [
    "ACTIONS",
    "EXIT_ALLOW",
    "EXIT_BLOCK",
    "EXIT_DENY",
    "MAX_OUTPUT_BYTES",
    "PYTHON_PLACEHOLDER",
    "Action",
    "CommandHook",
    "CommandResult",
    "FunctionResult",
    "Hook",
    "HookDecision",
    "HookEvent",
    "HookFunction",
    "HookInput",
    "HookOutcome",
    "HookRunner",
    "OnError",
    "PythonHook",
    "call_function",
    "check_hooks",
    "command_outcome",
    "function_outcome",
    "run_command",
]
