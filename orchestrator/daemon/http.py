"""HTTP plumbing shared by the daemon's and a fleet member's API: JSON responses and
errors, the bounded body read, the run-request decoder, query parameters, the listing query,
and the handlers that turn Starlette's own refusals (404, 405) and anything unexpected into
the same JSON error body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

import msgspec
import re2
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ExceptionHandler, Receive

from bus import ENCODER, ExitReason
from orchestrator.config import DaemonSettings
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.limits import check_depth, check_text_lengths, parse_integer
from orchestrator.daemon.schemas import REQUEST_DECODER, ErrorBody, ErrorDetail, Health, RunRequest

__all__ = [
    "EXCEPTION_HANDLERS",
    "PAGE_LIMIT",
    "STATUSES",
    "RunApi",
    "after_query",
    "decode_request",
    "error_response",
    "json_response",
    "list_query",
    "read_body",
    "receive_body",
    "run_routes",
]

# RE2 (linear time): a validation message quotes the client's own field names
_AT_PATH: Final = re2.compile(r"(?s)^(?P<reason>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")
_UNKNOWN: Final = re2.compile(r"Object contains unknown field `(?P<field>[^`]+)`")
_MISSING: Final = re2.compile(r"Object missing required field `(?P<field>[^`]+)`")
_HTTP_CODES: Final = {404: "not_found", 405: "method_not_allowed"}
PAGE_LIMIT: Final = 500
STATUSES: Final = frozenset({"queued", "running", "ended"})


def json_response(
    body: msgspec.Struct | dict[str, Any], status: int = 200, **headers: str
) -> Response:
    """``body`` as a JSON response."""
    return Response(
        ENCODER.encode(body), status_code=status, media_type="application/json", headers=headers
    )


def error_response(exc: ApiError) -> Response:
    """``exc`` as the JSON error body every refusal uses."""
    detail = ErrorDetail(code=exc.code, message=exc.message, key=exc.key)
    return json_response(ErrorBody(error=detail), exc.status, **exc.headers)


async def _route_refusal(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path, method not allowed) as the JSON error body."""
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # Starlette names the methods of the first route only
        allowed = {
            method
            for route in request.app.router.routes
            if isinstance(route, Route) and route.matches(request.scope)[0] is not Match.NONE
            for method in route.methods or ()
        }
        headers["Allow"] = ", ".join(sorted(allowed))
    return error_response(ApiError(exc.status_code, code, message, headers=headers))


async def _unexpected(request: Request, exc: Exception) -> Response:
    """Anything unexpected: a JSON 500 (the server logs the traceback)."""
    return error_response(
        ApiError(500, "internal", "internal error; the daemon's log has the details")
    )


EXCEPTION_HANDLERS: Final[Mapping[Any, ExceptionHandler]] = {
    HTTPException: _route_refusal,
    Exception: _unexpected,
}
"""``Starlette(exception_handlers=...)``: every response the app makes is JSON on error."""


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        "body_too_large",
        f"the request body is larger than {limit} bytes (daemon.max_body_bytes)",
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with a 413 past ``limit`` bytes (declared or read)."""
    body = await receive_body(request.receive, request.headers.get("content-length", ""), limit)
    if body is None:
        raise ClientDisconnect
    return body


async def receive_body(receive: Receive, declared: str, limit: int) -> bytes | None:
    """:func:`read_body` on bare ASGI: the body from ``receive`` (``declared``: the
    Content-Length header, or ``""``); ``None`` if the client went away first."""
    digits = declared.lstrip("0")  # h11 refuses a value that is not digits
    if declared.isascii() and declared.isdigit() and (len(digits) > 19 or int(digits or 0) > limit):
        raise _too_large(limit)
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            raise _too_large(limit)
        if not message.get("more_body", False):
            return bytes(body)


def decode_request(body: bytes, settings: DaemonSettings) -> RunRequest:
    """A ``POST /v1/runs`` body: 400 when not JSON or nested too deep, 422 naming the bad
    field or a free-text field longer than ``settings`` allows."""
    check_depth(body)
    try:
        request = REQUEST_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        match = _AT_PATH.match(str(exc))
        assert match is not None
        reason, path = match.group("reason"), (match["path"] or "").lstrip(".")
        for pattern, what in ((_UNKNOWN, "unknown"), (_MISSING, "missing")):
            if found := pattern.match(reason):
                key = ".".join(p for p in (path, found["field"]) if p)
                raise ApiError(422, f"{what}_field", f"{what} field `{key}`", key=key) from None
        raise ApiError(
            422, "invalid_field", f"`{path or '(body)'}`: {reason}", key=path or None
        ) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    check_text_lengths(request, settings)
    return request


def after_query(request: Request) -> int:
    """Where an event stream resumes: after the event the ``Last-Event-ID`` header names,
    else the ``after`` query parameter (0, the start, when neither is there).

    :raises ApiError: 400 naming the header or the parameter.
    """
    header = request.headers.get("last-event-id")
    if header is not None:
        return parse_integer(header, "Last-Event-ID")
    return parse_integer(request.query_params.get("after", "0"), "after")


def list_query(request: Request) -> tuple[str | None, str | None, int, int | None]:
    """``GET /v1/runs``'s query parameters, checked: ``(status, exit_reason, limit,
    before)``, ``before`` the cursor, if any.

    :raises ApiError: 400 naming the bad parameter.
    """
    query = request.query_params
    status = query.get("status")
    if status is not None and status not in STATUSES:
        raise ApiError(400, "bad_query", f"status must be one of {sorted(STATUSES)}", key="status")
    exit_reason = query.get("exit_reason")
    if exit_reason is not None and exit_reason not in {r.value for r in ExitReason}:
        raise ApiError(400, "bad_query", "exit_reason is not an exit reason", key="exit_reason")
    limit = parse_integer(query.get("limit", "50"), "limit", low=1, high=PAGE_LIMIT)
    cursor = query.get("cursor")
    before = parse_integer(cursor, "cursor", low=1) if cursor is not None else None
    return status, exit_reason, limit, before


class RunApi(Protocol):
    """The handlers a daemon and a fleet member both serve (``docs/daemon.md``)."""

    async def submit(self, request: Request) -> Response: ...
    async def list_runs(self, request: Request) -> Response: ...
    async def get_run(self, request: Request) -> Response: ...
    async def events(self, request: Request) -> Response: ...
    async def abort(self, request: Request) -> Response: ...
    async def scenarios(self, request: Request) -> Response: ...
    async def metrics(self, request: Request) -> Response: ...
    async def readyz(self, request: Request) -> Response: ...


async def _healthz(request: Request) -> Response:
    """Liveness: the process answers (a daemon and a fleet member alike)."""
    return json_response(Health(status="ok"))


def run_routes(api: RunApi, *extra: Route) -> list[Route]:
    """The API's routes on ``api``'s handlers, with ``extra`` routes after the run ones."""
    return [
        Route("/v1/runs", api.submit, methods=["POST"]),
        Route("/v1/runs", api.list_runs, methods=["GET"]),
        Route("/v1/runs/{id}", api.get_run, methods=["GET"]),
        Route("/v1/runs/{id}/events", api.events, methods=["GET"]),
        Route("/v1/runs/{id}/abort", api.abort, methods=["POST"]),
        Route("/v1/scenarios", api.scenarios, methods=["GET"]),
        *extra,
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/readyz", api.readyz, methods=["GET"]),
    ]
