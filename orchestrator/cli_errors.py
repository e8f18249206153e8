"""The command line's one error path: a failure to start becomes one line and an exit status.

Every subcommand ends the same way when it cannot start (a config key, a missing extra, a
server that will not start, a port that cannot be bound, no daemon at the URL): one line
on stderr naming what to change, and the documented exit status (docs/cli.md), never a
traceback. :func:`explain` finds such a failure in what a command raised, looking inside
exception groups (a task group wraps what a runtime or a server raised).

A failure not named here is a bug: it is not explained, and its traceback is shown.
"""

from __future__ import annotations

from typing import Final, NamedTuple, TypeVar

import httpx

from orchestrator.errors import ConfigError, LoopfuseError
from orchestrator.result import ExitStatus

__all__ = ["DaemonUnreachable", "Failure", "explain", "one_line"]

_E = TypeVar("_E", bound=BaseException)

RUN_KEYS: Final = {
    "config.context_window": "context.windows / context.default_window",
    "config.context_safety_buffer": (
        "context.safety_buffer_tokens / model.max_output_tokens / "
        "context.output_reserve_tokens / context.windows"
    ),
    "config.context_output_reserve": "model.max_output_tokens / context.output_reserve_tokens",
    "config.context_collapse_at": "context.collapse_at",
    "config.context_keep_turns": "context.keep_recent_turns",
}
"""The config file's keys behind a run setting's name (``config.<setting>``, as the daemon's
API names a request's override). The command line sets no overrides, so its errors name
the keys of the file instead."""


class DaemonUnreachable(Exception):
    """No daemon answers at ``url`` (``loopfuse runs`` / ``watch``)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"no daemon at {url} ({reason}): start one with `loopfuse serve`, "
            "or pass --url URL (or set $LOOPFUSE_URL) to name the running one"
        )


class Failure(NamedTuple):
    """What to print (one line, without the ``loopfuse:`` prefix) and the exit status."""

    message: str
    status: int


def one_line(text: str) -> str:
    """``text`` on one line (a server's stderr or an SDK's message may span several)."""
    return " ".join(text.split())


def explain(error: BaseException) -> Failure | None:
    """The start-up failure ``error`` stands for, or ``None`` (a bug: show its traceback).
    A Ctrl-C anywhere in ``error`` is the interrupted status, whatever else failed."""
    if _find(error, KeyboardInterrupt) is not None:
        return Failure("", ExitStatus.INTERRUPTED)
    if (config := _find(error, LoopfuseError)) is not None:
        message = str(config)
        if isinstance(config, ConfigError) and config.key in RUN_KEYS:
            where = f"{config.source}: " if config.source else ""
            message = f"{where}config key {RUN_KEYS[config.key]}: {config.reason}"
        return Failure(one_line(message), ExitStatus.USAGE)
    if (unreachable := _find(error, DaemonUnreachable)) is not None:
        return Failure(one_line(str(unreachable)), ExitStatus.USAGE)
    if (transport := _find(error, httpx.TransportError)) is not None:
        try:
            where = str(transport.request.url)
        except RuntimeError:  # the error carries no request
            where = "the daemon"
        return Failure(
            one_line(f"the connection to {where} failed: {transport or type(transport).__name__}"),
            ExitStatus.FAILED,
        )
    return None


def _find(error: BaseException, kind: type[_E]) -> _E | None:
    """The first ``kind`` in ``error``, looking inside exception groups."""
    if isinstance(error, kind):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            if (found := _find(inner, kind)) is not None:
                return found
    return None
