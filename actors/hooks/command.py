"""Running a command hook: a process (no shell) fed its input on stdin, under a timeout.

The process gets its own session, so a hook that times out or whose run is cancelled is
killed together with anything it started. Each of stdout and stderr is read concurrently
(a chatty hook never blocks on a full pipe) and kept up to ``max_output`` bytes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

from actors.hooks.config import PYTHON_PLACEHOLDER

__all__ = ["MAX_OUTPUT_BYTES", "CommandResult", "run_command"]

MAX_OUTPUT_BYTES: Final = 16 * 1024
"""Output kept per stream (stdout, stderr); the rest is read and dropped."""

REAP_SECONDS: Final = 5.0
"""How long to wait for a killed process to be reaped."""


class CommandResult(NamedTuple):
    """How a command ended: its exit status, or why it has none (``failure``)."""

    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    failure: str | None = None


class _Capture:
    """One output stream, kept up to a cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0

    async def drain(self, stream: ByteReceiveStream | None) -> None:
        if stream is None:
            return
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            async for chunk in stream:
                room = self.cap - self.kept
                if room > 0:
                    self.chunks.append(chunk[:room])
                    self.kept += min(room, len(chunk))
                self.dropped += max(len(chunk) - max(room, 0), 0)

    def text(self) -> str:
        text = b"".join(self.chunks).decode("utf-8", errors="replace")
        return f"{text}… [{self.dropped} more bytes]" if self.dropped else text


async def _feed(stream: ByteSendStream | None, data: bytes) -> None:
    if stream is None:
        return
    # The hook may exit without reading its input: its exit status still counts.
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.send(data)
        await stream.aclose()


async def run_command(
    command: Sequence[str],
    stdin: bytes,
    *,
    time_limit: float,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    max_output: int = MAX_OUTPUT_BYTES,
) -> CommandResult:
    """Run ``command`` with ``stdin``; never raises for the command's own faults.

    A process still running after ``time_limit`` seconds (or when the caller is cancelled)
    is killed with its process group. ``{python}`` as an argument is the interpreter.
    ``env`` replaces the environment (default: this process's).
    """
    argv = [sys.executable if arg == PYTHON_PLACEHOLDER else arg for arg in command]
    try:
        process = await anyio.open_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its own process group, killed as one
        )
    except OSError as exc:
        return CommandResult(None, failure=f"cannot start {argv[0]!r}: {exc}")
    out, err = _Capture(max_output), _Capture(max_output)
    returncode: int | None = None  # None until it exited
    try:
        with anyio.move_on_after(time_limit):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_feed, process.stdin, stdin)
                tg.start_soon(out.drain, process.stdout)
                tg.start_soon(err.drain, process.stderr)
            returncode = await process.wait()
        failure = None if returncode is not None else f"timed out after {time_limit:g} s"
        return CommandResult(returncode, out.text(), err.text(), failure)
    finally:
        if returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        with anyio.CancelScope(shield=True), anyio.move_on_after(REAP_SECONDS):
            await process.aclose()
