"""The OpenAPI 3.1 description served at ``/v1/openapi.json``.

Schemas are generated from the msgspec types the API decodes and encodes (so they cannot
drift); the paths are written here, next to nothing else.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from bus import BusMessage
from orchestrator.daemon.schemas import ErrorBody, Health, RunAccepted, RunPage, RunRequest, RunView

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(name=name)}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Malformed JSON or query parameter.",
        401: "Missing or wrong bearer token.",
        404: "No such run.",
        409: "Conflict (run already ended, idempotency key reused).",
        413: "Request body too large (daemon.max_body_bytes).",
        422: "Unknown field, wrong type, bad value; `error.key` names it.",
        429: "Queue full; retry after `Retry-After` seconds.",
        503: "Draining for shutdown; retry after `Retry-After` seconds elsewhere or later.",
    }
    return {str(code): _json("ErrorBody", text[code]) for code in codes}


_RUN_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}


@cache
def openapi_document(version: str) -> dict[str, Any]:
    """The whole document (built once)."""
    _, components = msgspec.json.schema_components(
        (RunRequest, RunAccepted, RunView, RunPage, ErrorBody, Health, BusMessage),
        ref_template=_REF,
    )
    sse = {
        "description": (
            "Server-Sent Events: one event per bus message (`id` = sequence number, `data` = "
            "a BusMessage as JSON), `: ping` heartbeats, then `event: end`."
        ),
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    paths: dict[str, Any] = {
        "/v1/runs": {
            "post": {
                "summary": "Submit a run (a task or a shipped scenario)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("RunRequest")}},
                },
                "responses": {
                    "202": _json("RunAccepted", "Stored and started (or queued)."),
                    "200": _json("RunAccepted", "The run made earlier with this idempotency key."),
                    **_errors(400, 401, 409, 413, 422, 429, 503),
                },
            },
            "get": {
                "summary": "List runs, newest first",
                "parameters": [
                    {
                        "name": "status",
                        "in": "query",
                        "schema": {"enum": ["queued", "running", "ended"]},
                    },
                    {"name": "exit_reason", "in": "query", "schema": {"type": "string"}},
                    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                ],
                "responses": {"200": _json("RunPage", "A page of runs."), **_errors(400, 401)},
            },
        },
        "/v1/runs/{id}": {
            "get": {
                "summary": "A run's status and, once ended, its result",
                "parameters": [_RUN_ID],
                "responses": {"200": _json("RunView", "The run."), **_errors(401, 404)},
            }
        },
        "/v1/runs/{id}/events": {
            "get": {
                "summary": "Follow a run's events (SSE); resume with Last-Event-ID or ?after=",
                "parameters": [
                    _RUN_ID,
                    {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}},
                ],
                "responses": {"200": sse, **_errors(400, 401, 404)},
            }
        },
        "/v1/runs/{id}/abort": {
            "post": {
                "summary": "Abort a run (cause abort.caller)",
                "parameters": [_RUN_ID],
                "responses": {
                    "202": _json("RunAccepted", "Abort requested."),
                    **_errors(401, 404, 409),
                },
            }
        },
        "/v1/scenarios": {
            "get": {
                "summary": "Scenario names a run may ask for",
                "responses": {"200": {"description": "Names."}},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (OpenMetrics when asked)",
                "responses": {"200": {"description": "Metrics."}},
            }
        },
        "/healthz": {
            "get": {"summary": "Liveness", "responses": {"200": _json("Health", "Alive.")}}
        },
        "/readyz": {
            "get": {
                "summary": "Readiness (503 while starting or draining)",
                "responses": {
                    "200": _json("Health", "Ready."),
                    "503": _json("Health", "Not ready."),
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "loopfuse daemon", "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
