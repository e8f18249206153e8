"""Connection limits in front of the app: what a client may hold before any request is read.

uvicorn's httptools protocol bounds none of these (``docs/security.md``, "Connections"):
:func:`limited_protocol` returns its subclass held to the ``[daemon]`` limits. A request
head (request line plus headers) longer than ``max_header_bytes``, or with more than
``max_headers`` header lines, is answered ``431`` (the bytes past the limit never reach the
parser); a head not complete within ``header_timeout_seconds`` of the connection opening (or
of its first byte, for a later request on a kept-alive connection) ``408``; a body not
complete within ``body_timeout_seconds`` of its head closes the connection, whether the app
reads it or not. Past ``max_connections`` open connections in all, or
``max_connections_per_client`` from one client address, a new one is answered ``503``. Each
refusal is the API's JSON error body with ``Connection: close``, and the connection closes.
Idle kept-alive connections are closed by uvicorn's own ``timeout_keep_alive``.
"""

from __future__ import annotations

from collections import Counter
from http import HTTPStatus
from typing import Any, ClassVar

import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from bus import aio_seam
from orchestrator.config import DaemonSettings
from orchestrator.daemon.schemas import ErrorBody, ErrorDetail

__all__ = ["limited_protocol"]


class _LimitedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the ``[daemon]`` connection limits (see the module)."""

    limits: ClassVar[DaemonSettings]
    per_client: ClassVar[Counter[str]]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: aio_seam.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._reading_head = True
        self._head_room = self.limits.max_header_bytes
        self._header_lines = 0
        self._refused: tuple[int, str, str, str] | None = None
        self._head_timer: aio_seam.TimerHandle | None = None
        self._body_timer: aio_seam.TimerHandle | None = None
        self._address: str | None = None

    # -- connections ---------------------------------------------------------------------

    def connection_made(self, transport: aio_seam.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else ""
        limits = self.limits
        if len(self.connections) > limits.max_connections:
            self._close_with(
                503,
                "too_many_connections",
                f"the daemon holds {limits.max_connections} connections already",
                "daemon.max_connections",
            )
            return
        if self.per_client[address] >= limits.max_connections_per_client:
            self._close_with(
                503,
                "too_many_connections",
                f"this client holds {limits.max_connections_per_client} connections already",
                "daemon.max_connections_per_client",
            )
            return
        self._address = address
        self.per_client[address] += 1
        self._head_timer = self.loop.call_later(limits.header_timeout_seconds, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._address is not None:
            self.per_client[self._address] -= 1
            if self.per_client[self._address] <= 0:
                del self.per_client[self._address]
            self._address = None
        super().connection_lost(exc)

    # -- reading ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        while data:
            if not self._reading_head:
                super().data_received(data)
                return
            piece, data = data[: self._head_room], data[self._head_room :]
            self._head_room -= len(piece)
            super().data_received(piece)
            if self.transport.is_closing():
                return
            if self._reading_head and self._head_room <= 0:
                self._close_with(
                    431,
                    "header_too_large",
                    "the request line and headers are longer than "
                    f"{self.limits.max_header_bytes} bytes",
                    "daemon.max_header_bytes",
                )
                return

    def on_message_begin(self) -> None:
        """A request's first byte: its head's clock starts (the first request's started
        with the connection), also for one pipelined behind another."""
        self._header_lines = 0
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.limits.header_timeout_seconds, self._head_timed_out
            )
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_lines += 1
        if self._header_lines > self.limits.max_headers:
            self._refused = (
                431,
                "too_many_headers",
                f"the request has more than {self.limits.max_headers} header lines",
                "daemon.max_headers",
            )
            raise RuntimeError("too many header lines")  # httptools wraps it: parsing stops
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._body_timer = self.loop.call_later(
            self.limits.body_timeout_seconds, self._body_timed_out
        )
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading_head = True
        self._head_room = self.limits.max_header_bytes
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if self._refused is not None:  # a limit stopped the parser, not a malformed request
            self._close_with(*self._refused)
            return
        super().send_400_response(msg)

    # -- refusals --------------------------------------------------------------------------

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # a response is under way: no room for another
            return
        self._close_with(
            408,
            "header_timeout",
            f"the request's head did not arrive within {self.limits.header_timeout_seconds} s",
            "daemon.header_timeout_seconds",
        )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        self.transport.close()

    def _close_with(self, status: int, code: str, message: str, key: str) -> None:
        """Answer with the API's JSON error body and ``Connection: close``, and close."""
        self._cancel_timers()
        if not self.transport.is_closing():
            detail = ErrorDetail(code=code, message=message, key=key)
            body = msgspec.json.encode(ErrorBody(error=detail))
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s"
                % (status, HTTPStatus(status).phrase.encode(), len(body), body)
            )
            self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None


def limited_protocol(limits: DaemonSettings) -> type[aio_seam.Protocol]:
    """uvicorn's httptools protocol under the connection limits of ``limits`` (the
    ``[daemon]`` section), for ``uvicorn.Config(http=...)``: one class per server (the
    per-client connection counts are shared by its connections)."""
    return type(
        "LimitedHttpToolsProtocol",
        (_LimitedHttpTools,),
        {"limits": limits, "per_client": Counter[str]()},
    )
