"""A stdio transport for MCP servers whose reads are bounded, and whose protocol errors end
the connection instead of wedging it (in place of the SDK's ``stdio_client``, which has no
size limit and no hook into its reader: ``docs/mcp.md``, "Protocol errors"). The SDK stays
for everything above it (``ClientSession``, the messages' types and their validation).

* the server is spawned as the SDK spawns it (its default environment plus the server's
  own, stderr to ``errlog``, a session of its own so it can be killed with its children);
* each line is read bounded by ``max_message_bytes``, then decoded as strict UTF-8 and
  validated as a JSON-RPC message;
* the first line that breaks one of these rules is a protocol error: ``on_protocol_error``
  is told why (before anything else sees the end), and the session's stream is closed, so
  the session fails every call in flight at once and the connection counts as lost;
* leaving the block closes the server's input, gives it :data:`EXIT_GRACE_SECONDS` to exit,
  then kills its process group.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import IO, Final

import anyio
import mcp_types
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

__all__ = ["EXIT_GRACE_SECONDS", "open_stdio_transport"]

EXIT_GRACE_SECONDS: Final = 2.0
"""After its input is closed, a server has this long to exit before it is killed."""
_SHOWN: Final = 80
"""Characters of a bad line quoted in the protocol error."""

_Streams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


@asynccontextmanager
async def open_stdio_transport(
    params: StdioServerParameters,
    errlog: IO[str],
    *,
    max_message_bytes: int,
    on_protocol_error: Callable[[str], None],
) -> AsyncIterator[_Streams]:
    """Run the server of ``params`` and yield the session's streams (see the module
    docstring).

    :raises OSError: the server could not be started.
    """
    process = await anyio.open_process(
        [params.command, *params.args],
        env=get_default_environment() | (params.env or {}),
        stderr=errlog,
        cwd=params.cwd,
        start_new_session=True,
    )
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    broke = False

    def protocol_error(problem: str) -> None:
        nonlocal broke
        broke = True
        on_protocol_error(problem)

    async def read() -> None:
        assert process.stdout is not None
        lines = BufferedByteReceiveStream(process.stdout)
        async with to_session:
            for number in itertools.count(1):
                try:
                    line = await lines.receive_until(b"\n", max_message_bytes)
                except anyio.DelimiterNotFound:
                    protocol_error(
                        f"line {number} of its output is longer than max_message_bytes "
                        f"({max_message_bytes} bytes); it was not read on"
                    )
                    return
                except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError):
                    return  # it closed its output (or we did): the connection ended
                except anyio.BrokenResourceError:
                    return
                line = line.removesuffix(b"\r")
                if not line.strip():
                    continue
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    protocol_error(
                        f"line {number} of its output is not valid UTF-8 (byte "
                        f"{line[exc.start]:#04x} at offset {exc.start}): {_shown(line)}"
                    )
                    return
                try:
                    message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError:
                    protocol_error(
                        f"line {number} of its output is not a JSON-RPC message: {_shown(line)}"
                    )
                    return
                try:
                    await to_session.send(SessionMessage(message))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # the session is gone

    async def write() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for outgoing in from_session:
                    text = outgoing.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(text.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # it stopped reading: the session sees the end

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(write)
        try:
            yield from_server, to_server
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, at_once=broke)
                for stream in (from_server, to_server, to_session, from_session):
                    await stream.aclose()
            tg.cancel_scope.cancel()


def _shown(line: bytes) -> str:
    text = line[: _SHOWN * 4].decode("utf-8", "replace")
    return repr(text[:_SHOWN]) + (" …" if len(text) > _SHOWN or len(line) > _SHOWN * 4 else "")


async def _stop(process: Process, *, at_once: bool) -> None:
    """Close its input and give it :data:`EXIT_GRACE_SECONDS` to exit (none when it broke
    the protocol: what it writes is not read any more), then kill its process group.

    Its output is not drained: a server writing a huge line stays blocked until it is
    killed, rather than writing it all out.
    """
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await pipe.aclose()
    if not at_once:
        with anyio.move_on_after(EXIT_GRACE_SECONDS):
            await process.wait()
    if process.returncode is None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with anyio.move_on_after(EXIT_GRACE_SECONDS):
            await process.wait()
    # Close asyncio's transport of the process (its pipes). Closing anyio's stdout stream
    # only marks it ended: a pipe whose reading was paused on a full buffer (a line cut at
    # ``max_message_bytes``) would stay open. The SDK's ``stdio_client`` does the same, by
    # the same attribute walk: nothing public exposes the transport.
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with suppress(PermissionError):  # re-killing a setuid child (Python <= 3.12)
            close()
