"""Fuzzing the daemon's HTTP API with hypothesis-generated bodies, queries and ids.

One real daemon (uvicorn on loopback, in a blocking portal's thread) takes every request.
Whatever comes in: no 5xx, the daemon keeps answering, and every refusal is a 4xx whose
JSON body is ``{"error": {"code", "message", ...}}`` with a non-empty message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import RunSettings
from orchestrator.daemon import open_daemon
from tests.daemon_support import daemon_config

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=10,
)
CONFIG_KEYS = st.sampled_from([*RunSettings.__struct_fields__, "no_such_key", ""])
REQUEST_KEYS = st.sampled_from(
    ["task", "system", "folder", "config", "scenario", "idempotency_key", "pipeline", "tsk"]
)
CONFIGS = st.dictionaries(CONFIG_KEYS, JSON, max_size=4)
REQUESTS = st.dictionaries(REQUEST_KEYS, JSON | CONFIGS, max_size=5)
SCENARIO_REQUESTS = st.fixed_dictionaries(
    {"scenario": st.sampled_from(["completed", "max_turns", "nope", ""])},
    optional={"config": CONFIGS, "idempotency_key": st.text(max_size=20) | JSON},
)
BODIES = (
    REQUESTS.map(lambda r: json.dumps(r).encode())
    | SCENARIO_REQUESTS.map(lambda r: json.dumps(r).encode())
    | JSON.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=200)
    | st.sampled_from([b"", b"NaN", b"{", b'{"task": "\\ud800"}', b"\xff\xfe{}", b"[]" * 1000])
)
IDS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="/?#%"),
    min_size=1,
    max_size=40,
)
QUERIES = st.dictionaries(
    st.sampled_from(["status", "exit_reason", "limit", "cursor", "after", "x"]),
    st.text(max_size=12) | st.integers().map(str),
    max_size=4,
)


@pytest.fixture
def daemon_url(tmp_path: Path) -> Iterator[str]:
    config = daemon_config(tmp_path, concurrent=16, queue_size=10_000, max_body_bytes=4096)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(open_daemon(config)) as running,
    ):
        yield running.url


def _refused_cleanly(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str)
        assert error["code"]
        assert isinstance(error["message"], str)
        assert error["message"].strip()


def test_fuzzed_requests_never_get_a_5xx(daemon_url: str) -> None:
    tried = {"bodies": 0, "queries": 0, "ids": 0}
    with httpx.Client(base_url=daemon_url, timeout=10) as http:

        @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
        @given(body=BODIES, content_type=st.sampled_from(["application/json", "text/plain", ""]))
        def submit(body: bytes, content_type: str) -> None:
            tried["bodies"] += 1
            headers = {"Content-Type": content_type} if content_type else {}
            _refused_cleanly(http.post("/v1/runs", content=body, headers=headers))

        @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
        @given(query=QUERIES)
        def listing(query: dict[str, str]) -> None:
            tried["queries"] += 1
            _refused_cleanly(http.get("/v1/runs", params=query))

        @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
        @given(run_id=IDS, last=st.text(max_size=10), after=st.text(max_size=10))
        def by_id(run_id: str, last: str, after: str) -> None:
            tried["ids"] += 1
            run_id = quote(run_id, safe="")
            _refused_cleanly(http.get(f"/v1/runs/{run_id}"))
            _refused_cleanly(http.post(f"/v1/runs/{run_id}/abort"))
            headers = {"Last-Event-ID": last} if last.isprintable() and last.isascii() else {}
            response = http.get(
                f"/v1/runs/{run_id}/events", params={"after": after}, headers=headers
            )
            _refused_cleanly(response)

        submit()
        listing()
        by_id()
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").status_code == 200
        listed = http.get("/v1/runs", params={"limit": 500}).json()["runs"]
    assert tried["bodies"] >= 100
    assert all(run["id"] for run in listed)
