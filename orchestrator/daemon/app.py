"""The ASGI app: routes, auth, JSON errors and the lifespan that runs the daemon.

Every refusal is JSON, ``{"error": {"code", "message", "key"?}}``, with the status that fits
(the routes and every code: ``docs/daemon.md``; limits: :mod:`.limits`, browsers:
:mod:`.browsers`; what a connection may hold before any of this: :mod:`.connections`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.config import Config
from orchestrator.daemon import sse
from orchestrator.daemon.browsers import HostCheck, add_cors, content_type_refusal
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.http import (
    EXCEPTION_HANDLERS,
    after_query,
    decode_request,
    error_response,
    json_response,
    list_query,
    read_body,
    receive_body,
    run_routes,
)
from orchestrator.daemon.lifespan import Daemon
from orchestrator.daemon.metrics import render
from orchestrator.daemon.openapi import openapi_document
from orchestrator.daemon.replay_route import REPLAY_PATH, replay_handler
from orchestrator.daemon.schemas import (
    REQUEST_DECODER,
    Health,
    RunAccepted,
    RunRequest,
    RunView,
)
from orchestrator.daemon.starting import answered_by_simulator
from orchestrator.daemon.store import RunRow
from orchestrator.tracing import HEADER as TRACEPARENT
from orchestrator.tracing import parse_traceparent

__all__ = ["create_app"]

_ENCODER: Final = msgspec.json.Encoder()
_RESULT: Final = msgspec.json.Decoder(dict[str, Any])
SUBMIT_PATH: Final = "/v1/runs"
LIST_PREVIEW_CHARS: Final = 200
"""A listed run's ``task``, ``system``, ``folder``, ``scenario`` and ``pipeline.goal`` are cut
to this many characters, and its ``config`` left out (``GET /v1/runs/{id}`` has them)."""
_PAGE_FRAME: Final = len(b'{"runs":[],"next_cursor":"9223372036854775807"}')
_TRACEPARENT: Final = TRACEPARENT.lower().encode("latin-1")


class _Guard:
    """ASGI middleware: the ``Host`` header (:mod:`.browsers`), bearer tokens, a POST's
    content type, and :class:`ApiError` as a JSON response. It also serves ``POST /v1/runs``
    itself (:meth:`_Api.submit_asgi`): every run comes through there, and Starlette's
    routing and request objects cost more than the route's own work (routes, methods and
    errors stay as Starlette's: this path is exactly that route's)."""

    def __init__(self, app: ASGIApp, daemon: Daemon, api: _Api, hosts: HostCheck) -> None:
        self._app = app
        self._daemon = daemon
        self._api = api
        self._hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
            elif scope["path"] == SUBMIT_PATH and scope["method"] == "POST":
                await self._api.submit_asgi(scope, receive, send)
            else:
                await self._app(scope, receive, send)
        except ApiError as exc:  # raised before a response started
            await error_response(exc)(scope, receive, send)

    def _refusal(self, scope: Scope) -> ApiError | None:
        """Why the request is refused before any route sees it, if it is."""
        hosts: list[bytes] = []
        authorization = content_type = None
        for name, value in scope["headers"]:
            if name == b"host":
                hosts.append(value)
            elif name == b"authorization":
                authorization = value
            elif name == b"content-type":
                content_type = value
        host_refusal = self._hosts.refusal(hosts)
        if host_refusal is not None:
            return host_refusal
        auth = self._daemon.auth
        if auth.needs_token(scope["path"]) and not auth.accepts(authorization):
            return ApiError(
                401,
                "unauthorized",
                "a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if scope["method"] == "POST":
            return content_type_refusal(content_type, required=scope["path"] == SUBMIT_PATH)
        return None


def create_app(config: Config, *, daemon: Daemon | None = None, lifespan: bool = True) -> Starlette:
    """The daemon's ASGI app; its lifespan runs ``daemon`` (made from ``config`` if none),
    for another ASGI server. With ``lifespan`` false the caller runs ``daemon.running()``
    around serving it, so a failed start raises to the caller, not into the server's
    lifespan (:func:`~orchestrator.daemon.server.open_daemon`)."""
    daemon = daemon or Daemon(config)
    api = _Api(daemon)

    @asynccontextmanager
    async def run_daemon(app: Starlette) -> AsyncIterator[None]:
        async with daemon.running():
            yield

    routes = run_routes(
        api,
        Route("/v1/openapi.json", api.openapi, methods=["GET"]),
        Route(REPLAY_PATH, replay_handler(config), methods=["POST"]),
    )
    app = Starlette(
        routes=routes,
        lifespan=run_daemon if lifespan else None,
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.add_middleware(_Guard, daemon=daemon, api=api, hosts=HostCheck.from_config(config))
    add_cors(app, config.daemon.cors_origins)
    return app


class _Api:
    """The route handlers."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    async def submit(self, request: Request) -> Response:
        """The route's Starlette handler, as :class:`RunApi` asks; in this app the guard
        serves ``POST /v1/runs`` before routing (:meth:`submit_asgi`), and the route is
        kept for the method list a 405 names."""
        body = await read_body(request, self._daemon.config.daemon.max_body_bytes)
        status, accepted = await self._accept(body, request.headers.getlist(TRACEPARENT))
        return json_response(accepted, status, Location=f"/v1/runs/{accepted.id}")

    async def submit_asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/runs`` on bare ASGI: :meth:`submit` without a Starlette request and
        response (the guard routes it here)."""
        declared = ""
        parents = []
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value.decode("latin-1")
            elif name == _TRACEPARENT:
                parents.append(value.decode("latin-1"))
        body = await receive_body(receive, declared, self._daemon.config.daemon.max_body_bytes)
        if body is None:  # the client went away before it finished sending
            return
        status, accepted = await self._accept(body, parents)
        content = _ENCODER.encode(accepted)  # what json_response would send
        headers = [
            (b"content-length", str(len(content)).encode()),
            (b"content-type", b"application/json"),
            (b"location", f"/v1/runs/{accepted.id}".encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def _accept(self, body: bytes, parents: list[str]) -> tuple[int, RunAccepted]:
        """Submit the run ``body`` asks for: 202 and the new run, or 200 and the earlier
        run with the same idempotency key."""
        run_request = decode_request(body, self._daemon.config.daemon)
        # The caller's span (W3C Trace Context, the ``parents`` headers); absent, repeated or
        # malformed: ignored, as the specification asks (the run starts a trace of its own).
        parent = parse_traceparent(parents[0]) if len(parents) == 1 else None
        row, created = await self._daemon.service.submit(run_request, traceparent=parent)
        accepted = RunAccepted(id=row.id, trace_id=row.trace_id, status="queued")
        if created:
            return 202, accepted
        current = await self._daemon.store.get_run(row.id)
        status = current.status if current is not None else row.status
        return 200, msgspec.structs.replace(accepted, status=status)

    async def list_runs(self, request: Request) -> Response:
        """A page of run summaries (``RunPage``), cut before it passes
        ``daemon.max_page_bytes`` (always at least one run)."""
        status, exit_reason, limit, before = list_query(request)
        config = self._daemon.config
        rows = await self._daemon.store.list_runs(
            status=status,
            exit_reason=exit_reason,
            before=before,
            limit=limit + 1,
            preview_chars=LIST_PREVIEW_CHARS,
        )
        budget = config.daemon.max_page_bytes - _PAGE_FRAME
        runs: list[bytes] = []
        for row in rows[:limit]:
            encoded = _ENCODER.encode(_view(row, config, with_result=False))
            budget -= len(encoded) + 1
            if runs and budget < 0:
                break
            runs.append(encoded)
        more = len(rows) > len(runs)
        cursor = _ENCODER.encode(str(rows[len(runs) - 1].cursor) if more else None)
        body = b'{"runs":[' + b",".join(runs) + b'],"next_cursor":' + cursor + b"}"
        return Response(body, media_type="application/json")

    async def get_run(self, request: Request) -> Response:
        return json_response(_view(await self._row(request), self._daemon.config))

    async def abort(self, request: Request) -> Response:
        row = await self._daemon.service.abort(request.path_params["id"])
        return json_response(RunAccepted(id=row.id, trace_id=row.trace_id, status="running"), 202)

    async def events(self, request: Request) -> Response:
        run_id = request.path_params["id"]
        if not self._daemon.store.memory.knows(run_id):  # in memory: it exists, no read
            run_id = (await self._row(request)).id
        stream = sse.event_stream(
            self._daemon.store, run_id, after=after_query(request), closing=self._daemon.closing
        )
        heartbeat = self._daemon.config.daemon.heartbeat_seconds
        return sse.EventStreamResponse(stream, heartbeat=heartbeat, opened=self._counted)

    def _counted(self, opened: int) -> None:
        self._daemon.streams += opened

    async def scenarios(self, request: Request) -> Response:
        return json_response({"scenarios": self._daemon.service.scenario_names()})

    async def openapi(self, request: Request) -> Response:
        try:
            release = version("loopfuse")
        except PackageNotFoundError:
            release = "0"
        return json_response(openapi_document(release, self._daemon.config.daemon.max_task_chars))

    async def metrics(self, request: Request) -> Response:
        return render(self._daemon.registry, request.headers.get("accept"))

    async def readyz(self, request: Request) -> Response:
        daemon = self._daemon
        if daemon.ready:
            return json_response(Health(status="ok"))
        if daemon.draining:
            return json_response(Health(status="draining", reason="shutting down"), 503)
        return json_response(Health(status="starting", reason="recovering runs"), 503)

    async def _row(self, request: Request) -> RunRow:
        run_id = request.path_params["id"]
        row = await self._daemon.store.get_run(run_id)
        if row is None:
            raise ApiError(404, "unknown_run", f"no run {run_id!r}", key="id")
        return row


class _Answered(msgspec.Struct):
    simulated: bool = False


_ANSWERED: Final = msgspec.json.Decoder(_Answered)
"""Reads a stored result's ``simulated`` alone (the rest is skipped, not built)."""


def _view(row: RunRow, config: Config, *, with_result: bool = True) -> RunView:
    request: RunRequest | None = None
    request_error: str | None = None
    try:
        request = REQUEST_DECODER.decode(row.request)
    except msgspec.DecodeError as exc:  # ValidationError included: stored by an older version
        request_error = f"the stored request no longer matches this version's schema: {exc}"
    result = _RESULT.decode(row.result) if with_result and row.result is not None else None
    # Whether the embedded simulator answered the run though it plays no scenario: as its
    # stored result says; a run not ended yet is answered by this daemon (``config``).
    if row.result is None:
        simulated = request is not None and answered_by_simulator(config, request)
    elif result is not None:
        simulated = result.get("simulated") is True
    else:
        simulated = _ANSWERED.decode(row.result).simulated
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
        request=request,
        request_error=request_error,
        simulated=simulated,
        result=result,
    )
