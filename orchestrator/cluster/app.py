"""The daemon's HTTP API for a fleet member: any run of the fleet, from any daemon.

The same routes and bodies as the single-node daemon (``docs/daemon.md``), backed by
:class:`~orchestrator.cluster.node.ClusterNode` instead of SQLite: runs are queued on the
work-queue stream, read from the ``runstate`` bucket, aborted on the daemon running them,
and followed over SSE from the events stream (ids are stream sequence numbers, so a
follower resumes on any daemon). What differs from one node: ``docs/scale-out.md``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.cluster.metrics import FleetCollector, NodeCollector
from orchestrator.cluster.node import ClusterNode
from orchestrator.cluster.state import STATE_DECODER, RunState
from orchestrator.daemon import sse
from orchestrator.daemon.auth import Authenticator
from orchestrator.daemon.browsers import HostCheck, add_cors, browser_refusal
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.http import (
    EXCEPTION_HANDLERS,
    after_query,
    decode_request,
    error_response,
    json_response,
    list_query,
    read_body,
    run_routes,
)
from orchestrator.daemon.metrics import render
from orchestrator.daemon.schemas import REQUEST_DECODER, Health, RunAccepted, RunPage, RunView

__all__ = ["create_fleet_app", "running_fleet_app"]


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _view(state: RunState) -> RunView:
    return RunView(
        id=state.run_id,
        trace_id=state.trace_id,
        status="running" if state.status == "aborting" else state.status,
        created_at=state.created_at,
        ended_at=state.ended_at,
        exit_reason=state.exit_reason,
        cause=state.cause,
        on_crash="abort" if state.on_crash == "abort" else "resume",
        events=0,
        request=REQUEST_DECODER.decode(msgspec.json.encode(state.request)),
        simulated=state.result is not None and state.result.get("simulated") is True,
        result=state.result,
    )


class _Guard:
    """The ``Host`` and ``Content-Type`` checks (:mod:`orchestrator.daemon.browsers`), bearer
    tokens, and :class:`ApiError` (a :class:`~orchestrator.cluster.node.ClusterError` too) as
    JSON responses."""

    def __init__(self, app: ASGIApp, auth: Authenticator, hosts: HostCheck) -> None:
        self._app = app
        self._auth = auth
        self._hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] == "http":
                path = scope["path"]
                refusal = browser_refusal(scope, self._hosts, body_required=path == "/v1/runs")
                if refusal is not None:
                    raise refusal
                # The header's bytes (tokens are compared as bytes), read only where needed.
                if self._auth.needs_token(path) and not self._auth.accepts(
                    dict(scope["headers"]).get(b"authorization")
                ):
                    raise ApiError(
                        401,
                        "unauthorized",
                        "a valid bearer token is required (Authorization: Bearer <token>)",
                        headers={"WWW-Authenticate": "Bearer"},
                    )
            await self._app(scope, receive, send)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)


def create_fleet_app(node: ClusterNode) -> Starlette:
    """The fleet member's ASGI app, with no lifespan: the caller runs ``node`` around serving
    it (:func:`running_fleet_app`), so a failed start raises to the caller (``loopfuse serve
    --nats``)."""
    config = node.config
    auth = Authenticator.from_environment(
        config.daemon.token_env, metrics_auth=config.daemon.metrics_auth
    )
    api = _FleetApi(node)
    app = Starlette(routes=run_routes(api), exception_handlers=EXCEPTION_HANDLERS)
    app.state.node = node
    app.state.api = api
    app.add_middleware(_Guard, auth=auth, hosts=HostCheck.from_config(config))
    add_cors(app, config.daemon.cors_origins)
    return app


@asynccontextmanager
async def running_fleet_app(app: Starlette) -> AsyncIterator[None]:
    """Run the node of ``app`` (:func:`create_fleet_app`) for the ``async with`` body: it
    answers once the node has joined the fleet."""
    node: ClusterNode = app.state.node
    api: _FleetApi = app.state.api
    async with node.running(), anyio.create_task_group() as tg:
        registry = node.runtime.metrics_registry
        registry.register(NodeCollector(node))
        fleet = FleetCollector(node)
        registry.register(fleet)
        await tg.start(fleet.run)
        api.ready = True
        yield
        api.ready = False
        tg.cancel_scope.cancel()


class _FleetApi:
    def __init__(self, node: ClusterNode) -> None:
        self._node = node
        self.ready = False

    async def submit(self, request: Request) -> Response:
        settings = self._node.config.daemon
        body = await read_body(request, settings.max_body_bytes)
        run_request = decode_request(body, settings)
        state, created = await self._node.submit(run_request)
        status = "running" if state.status == "aborting" else state.status
        accepted = RunAccepted(id=state.run_id, trace_id=state.trace_id, status=status)
        return json_response(accepted, 202 if created else 200, Location=f"/v1/runs/{state.run_id}")

    async def list_runs(self, request: Request) -> Response:
        """Every run of the fleet, newest first, filtered and paged like a single daemon's
        listing; the cursor is the last run's creation time in microseconds."""
        status, exit_reason, limit, before = list_query(request)
        views = sorted(
            (_view(state) for state in await self._node.states()),
            key=lambda view: view.created_at,
            reverse=True,
        )
        chosen = [
            view
            for view in views
            if (status is None or view.status == status)
            and (exit_reason is None or view.exit_reason == exit_reason)
            and (before is None or _micros(view.created_at) < before)
        ]
        page = chosen[:limit]
        runs = [msgspec.structs.replace(view, result=None) for view in page]
        next_cursor = str(_micros(page[-1].created_at)) if len(chosen) > limit else None
        return json_response(RunPage(runs=runs, next_cursor=next_cursor))

    async def scenarios(self, request: Request) -> Response:
        return json_response({"scenarios": self._node.scenario_names()})

    async def get_run(self, request: Request) -> Response:
        return json_response(_view(await self._node.state(request.path_params["id"])))

    async def abort(self, request: Request) -> Response:
        state = await self._node.abort(request.path_params["id"])
        return json_response(
            RunAccepted(id=state.run_id, trace_id=state.trace_id, status="running"), 202
        )

    async def events(self, request: Request) -> Response:
        run_id = request.path_params["id"]
        await self._node.state(run_id)  # 404 before the stream starts
        after = after_query(request)
        heartbeat = self._node.config.daemon.heartbeat_seconds
        return sse.EventStreamResponse(
            self._stream(run_id, after), heartbeat=heartbeat, opened=lambda _: None
        )

    async def _stream(self, run_id: str, after: int) -> AsyncIterator[bytes]:
        yield b"retry: %d\n\n" % sse.RETRY_MILLISECONDS
        last = after
        async for event in self._node.events(run_id, after=after):
            yield sse.frame(event.data, id=event.seq)
            last = event.seq
        state = await self._node.state(run_id)
        watcher = await self._node.buckets.state.watch(run_id)
        try:
            while state.status != "ended":
                entry = await watcher.updates(timeout=None)  # type: ignore[no-untyped-call]
                if entry is not None and entry.value:
                    state = STATE_DECODER.decode(entry.value)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        body = {
            "id": run_id,
            "status": state.status,
            "exit_reason": state.exit_reason,
            "last_event_id": last,
            "events_dropped": 0,
        }
        yield sse.frame(msgspec.json.encode(body), event="end")

    async def metrics(self, request: Request) -> Response:
        registry = self._node.runtime.metrics_registry if self.ready else None
        return render(registry, request.headers.get("accept"))

    async def readyz(self, request: Request) -> Response:
        if self.ready:
            return json_response(Health(status="ok"))
        return json_response(Health(status="starting", reason="joining the fleet"), 503)
