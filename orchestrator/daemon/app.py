"""The ASGI app: routes, auth, JSON errors and the lifespan that runs the daemon.

::

    POST /v1/runs                 submit (202 {"id": …})       GET /v1/runs         list
    GET  /v1/runs/{id}            status and result            POST …/{id}/abort    abort
    GET  /v1/runs/{id}/events     SSE (Last-Event-ID, ?after=) GET /v1/scenarios    names
    GET  /v1/openapi.json         this API                     GET /metrics         Prometheus
    GET  /healthz                 alive                        GET /readyz          ready

Every refusal is JSON, ``{"error": {"code", "message", "key"?}}``, with the status that fits:
400 bad JSON or query, 401 no/wrong token, 404 unknown run, 409 conflict, 413 body too
large, 422 unknown field / wrong type / bad value, 429 full, 503 draining.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bus import ExitReason
from orchestrator.config import Config
from orchestrator.daemon import sse
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.lifespan import Daemon
from orchestrator.daemon.metrics import render
from orchestrator.daemon.openapi import openapi_document
from orchestrator.daemon.schemas import (
    REQUEST_DECODER,
    ErrorBody,
    ErrorDetail,
    Health,
    RunAccepted,
    RunPage,
    RunRequest,
    RunView,
)
from orchestrator.daemon.store import RunRow

__all__ = ["create_app"]

_ENCODER: Final = msgspec.json.Encoder()
_RESULT: Final = msgspec.json.Decoder(dict[str, Any])
_AT_PATH: Final = re.compile(r"^(?P<reason>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")
_MISSING: Final = re.compile(r"Object missing required field `(?P<field>[^`]+)`")
PAGE_LIMIT: Final = 500
STATUSES: Final = frozenset({"queued", "running", "ended"})


def _version() -> str:
    try:
        return version("loopfuse")
    except PackageNotFoundError:
        return "0"


def _json(body: msgspec.Struct | dict[str, Any], status: int = 200, **headers: str) -> Response:
    return Response(
        _ENCODER.encode(body), status_code=status, media_type="application/json", headers=headers
    )


def _error(exc: ApiError) -> Response:
    detail = ErrorDetail(code=exc.code, message=exc.message, key=exc.key)
    return _json(ErrorBody(error=detail), exc.status, **exc.headers)


class _Guard:
    """ASGI middleware: bearer tokens, and :class:`ApiError` as a JSON response."""

    def __init__(self, app: ASGIApp, daemon: Daemon) -> None:
        self._app = app
        self._daemon = daemon

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._daemon.auth.needs_token(scope["path"]):
            authorization = None
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
            if not self._daemon.auth.accepts(authorization):
                response = _error(
                    ApiError(
                        401,
                        "unauthorized",
                        "a valid bearer token is required (Authorization: Bearer <token>)",
                        headers={"WWW-Authenticate": "Bearer"},
                    )
                )
                await response(scope, receive, send)
                return
        try:
            await self._app(scope, receive, send)
        except ApiError as exc:  # raised before a response started
            await _error(exc)(scope, receive, send)


def create_app(config: Config, *, daemon: Daemon | None = None) -> Starlette:
    """The daemon's ASGI app; its lifespan runs ``daemon`` (made from ``config`` if none)."""
    daemon = daemon or Daemon(config)
    api = _Api(daemon)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with daemon.running():
            yield

    routes = [
        Route("/v1/runs", api.submit, methods=["POST"]),
        Route("/v1/runs", api.list_runs, methods=["GET"]),
        Route("/v1/runs/{id}", api.get_run, methods=["GET"]),
        Route("/v1/runs/{id}/events", api.events, methods=["GET"]),
        Route("/v1/runs/{id}/abort", api.abort, methods=["POST"]),
        Route("/v1/scenarios", api.scenarios, methods=["GET"]),
        Route("/v1/openapi.json", api.openapi, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/readyz", api.readyz, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_Guard, daemon=daemon)
    app.state.daemon = daemon
    return app


class _Api:
    """The route handlers."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    async def submit(self, request: Request) -> Response:
        body = await _read_body(request, self._daemon.config.daemon.max_body_bytes)
        run_request = _decode_request(body)
        row, created = await self._daemon.service.submit(run_request)
        accepted = RunAccepted(id=row.id, trace_id=row.trace_id, status="queued")
        if created:
            return _json(accepted, 202, Location=f"/v1/runs/{row.id}")
        current = await self._daemon.store.get_run(row.id)
        status = current.status if current is not None else row.status
        replayed = msgspec.structs.replace(accepted, status=status)
        return _json(replayed, 200, Location=f"/v1/runs/{row.id}")

    async def list_runs(self, request: Request) -> Response:
        query = request.query_params
        status = query.get("status")
        if status is not None and status not in STATUSES:
            raise ApiError(
                400, "bad_query", f"status must be one of {sorted(STATUSES)}", key="status"
            )
        exit_reason = query.get("exit_reason")
        if exit_reason is not None and exit_reason not in {r.value for r in ExitReason}:
            raise ApiError(400, "bad_query", "exit_reason is not an exit reason", key="exit_reason")
        limit = _int_query(query.get("limit"), "limit", default=50, low=1, high=PAGE_LIMIT)
        cursor = query.get("cursor")
        before = _int_query(cursor, "cursor", default=0, low=1) if cursor is not None else None
        rows = await self._daemon.store.list_runs(
            status=status, exit_reason=exit_reason, before=before, limit=limit + 1
        )
        more = len(rows) > limit
        rows = rows[:limit]
        page = RunPage(
            runs=[_view(row, with_result=False) for row in rows],
            next_cursor=str(rows[-1].cursor) if more and rows else None,
        )
        return _json(page)

    async def get_run(self, request: Request) -> Response:
        return _json(_view(await self._row(request)))

    async def abort(self, request: Request) -> Response:
        row = await self._daemon.service.abort(request.path_params["id"])
        return _json(RunAccepted(id=row.id, trace_id=row.trace_id, status="running"), 202)

    async def events(self, request: Request) -> Response:
        row = await self._row(request)
        header = request.headers.get("last-event-id")
        after = _int_query(
            header if header is not None else request.query_params.get("after"),
            "Last-Event-ID" if header is not None else "after",
            default=0,
            low=0,
        )
        stream = sse.event_stream(
            self._daemon.store,
            row.id,
            after=after,
            heartbeat=self._daemon.config.daemon.heartbeat_seconds,
            closing=self._daemon.closing,
        )
        return StreamingResponse(
            self._counted(stream), media_type="text/event-stream", headers=sse.HEADERS
        )

    async def _counted(self, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        self._daemon.streams += 1
        try:
            async for chunk in stream:
                yield chunk
        finally:
            self._daemon.streams -= 1

    async def scenarios(self, request: Request) -> Response:
        return _json({"scenarios": self._daemon.service.scenario_names()})

    async def openapi(self, request: Request) -> Response:
        return _json(openapi_document(_version()))

    async def metrics(self, request: Request) -> Response:
        registry = self._daemon.registry
        if registry is None:
            raise ApiError(503, "starting", "the daemon is starting")
        body, content_type = render(registry, request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})

    async def healthz(self, request: Request) -> Response:
        return _json(Health(status="ok"))

    async def readyz(self, request: Request) -> Response:
        daemon = self._daemon
        if daemon.ready:
            return _json(Health(status="ok"))
        if daemon.draining:
            return _json(Health(status="draining", reason="shutting down"), 503)
        return _json(Health(status="starting", reason="recovering runs"), 503)

    async def _row(self, request: Request) -> RunRow:
        run_id = request.path_params["id"]
        row = await self._daemon.store.get_run(run_id)
        if row is None:
            raise ApiError(404, "unknown_run", f"no run {run_id!r}", key="id")
        return row


def _view(row: RunRow, *, with_result: bool = True) -> RunView:
    return RunView(
        id=row.id,
        trace_id=row.trace_id,
        status=row.status,  # type: ignore[arg-type]
        created_at=row.created_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        exit_reason=row.exit_reason,
        cause=row.cause,
        on_crash=row.on_crash,  # type: ignore[arg-type]
        events=row.last_event,
        events_dropped=row.events_dropped,
        request=REQUEST_DECODER.decode(row.request),
        result=_RESULT.decode(row.result) if with_result and row.result is not None else None,
    )


async def _read_body(request: Request, limit: int) -> bytes:
    too_large = ApiError(
        413,
        "body_too_large",
        f"the request body is larger than {limit} bytes (daemon.max_body_bytes)",
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _decode_request(body: bytes) -> RunRequest:
    try:
        return REQUEST_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        match = _AT_PATH.match(str(exc))
        assert match is not None
        reason, path = match["reason"], (match["path"] or "").lstrip(".")
        if unknown := _UNKNOWN.match(reason):
            key = ".".join(p for p in (path, unknown["field"]) if p)
            raise ApiError(422, "unknown_field", f"unknown field `{key}`", key=key) from None
        if missing := _MISSING.match(reason):
            key = ".".join(p for p in (path, missing["field"]) if p)
            raise ApiError(422, "missing_field", f"missing field `{key}`", key=key) from None
        raise ApiError(
            422, "invalid_field", f"`{path or '(body)'}`: {reason}", key=path or None
        ) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from None


def _int_query(
    value: str | None, name: str, *, default: int, low: int, high: int | None = None
) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ApiError(400, "bad_query", f"{name} must be an integer", key=name) from None
    if number < low or (high is not None and number > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ApiError(400, "bad_query", f"{name} must be {bounds}", key=name)
    return number
