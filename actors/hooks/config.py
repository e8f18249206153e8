"""What a hook is: its configuration, what it is given, and what it may answer.

A hook is a command (an argv list run as a process) or a Python function registered on the
runtime by name. ``pre_tool`` hooks judge each proposed tool call (optionally only calls of
some ``tools``); ``stop`` hooks judge the model's final answer. A hook answers ``allow``,
``block`` (the call is refused and the model reads the hook's message as the tool error; a
stop hook vetoes the final answer once and the model reads the message as a nudge) or
``deny`` (the run stops: ``hook_stopped``, cause ``hook.<name>``). A hook that fails (times
out, crashes, cannot start, answers nonsense) is treated as its ``on_error`` says.

Command hooks read a :class:`HookInput` as one JSON line on stdin and answer with their exit
status: :data:`EXIT_ALLOW`, :data:`EXIT_BLOCK` or :data:`EXIT_DENY`; their stderr (else
stdout) is the message. Any other status is a failure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container
from typing import Annotated, Any, Final, Literal, get_args

import msgspec

__all__ = [
    "ACTIONS",
    "EXIT_ALLOW",
    "EXIT_BLOCK",
    "EXIT_DENY",
    "PYTHON_PLACEHOLDER",
    "TIMEOUT_MAX",
    "Action",
    "CommandHook",
    "Hook",
    "HookDecision",
    "HookEvent",
    "HookFunction",
    "HookInput",
    "OnError",
    "PythonHook",
    "check_hooks",
]

EXIT_ALLOW: Final = 0
"""A command hook's exit status that allows the call (accepts the final answer)."""
EXIT_BLOCK: Final = 2
"""Blocks the call (the model reads the hook's message) or vetoes the final answer."""
EXIT_DENY: Final = 3
"""Stops the run: ``hook_stopped`` with cause ``hook.<name>``."""

PYTHON_PLACEHOLDER: Final = "{python}"
"""An argv element that is exactly this runs the interpreter loopfuse runs on."""

HookEvent = Literal["pre_tool", "stop"]
Action = Literal["allow", "block", "deny"]
OnError = Action
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)

HookName = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="1–64 of `A-Z a-z 0-9 _ -`")
]
TIMEOUT_MAX: Final = 86_400.0
"""The longest ``timeout_seconds`` a hook may have: a day."""
Seconds = Annotated[float, msgspec.Meta(gt=0, le=TIMEOUT_MAX)]


class _HookBase(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: HookName
    """Names the hook in causes (``hook.<name>``), messages and logs; unique in a run."""
    event: HookEvent = "pre_tool"
    """When the hook runs: on each proposed tool call, or on the final answer."""
    tools: tuple[str, ...] = ()
    """``pre_tool`` only: the tool names this hook judges (empty: every tool)."""
    timeout_seconds: Seconds = 10.0
    """A hook still running then is a failure (a command is killed)."""
    on_error: OnError = "block"
    """What a failing hook answers: ``allow`` (fail open), or ``block`` or ``deny`` (closed)."""

    def applies_to(self, event: HookEvent, tool: str | None = None) -> bool:
        """Whether this hook judges ``event`` (for ``tool``, when it is a tool call)."""
        return event == self.event and (not self.tools or tool in self.tools)


class CommandHook(_HookBase, frozen=True, kw_only=True, tag_field="kind", tag="command"):
    """Runs ``command`` (an argv list, no shell) with the :class:`HookInput` on stdin."""

    command: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]
    """argv, run without a shell; an element that is exactly ``{python}`` is the
    interpreter loopfuse runs on."""


class PythonHook(_HookBase, frozen=True, kw_only=True, tag_field="kind", tag="python"):
    """Calls the :data:`HookFunction` registered on the runtime as ``function``."""

    function: Annotated[str, msgspec.Meta(min_length=1)]
    """The name the function was registered under on the runtime."""


Hook = CommandHook | PythonHook


class HookInput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a hook judges. ``pre_tool``: the proposed call; ``stop``: the final answer."""

    hook: str
    event: HookEvent
    run_id: str
    turn: int
    tool: str | None = None
    call_id: str | None = None
    arguments: Any = None
    """The call's arguments as decoded JSON (the raw text when they are not JSON)."""
    text: str | None = None
    """``stop``: the model's final answer."""


class HookDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A Python hook's answer (returning ``None`` allows)."""

    action: Action = "allow"
    message: str = ""


HookFunction = Callable[[HookInput], HookDecision | Awaitable[HookDecision | None] | None]
"""A Python hook: async functions are awaited; plain ones run in a worker thread."""


def check_hooks(hooks: tuple[Hook, ...], functions: Container[str] = ()) -> list[tuple[str, str]]:
    """Problems of one run's hooks as ``(key, reason)``; ``key`` is relative to the list
    (``"1.name"``). ``functions`` are the registered Python hook names."""
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for index, hook in enumerate(hooks):
        if hook.name in seen:
            problems.append((f"{index}.name", f"duplicate hook name {hook.name!r}"))
        seen.add(hook.name)
        if hook.event == "stop" and hook.tools:
            problems.append((f"{index}.tools", "only pre_tool hooks filter by tool"))
        if isinstance(hook, PythonHook) and hook.function not in functions:
            problems.append(
                (f"{index}.function", f"no Python hook function registered as {hook.function!r}")
            )
        if isinstance(hook, CommandHook) and not hook.command[0]:
            problems.append((f"{index}.command", "the program (first element) is empty"))
    return problems
