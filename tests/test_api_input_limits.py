"""Hostile inputs the API must refuse cleanly, through the real daemon over loopback HTTP.

Each probe once made a 5xx, a dead stream or a failed run: a body nested 1,000+ levels deep
(RecursionError), a cursor past SQLite's integers (OverflowError), a ``Last-Event-ID`` past
them (a stream that died after its 200), a 1,000,000-character task (accepted, then
``internal.error`` in the token estimator), and integers written ``1_0``, ``+1``, `` 1``
or in other scripts' digits (read as numbers). Now: a 4xx with the JSON error body naming
the parameter and the limit, and nothing in the daemon's log.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.from_thread import start_blocking_portal

from orchestrator.config import DaemonSettings
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.limits import MAX_INTEGER, MAX_JSON_DEPTH
from tests.daemon_support import JSON, daemon_config, wait_ended

DEFAULT_MAX_CHARS = DaemonSettings().max_task_chars


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def daemon_log() -> Iterator[list[logging.LogRecord]]:
    """Every record the daemon and uvicorn log (whether or not they propagate)."""
    handler = _Records()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn.error", "loopfuse")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _tracebacks(records: list[logging.LogRecord]) -> list[str]:
    return sorted({r.getMessage() for r in records if r.exc_info or r.levelno >= logging.ERROR})


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx.Client]:
    """A client of a daemon with the default limits (served from a portal's thread)."""
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(open_daemon(daemon_config(tmp_path))) as running,
        httpx.Client(base_url=running.url, timeout=60, headers=JSON) as client,
    ):
        yield client


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


def _nested(depth: int) -> bytes:
    return b'{"task": "x", "config": {"loop": ' + b"[" * depth + b"]" * depth + b"}}"


# --------------------------------------------------------------------------- nesting


def test_a_body_nested_1000_levels_deep_is_a_400_naming_the_limit(
    http: httpx.Client, daemon_log: list[logging.LogRecord]
) -> None:
    for depth in (1_000, 5_000, 60_000):
        error = _error(http.post("/v1/runs", content=_nested(depth)), 400, "too_deep")
        assert f"more than {MAX_JSON_DEPTH} levels" in error["message"]
    objects = b'{"a":' * 2_000 + b"1" + b"}" * 2_000
    _error(http.post("/v1/runs", content=objects), 400, "too_deep")
    assert _tracebacks(daemon_log) == []


def test_nesting_at_the_limit_and_brackets_in_strings_pass_the_depth_check(
    http: httpx.Client,
) -> None:
    # config.loop nested to the limit (two levels are the body and config): decoded, then
    # refused for what it is, a bad loop setting
    at_limit = http.post("/v1/runs", content=_nested(MAX_JSON_DEPTH - 2))
    assert at_limit.status_code == 422, at_limit.text
    over = http.post("/v1/runs", content=_nested(MAX_JSON_DEPTH - 1))
    _error(over, 400, "too_deep")
    # brackets inside strings, escaped quotes included, are text, not nesting
    text = '[{"\\"' * 5_000
    accepted = http.post("/v1/runs", json={"task": text})
    assert accepted.status_code == 202, accepted.text


# --------------------------------------------------------------------------- integers


def test_a_cursor_past_sqlites_integers_is_a_400_naming_it(http: httpx.Client) -> None:
    too_big = http.get("/v1/runs", params={"cursor": str(MAX_INTEGER + 1)})
    error = _error(too_big, 400, "bad_query")
    assert error["key"] == "cursor"
    assert str(MAX_INTEGER) in error["message"]
    huge = http.get("/v1/runs", params={"cursor": "9" * 5_000})
    assert _error(huge, 400, "bad_query")["key"] == "cursor"
    largest = http.get("/v1/runs", params={"cursor": str(MAX_INTEGER)})
    assert largest.status_code == 200, largest.text


@pytest.mark.parametrize("written", ["1_0", "+1", " 1", "1 ", "١٠", "１０", "1e1", "0x1", "-1", ""])
def test_integers_are_ascii_digits_only(http: httpx.Client, written: str) -> None:
    limit = http.get("/v1/runs", params={"limit": written})
    assert _error(limit, 400, "bad_query")["key"] == "limit"
    cursor = http.get("/v1/runs", params={"cursor": written})
    assert _error(cursor, 400, "bad_query")["key"] == "cursor"
    run_id = (http.post("/v1/runs", json={"scenario": "completed"})).json()["id"]
    after = http.get(f"/v1/runs/{run_id}/events", params={"after": written})
    assert _error(after, 400, "bad_query")["key"] == "after"
    if written.isascii() and written == written.strip():  # a header cannot carry the others
        header = http.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": written})
        assert _error(header, 400, "bad_query")["key"] == "Last-Event-ID"
    assert (http.get("/v1/runs", params={"limit": "10"})).status_code == 200


