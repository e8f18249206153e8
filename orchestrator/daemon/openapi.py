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
from typing import Any, Final, get_args

import msgspec

from bus import BusMessage, ExitReason
from orchestrator.config import LoopPreset
from orchestrator.daemon.http import PAGE_LIMIT, STATUSES
from orchestrator.daemon.limits import INTEGER_PATTERN, MAX_INTEGER, MAX_JSON_DEPTH
from orchestrator.daemon.replay_route import MAX_REPLAY_RUNS
from orchestrator.daemon.schemas import ErrorBody, Health, RunAccepted, RunPage, RunRequest, RunView
from orchestrator.replay.report import ReplayRow, Totals

__all__ = ["openapi_document"]

_REF: Final = "#/components/schemas/{name}"
_ERRORS: Final = {
    400: (
        "Malformed JSON, a body nested more than "
        f"{MAX_JSON_DEPTH} levels deep, a bad query parameter or header, or a Host header "
        "that does not name the daemon (any route); `error.key` names the parameter."
    ),
    401: "Missing or wrong bearer token (only when tokens are configured).",
    403: (
        "An operator's route asked with an API token, or with no operator token configured "
        "(daemon.operator_token_env)."
    ),
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


def _operation(
    summary: str,
    responses: dict[str, Any],
    errors: tuple[int, ...] = (),
    *,
    parameters: list[dict[str, Any]] | None = None,
    body: str | None = None,
    public: bool = False,
) -> dict[str, Any]:
    """One operation: ``responses`` then the error body of each of ``errors``; ``body`` the
    schema of a required JSON request body; ``public`` when it needs no token."""
    operation: dict[str, Any] = {"summary": summary}
    if public:
        operation["security"] = _OPEN
    if parameters is not None:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(body)}},
        }
    refusals = {str(code): _json("ErrorBody", _ERRORS[code]) for code in errors}
    operation["responses"] = {**responses, **refusals}
    return operation


def _integer(name: str, where: str, low: int, high: int = MAX_INTEGER) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "schema": {"type": "integer", "minimum": low, "maximum": high},
        "description": "ASCII digits only.",
    }


def _json_text(name: str) -> dict[str, Any]:
    """A string that holds schema ``name`` as JSON (an event's ``data``)."""
    return {"type": "string", "contentMediaType": "application/json", "contentSchema": _ref(name)}


