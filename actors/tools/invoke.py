"""One tool call, start to finish, as data: :func:`invoke` never raises an ``Exception``.

Arguments are decoded and validated, the tool runs under its deadline, and whatever
happens becomes an :class:`Outcome`: the text the model reads, whether it is an error and
of which kind. Cancellation from outside (an abort) is the one thing that passes through.
A plain-``def`` tool (:attr:`Tool.inline <actors.tools.registry.Tool.inline>`) runs with
:func:`invoke_now`, synchronously, to the same outcomes (it has no deadline).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Iterable
from typing import Any, NamedTuple, cast

import anyio
import anyio.lowlevel

from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.registry import Tool

__all__ = ["Outcome", "cap_text", "invoke", "invoke_now", "timed_out", "unknown_tool"]


class Outcome(NamedTuple):
    """What a call produced. ``executed`` is false when the tool's function never ran."""

    content: str
    is_error: bool = False
    error_kind: str | None = None
    executed: bool = True


def unknown_tool(name: str, available: Iterable[str]) -> Outcome:
    """The answer to a call of a tool that is not registered or not enabled."""
    names = ", ".join(sorted(available)) or "(none)"
    return Outcome(
        f"unknown tool {name!r}. Available tools: {names}.",
        is_error=True,
        error_kind="unknown_tool",
        executed=False,
    )


def timed_out(name: str, time_limit: float) -> Outcome:
    """The answer to a call that ran out of its time limit."""
    return Outcome(f"{name} timed out after {time_limit:g} s", is_error=True, error_kind="timeout")


async def invoke(tool: Tool[Any], arguments: str, ctx: ToolContext, *, max_chars: int) -> Outcome:
    """Run ``tool`` on ``arguments``; cut text at ``max_chars``.

    The caller enforces the time limit with a cancel scope it has (the tool executor's is
    its pool worker's, which carries the abort deadline too). A plain-``def`` tool runs as
    :func:`invoke_now` does, without a limit.
    """
    if tool.inline:
        return invoke_now(tool, arguments, ctx, max_chars=max_chars)
    try:
        params = tool.decode(arguments)
    except ToolError as exc:
        return Outcome(exc.message, is_error=True, error_kind=exc.kind, executed=False)
    try:
        # whatever the tool returned: _returned checks it is text
        content = await cast("Awaitable[object]", tool.fn(params, ctx))
    except ToolError as exc:
        return Outcome(cap_text(exc.message, max_chars), is_error=True, error_kind=exc.kind)
    except anyio.get_cancelled_exc_class() as exc:
        # A real cancellation is level-triggered: the checkpoint raises it again. Getting
        # past it means the tool raised a cancellation exception of its own.
        await anyio.lowlevel.checkpoint()
        return _raised_cancel(tool, exc)
    except Exception as exc:
        return _failed(tool, exc, max_chars)
    return _returned(tool, content, max_chars)


def invoke_now(tool: Tool[Any], arguments: str, ctx: ToolContext, *, max_chars: int) -> Outcome:
    """Run the plain-``def`` ``tool`` on ``arguments`` now: :func:`invoke`'s outcomes, no
    await, no deadline (nothing can cancel it while it runs)."""
    try:
        params = tool.decode(arguments)
    except ToolError as exc:
        return Outcome(exc.message, is_error=True, error_kind=exc.kind, executed=False)
    try:
        content: object = tool.fn(params, ctx)
    except ToolError as exc:
        return Outcome(cap_text(exc.message, max_chars), is_error=True, error_kind=exc.kind)
    except Exception as exc:
        return _failed(tool, exc, max_chars)
    except anyio.get_cancelled_exc_class() as exc:  # no await in it: never a real cancel
        return _raised_cancel(tool, exc)
    return _returned(tool, content, max_chars)


def _returned(tool: Tool[Any], content: object, max_chars: int) -> Outcome:
    if isinstance(content, str):
        return Outcome(cap_text(content, max_chars))
    if inspect.iscoroutine(content):  # a plain callable returning one: never awaited
        content.close()
    text = f"{tool.name} failed: it returned {type(content).__name__}, not text"
    return Outcome(text, is_error=True, error_kind="exception")


def _failed(tool: Tool[Any], exc: Exception, max_chars: int) -> Outcome:
    text = f"{tool.name} failed: {type(exc).__name__}: {exc}"
    return Outcome(cap_text(text, max_chars), is_error=True, error_kind="exception")


def _raised_cancel(tool: Tool[Any], exc: BaseException) -> Outcome:
    text = f"{tool.name} failed: it raised {type(exc).__name__} without being cancelled"
    return Outcome(text, is_error=True, error_kind="exception")


def cap_text(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a note saying how much was cut.

    Lone surrogates (bytes that were not UTF-8, decoded with ``surrogateescape``) become
    ``\\xNN`` escapes: the request that carries the text to the model must be valid UTF-8.
    """
    if not text.isascii():
        try:
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no byte decodes to: escape it as itself
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    return f"{text[:max_chars]}\n[result cut: {cut} of {len(text)} characters left out]"