# --------------------------------------------------------------------------- Last-Event-ID


@pytest.mark.asyncio
async def test_a_last_event_id_past_sqlites_integers_is_a_400_before_the_stream(
    tmp_path: Path, daemon_log: list[logging.LogRecord]
) -> None:
    async with open_daemon(daemon_config(tmp_path)) as running:
        async with DaemonClient(running.url) as client:
            run_id = (await client.submit({"scenario": "completed"}))["id"]
            with anyio.fail_after(30):
                await wait_ended(client, run_id)
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as http:
            bogus = await http.get(
                f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "99999999999999999999"}
            )
            largest = await http.get(
                f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(MAX_INTEGER)}
            )
            assert (await http.get("/healthz")).status_code == 200
    error = _error(bogus, 400, "bad_query")
    assert error["key"] == "Last-Event-ID"
    assert str(MAX_INTEGER) in error["message"]
    # the largest id there is: nothing after it, and the stream ends properly
    assert largest.status_code == 200
    assert "id:" not in largest.text
    end = largest.text.split("event: end\ndata: ")[1].splitlines()[0]
    assert json.loads(end)["status"] == "ended"
    assert _tracebacks(daemon_log) == []


# --------------------------------------------------------------------------- free text


def test_a_million_character_task_is_refused_naming_the_limit(
    http: httpx.Client,
) -> None:
    assert DEFAULT_MAX_CHARS == 200_000
    million = "a " * 500_000
    error = _error(http.post("/v1/runs", json={"task": million}), 422, "too_long")
    assert error["key"] == "task"
    assert "1000000 characters" in error["message"]
    assert f"the limit is {DEFAULT_MAX_CHARS} (daemon.max_task_chars)" in error["message"]
    listed = (http.get("/v1/runs")).json()["runs"]
    assert listed == []  # nothing was stored


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"task": "x", "system": "s" * (DEFAULT_MAX_CHARS + 1)}, "system"),
        ({"pipeline": {"name": "report", "goal": "g" * (DEFAULT_MAX_CHARS + 1)}}, "pipeline.goal"),
        ({"task": "x", "folder": "f" * (DEFAULT_MAX_CHARS + 1)}, "folder"),
        ({"scenario": "s" * (DEFAULT_MAX_CHARS + 1)}, "scenario"),
    ],
)
def test_every_free_text_field_is_limited(
    http: httpx.Client, body: dict[str, Any], key: str
) -> None:
    error = _error(http.post("/v1/runs", json=body), 422, "too_long")
    assert error["key"] == key


def test_a_task_at_the_limit_runs_and_ends_by_the_context_rules(
    http: httpx.Client,
) -> None:
    task = "word " * (DEFAULT_MAX_CHARS // 5)
    assert len(task) == DEFAULT_MAX_CHARS
    accepted = http.post("/v1/runs", json={"task": task})
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["id"]
    lines = []
    deadline = time.monotonic() + 60  # heartbeats bring a line at least every 15 s
    with http.stream("GET", f"/v1/runs/{run_id}/events") as stream:
        for line in stream.iter_lines():
            lines.append(line)
            assert time.monotonic() < deadline, lines[-5:]
    assert "event: end" in lines
    run = http.get(f"/v1/runs/{run_id}").json()
    # 200,000 characters do not fit the simulator's 32,768-token window
    assert (run["exit_reason"], run["cause"]) == ("blocking_limit", "context.blocking_limit")


@pytest.mark.asyncio
async def test_the_limit_is_a_setting(tmp_path: Path) -> None:
    config = daemon_config(tmp_path, max_task_chars=10)
    async with (
        open_daemon(config) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        refused = await http.post("/v1/runs", json={"task": "eleven char"})
        accepted = await http.post("/v1/runs", json={"task": "ten chars!"})
        document = (await http.get("/v1/openapi.json")).json()
    error = _error(refused, 422, "too_long")
    assert "the limit is 10 (daemon.max_task_chars)" in error["message"]
    assert accepted.status_code == 202, accepted.text
    task = document["components"]["schemas"]["RunRequest"]["properties"]["task"]
    assert {"type": "string", "minLength": 1, "maxLength": 10} in task["anyOf"]


# --------------------------------------------------------------------------- other paths


def test_unknown_paths_and_methods_get_the_json_error_body(http: httpx.Client) -> None:
    missing = _error(http.get("/v1/nope"), 404, "not_found")
    assert "/v1/nope" in missing["message"]
    wrong = http.delete("/v1/runs")
    _error(wrong, 405, "method_not_allowed")
    assert wrong.headers["allow"] == "GET, HEAD, POST"