_SSE_EVENT: Final = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "event": {"const": "message"},
                "id": {"type": "string", "pattern": INTEGER_PATTERN},
                "data": _json_text("BusMessage"),
            },
            "required": ["event", "id", "data"],
        },
        {
            "type": "object",
            "properties": {
                "event": {"enum": ["end", "shutdown"]},
                "data": _json_text("StreamEnd"),
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
_REPLAY_REQUEST: Final = {
    "type": "object",
    "description": (
        "Runs to replay: each a run's logged events (`{name, events}`, as "
        "/v1/runs/{id}/events streams them) or an OpenAI chat transcript "
        "(`{name, messages, tools}`); and up to four loop presets (none: the config's own)."
    ),
    "properties": {
        "runs": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_REPLAY_RUNS,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "events": {"type": "array", "items": _ref("BusMessage")},
                    "messages": {"type": "array", "items": {"type": "object"}},
                    "tools": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
        "presets": {
            "type": "array",
            "maxItems": 4,
            "items": {"enum": sorted(get_args(LoopPreset))},
        },
    },
    "required": ["runs"],
}
_SCHEMA_TYPES: Final = (
    RunRequest,
    RunAccepted,
    RunView,
    RunPage,
    ErrorBody,
    Health,
    BusMessage,
    ReplayRow,
    Totals,
)
_RUN_ID: Final = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
_OPEN: Final[list[dict[str, list[str]]]] = []  # no token needed
_TRACEPARENT: Final = {
    "name": "traceparent",
    "in": "header",
    "schema": {"type": "string", "maxLength": 512},
    "description": (
        "W3C Trace Context: the run's trace continues the caller's (its trace id, its span "
        "the parent of the run's span). Malformed or repeated: ignored."
    ),
}
_LIST_PARAMETERS: Final = [
    {"name": "status", "in": "query", "schema": {"type": "string", "enum": sorted(STATUSES)}},
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
]


@cache
def openapi_document(version: str, max_text_chars: int) -> dict[str, Any]:
    """The whole document for a daemon whose ``daemon.max_task_chars`` is
    ``max_text_chars`` (built once per pair)."""
    _, components = msgspec.json.schema_components(
        _SCHEMA_TYPES,
        ref_template=_REF,
    )
    components["ReplayRequest"] = _REPLAY_REQUEST
    components["ReplayReport"] = {
        "type": "object",
        "description": "What `loopfuse replay --json` prints (docs/replay.md).",
        "properties": {
            "rows": {"type": "array", "items": _ref("ReplayRow")},
            "totals": {"type": "array", "items": _ref("Totals")},
        },
        "required": ["rows", "totals"],
    }
    for name, fields in _TEXT_FIELDS.items():  # maxLength on each free text's string branch
        for field in fields:
            schema = components[name]["properties"][field]
            for branch in schema.get("anyOf", [schema]):
                if branch.get("type") == "string":
                    branch["maxLength"] = max_text_chars
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
    accepted = _json("RunAccepted", "Stored and started (or queued).", Location="The run.")
    again = _json(
        "RunAccepted", "The run made earlier with this idempotency key.", Location="The run."
    )
    document = {
        "description": "OpenAPI 3.1.",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
    metrics = {
        "description": "Metrics.",
        "content": {"text/plain": metrics_body, "application/openmetrics-text": metrics_body},
    }
    replay_summary = (
        "Replay recorded runs under the daemon's config and loop presets "
        "(operator token only; no model or tool is called)"
    )
    paths: dict[str, Any] = {
        "/v1/runs": {
            "post": _operation(
                "Submit a run (a task, a pipeline or a shipped scenario)",
                {"202": accepted, "200": again},
                (400, 401, 409, 413, 415, 422, 429, 503),
                parameters=[_TRACEPARENT],
                body="RunRequest",
            ),
            "get": _operation(
                "List runs, newest first",
                {"200": _json("RunPage", "A page of runs.")},
                (400, 401),
                parameters=_LIST_PARAMETERS,
            ),
        },
        "/v1/runs/{id}": {
            "get": _operation(
                "A run's status and, once ended, its result",
                {"200": _json("RunView", "The run.")},
                (401, 404),
                parameters=[_RUN_ID],
            )
        },
        "/v1/runs/{id}/events": {
            "get": _operation(
                "Follow a run's events (SSE); resume with Last-Event-ID or ?after=",
                {"200": sse},
                (400, 401, 404),
                parameters=[
                    _RUN_ID,
                    _integer("after", "query", 0),
                    _integer("Last-Event-ID", "header", 0),
                ],
            )
        },
        "/v1/runs/{id}/abort": {
            "post": _operation(
                "Abort a run (cause abort.caller)",
                {"202": _json("RunAccepted", "Abort requested.")},
                (401, 404, 409, 415),
                parameters=[_RUN_ID],
            )
        },
        "/v1/scenarios": {
            "get": _operation(
                "Scenario names a run may ask for", {"200": _json("Scenarios", "Names.")}, (401,)
            )
        },
        "/v1/replay": {
            "post": _operation(
                replay_summary,
                {"200": _json("ReplayReport", "Per run and config, and the totals.")},
                (400, 401, 403, 413, 415, 422),
                body="ReplayRequest",
            )
        },
        "/v1/openapi.json": {"get": _operation("This document", {"200": document}, public=True)},
        "/metrics": {
            "get": _operation(
                "Prometheus metrics (OpenMetrics when asked)", {"200": metrics}, (401, 503)
            )
        },
        "/healthz": {
            "get": _operation("Liveness", {"200": _json("Health", "Alive.")}, public=True)
        },
        "/readyz": {
            "get": _operation(
                "Readiness (503 while starting or draining)",
                {"200": _json("Health", "Ready."), "503": _json("Health", "Not ready.")},
                public=True,
            )
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
