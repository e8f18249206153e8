"""Schemathesis fuzzes the real daemon (uvicorn on loopback) from its own OpenAPI document.

For every operation of ``/v1/openapi.json``, requests that fit the document (positive) and
requests that break it (negative: wrong types, out-of-range integers, texts past
``maxLength``, unknown fields) go over HTTP; every response must be no 5xx, a status the
document lists for the operation, with the content type and body schema it lists.

Bounded and reproducible: derandomized, a fixed number of examples per operation and mode,
no example database. The daemon runs with small limits (one run at a time, a queue of one,
no folder roots, 64 KiB bodies), so what the fuzz submits is refused or is a short run on
the simulator. Run it alone with ``pytest -q tests/test_api_fuzz.py``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from orchestrator.daemon import open_daemon
from orchestrator.daemon.openapi import openapi_document
from tests.daemon_support import daemon_config

MAX_TASK_CHARS = 2_000
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES = {"POST /v1/runs": 150, "GET /v1/runs": 80, "GET /v1/runs/{id}/events": 100}
DEFAULT_EXAMPLES = 30
DOCUMENT = "GET /v1/openapi.json"  # schemathesis leaves out the document it was given
OPERATIONS = [
    f"{method.upper()} {path}"
    for path, methods in openapi_document("0", MAX_TASK_CHARS)["paths"].items()
    for method in methods
    if f"{method.upper()} {path}" != DOCUMENT
]
TAKES_INPUT = {
    label for label in OPERATIONS if "{id}" in label or label in {"POST /v1/runs", "GET /v1/runs"}
}


@pytest.fixture(scope="module")
def daemon_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp_path: Path = tmp_path_factory.mktemp("fuzz")
    config = daemon_config(
        tmp_path,
        concurrent=1,
        queue_size=1,
        max_body_bytes=65_536,
        max_task_chars=MAX_TASK_CHARS,
    )
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(open_daemon(config)) as running,
    ):
        yield running.url


@pytest.fixture(scope="module")
def ended_run(daemon_url: str) -> str:
    """A run that has ended: half the requests naming a run name this one."""
    with httpx.Client(base_url=daemon_url, timeout=30) as http:
        run_id: str = http.post("/v1/runs", json={"scenario": "completed"}).json()["id"]
        http.get(f"/v1/runs/{run_id}/events")  # returns once the run has ended
        assert http.get(f"/v1/runs/{run_id}").json()["status"] == "ended"
    return run_id


@pytest.fixture(scope="module")
def schema(daemon_url: str) -> Any:
    return schemathesis.openapi.from_url(f"{daemon_url}/v1/openapi.json")


def _operation(schema: Any, label: str) -> Any:
    for result in schema.get_all_operations():
        operation = result.ok()
        if f"{operation.method.upper()} {operation.path}" == label:
            return operation
    raise AssertionError(f"{label} is not in the served document")


def test_the_served_document_is_the_one_fuzzed(daemon_url: str, schema: Any) -> None:
    served = {
        f"{result.ok().method.upper()} {result.ok().path}" for result in schema.get_all_operations()
    }
    assert served == set(OPERATIONS)
    assert len(OPERATIONS) == 10
    document = httpx.get(f"{daemon_url}/v1/openapi.json").json()
    assert document["paths"] == openapi_document("0", MAX_TASK_CHARS)["paths"]


@pytest.mark.parametrize(
    ("label", "mode"),
    [
        *((label, GenerationMode.POSITIVE) for label in OPERATIONS),
        # only these take input that can break the document
        *((label, GenerationMode.NEGATIVE) for label in OPERATIONS if label in TAKES_INPUT),
    ],
)
def test_fuzzed_requests_get_documented_answers(
    daemon_url: str, schema: Any, ended_run: str, label: str, mode: GenerationMode
) -> None:
    operation = _operation(schema, label)
    statuses: list[int] = []

    @settings(
        max_examples=EXAMPLES.get(label, DEFAULT_EXAMPLES),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), known=st.booleans())
    def fuzz(case: Any, known: bool) -> None:
        if known and "id" in (case.path_parameters or {}):
            case.path_parameters = {**case.path_parameters, "id": ended_run}
        response = case.call_and_validate(base_url=daemon_url, checks=CHECKS, timeout=20)
        statuses.append(response.status_code)

    fuzz()
    print(label, mode, sorted(collections.Counter(statuses).items()))
    assert statuses
    assert all(status < 500 for status in statuses if label != "GET /readyz")
    if mode is GenerationMode.NEGATIVE:
        assert any(400 <= status < 500 for status in statuses), statuses
