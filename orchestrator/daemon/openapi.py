"""The OpenAPI 3.1 description served at ``/v1/openapi.json``.

Schemas are generated from the msgspec types the API decodes and encodes (so they cannot
drift), with the limits the daemon enforces beyond them (:mod:`orchestrator.daemon.limits`):
free-text fields carry ``maxLength`` = ``daemon.max_task_chars``, integer parameters their
bounds. The paths are written here: every route, every parameter with its schema, every
status a route answers with and its body (``tests/test_api_fuzz.py`` holds the daemon to
it).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import msgspec

from bus import BusMessage, ExitReason
from orchestrator.daemon.http import PAGE_LIMIT, STATUSES
from orchestrator.daemon.limits import INTEGER_PATTERN, MAX_INTEGER, MAX_JSON_DEPTH
from orchestrator.daemon.schemas import ErrorBody, Health, RunAccepted, RunPage, RunRequest, RunView

__all__ = ["openapi_document"]

_REF: Final = "#/components/schemas/{name}"
_ERRORS: Final = {
    400: (
        "Malformed JSON, a body nested more than "
        f"{MAX_JSON_DEPTH} levels deep, a bad query parameter or header, or a Host header "
        "that does not name the daemon (any route); `error.key` names the parameter."
    ),
    401: "Missing or wrong bearer token (only when tokens are configured).",
    404: "No such run.",
    409: "Conflict (run already ended, idempotency key reused).",
    413: "Request body too large (daemon.max_body_bytes).",
    415: "A body that is not `application/json` (a POST's Content-Type).",
    422: (
        "Unknown field, wrong type, bad value, or a text longer than daemon.max_task_chars; "
        "`error.key` names it."
    ),
    429: "Queue full; retry after `Retry-After` seconds.",
    503: "Draining for shutdown (or starting); retry after `Retry-After` seconds.",
}
_TEXT_FIELDS: Final = {
    "RunRequest": ("task", "system", "folder", "scenario"),
    "PipelineRequest": ("goal",),
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(name=name)}


def _json(name: str, description: str, **headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": _ref(name)}},
    }
    if headers:
        response["headers"] = {
            header: {"description": text, "schema": {"type": "string"}}
            for header, text in headers.items()
        }
    return response


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): _json("ErrorBody", _ERRORS[code]) for code in codes}


def _integer(name: str, where: str, low: int, high: int = MAX_INTEGER) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "schema": {"type": "integer", "minimum": low, "maximum": high},
        "description": "ASCII digits only.",
    }


_SSE_EVENT: Final = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "event": {"const": "message"},
                "id": {"type": "string", "pattern": INTEGER_PATTERN},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": _REF.format(name="BusMessage")},
                },
            },
            "required": ["event", "id", "data"],
        },
        {
            "type": "object",
            "properties": {
                "event": {"enum": ["end", "shutdown"]},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": _REF.format(name="StreamEnd")},
                },
            },
            "required": ["event", "data"],
        },
    ]
}
_STREAM_END: Final = {
    "type": "object",
    "description": "The data of a stream's last event.",
    "properties": {
        "id": {"type": "string"},
        "status": {"enum": ["queued", "running", "ended", "deleted"]},
        "exit_reason": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "last_event_id": {"type": "integer", "minimum": 0},
        "events_dropped": {"type": "integer", "minimum": 0},
    },
    "required": ["id", "status", "exit_reason", "last_event_id", "events_dropped"],
}
_RUN_ID: Final = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
_OPEN: Final[list[dict[str, list[str]]]] = []  # no token needed


def _limit_texts(components: dict[str, Any], max_chars: int) -> None:
    """Add ``maxLength`` to the string branch of every free-text field."""
    for name, fields in _TEXT_FIELDS.items():
        properties = components[name]["properties"]
        for field in fields:
            schema = properties[field]
            for branch in schema.get("anyOf", [schema]):
                if branch.get("type") == "string":
                    branch["maxLength"] = max_chars


@cache
def openapi_document(version: str, max_text_chars: int) -> dict[str, Any]:
    """The whole document for a daemon whose ``daemon.max_task_chars`` is
    ``max_text_chars`` (built once per pair)."""
    _, components = msgspec.json.schema_components(
        (RunRequest, RunAccepted, RunView, RunPage, ErrorBody, Health, BusMessage),
        ref_template=_REF,
    )
    _limit_texts(components, max_text_chars)
    components["Scenarios"] = {
        "type": "object",
        "properties": {"scenarios": {"type": "array", "items": {"type": "string"}}},
        "required": ["scenarios"],
    }
    components["StreamEnd"] = _STREAM_END
    sse = {
        "description": (
            "Server-Sent Events: one event per bus message (`id` = sequence number, `data` = "
            "a BusMessage as JSON), `: ping` heartbeats, then `event: end` (or `event: "
            "shutdown` when the daemon stops first) whose `data` is a StreamEnd. The schema "
            "describes one event, as OpenAPI 3.2's `itemSchema` would."
        ),
        "content": {"text/event-stream": {"schema": _SSE_EVENT}},
    }
    metrics_body = {"schema": {"type": "string"}}
    paths: dict[str, Any] = {
        "/v1/runs": {
            "post": {
                "summary": "Submit a run (a task, a pipeline or a shipped scenario)",
                "parameters": [
                    {
                        "name": "traceparent",
                        "in": "header",
                        "schema": {"type": "string", "maxLength": 512},
                        "description": (
                            "W3C Trace Context: the run's trace continues the caller's "
                            "(its trace id, its span the parent of the run's span). "
                            "Malformed or repeated: ignored."
                        ),
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("RunRequest")}},
                },
                "responses": {
                    "202": _json(
                        "RunAccepted", "Stored and started (or queued).", Location="The run."
                    ),
                    "200": _json(
                        "RunAccepted",
                        "The run made earlier with this idempotency key.",
                        Location="The run.",
                    ),
                    **_errors(400, 401, 409, 413, 415, 422, 429, 503),
                },
            },
            "get": {
                "summary": "List runs, newest first",
                "parameters": [
                    {
                        "name": "status",
                        "in": "query",
                        "schema": {"type": "string", "enum": sorted(STATUSES)},
                    },
                    {
                        "name": "exit_reason",
                        "in": "query",
                        "schema": {"type": "string", "enum": sorted(r.value for r in ExitReason)},
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string", "pattern": INTEGER_PATTERN},
                        "description": "A page's `next_cursor`.",
                    },
                    _integer("limit", "query", 1, PAGE_LIMIT),
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
                    _integer("after", "query", 0),
                    _integer("Last-Event-ID", "header", 0),
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
                    **_errors(401, 404, 409, 415),
                },
            }
        },
        "/v1/scenarios": {
            "get": {
                "summary": "Scenario names a run may ask for",
                "responses": {"200": _json("Scenarios", "Names."), **_errors(401)},
            }
        },
        "/v1/openapi.json": {
            "get": {
                "summary": "This document",
                "security": _OPEN,
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (OpenMetrics when asked)",
                "responses": {
                    "200": {
                        "description": "Metrics.",
                        "content": {
                            "text/plain": metrics_body,
                            "application/openmetrics-text": metrics_body,
                        },
                    },
                    **_errors(401, 503),
                },
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "security": _OPEN,
                "responses": {"200": _json("Health", "Alive.")},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness (503 while starting or draining)",
                "security": _OPEN,
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
