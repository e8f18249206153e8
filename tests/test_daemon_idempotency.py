"""Idempotency keys under concurrency, the command-line client's keys, non-ASCII tokens:
through a real daemon over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from orchestrator.daemon import open_daemon
from orchestrator.daemon.auth import Authenticator
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.schemas import RunRequest
from orchestrator.daemon.store import RunRow
from tests.daemon_support import daemon_config

TOKEN = "tökén-ключ-✓"


async def post_all(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """POST every body at once, each on its own connection."""
    responses: list[httpx.Response | None] = [None] * len(bodies)
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as http:

        async def post(index: int) -> None:
            responses[index] = await http.post("/v1/runs", json=bodies[index])

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for index in range(len(bodies)):
                    tg.start_soon(post, index)
    assert all(response is not None for response in responses)
    return [response for response in responses if response is not None]


@pytest.mark.asyncio
async def test_30_concurrent_repeats_of_one_key_all_get_the_one_run(tmp_path: Path) -> None:
    body = {"scenario": "completed", "idempotency_key": "order-30"}
    async with open_daemon(daemon_config(tmp_path)) as running:
        responses = await post_all(running.url, [body] * 30)
        async with httpx.AsyncClient(base_url=running.url) as http:
            runs = (await http.get("/v1/runs")).json()["runs"]
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200] * 29 + [202], [r.text for r in responses if r.status_code >= 400]
    assert {response.json()["id"] for response in responses} == {runs[0]["id"]}
    assert len(runs) == 1


@pytest.mark.asyncio
async def test_one_key_with_two_bodies_at_once_is_one_run_and_conflicts(tmp_path: Path) -> None:
    first = {"scenario": "completed", "idempotency_key": "shared"}
    second = {"scenario": "max_turns", "idempotency_key": "shared"}
    async with open_daemon(daemon_config(tmp_path)) as running:
        responses = await post_all(running.url, [first, second] * 10)
        async with httpx.AsyncClient(base_url=running.url) as http:
            runs = (await http.get("/v1/runs")).json()["runs"]
    assert len(runs) == 1
    winner = runs[0]["request"]["scenario"]
    for body, response in zip([first, second] * 10, responses, strict=True):
        if body["scenario"] == winner:
            assert response.status_code in (200, 202), response.text
            assert response.json()["id"] == runs[0]["id"]
        else:
            assert response.status_code == 409, response.text
            error = response.json()["error"]
            assert (error["code"], error["key"]) == ("idempotency_conflict", "idempotency_key")
    assert sum(response.status_code == 202 for response in responses) == 1


@pytest.mark.asyncio
async def test_concurrent_repeats_of_a_refused_request_are_each_refused(tmp_path: Path) -> None:
    """A refused request creates no claim that its repeats would have to wait for: each is
    refused on its own."""
    body = {"task": "x", "config": {"max_turns": 10_000}, "idempotency_key": "too-much"}
    async with open_daemon(daemon_config(tmp_path)) as running:
        responses = await post_all(running.url, [body] * 10)
        async with httpx.AsyncClient(base_url=running.url) as http:
            runs = (await http.get("/v1/runs")).json()["runs"]
    assert {response.status_code for response in responses} == {422}
    assert {response.json()["error"]["key"] for response in responses} == {"config.max_turns"}
    assert runs == []


@pytest.mark.asyncio
async def test_a_repeat_whose_lookup_began_before_the_first_run_was_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request looks its key up and finds nothing; its answer is held while a
    repeat comes in and goes as far as it can: it is answered (its run committed, its claim
    on the key released) or it waits for the first. The first must still not make a second
    run with the key: a second row fails the store's commit (``idempotency_key`` is
    unique), and every request waiting for that commit would wait forever."""
    body = {"scenario": "completed", "idempotency_key": "held"}
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url, timeout=30) as http,
    ):
        store, service = running.daemon.store, running.daemon.service
        looked_up: list[str] = []
        first_looked = anyio.Event()
        release_first = anyio.Event()
        find_key, insert_run, submit = store.find_key, store.insert_run, service.submit

        async def held_find_key(key: str) -> RunRow | None:
            looked_up.append(key)
            row = await find_key(key)
            if len(looked_up) == 1:
                first_looked.set()
                await release_first.wait()
            return row

        inserted: list[str | None] = []

        def checked_insert_run(row: RunRow) -> None:
            if row.idempotency_key in inserted:  # instead of the commit failing
                raise AssertionError(f"a second run with key {row.idempotency_key!r}")
            inserted.append(row.idempotency_key)
            insert_run(row)

        submitted: list[RunRequest] = []
        repeat_submitted = anyio.Event()

        async def counted_submit(request: RunRequest, **kwargs: Any) -> tuple[RunRow, bool]:
            submitted.append(request)
            if len(submitted) == 2:
                repeat_submitted.set()  # seen once the repeat waits for something
            return await submit(request, **kwargs)

        monkeypatch.setattr(store, "find_key", held_find_key)
        monkeypatch.setattr(store, "insert_run", checked_insert_run)
        monkeypatch.setattr(service, "submit", counted_submit)
        responses: dict[str, httpx.Response] = {}
        repeat_answered = anyio.Event()

        async def post(name: str) -> None:
            responses[name] = await http.post("/v1/runs", json=body)
            if name == "repeat":
                repeat_answered.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(post, "first")
                await first_looked.wait()  # the store has no run with the key yet
                tg.start_soon(post, "repeat")
                await repeat_submitted.wait()
                # The repeat has run up to its first wait: for its own lookup (then it
                # gets its answer before the first gets its own), or for the first request.
                if len(looked_up) == 2:
                    await repeat_answered.wait()
                release_first.set()
        runs = (await http.get("/v1/runs")).json()["runs"]
    assert sorted(response.status_code for response in responses.values()) == [200, 202], [
        response.text for response in responses.values()
    ]
    assert {response.json()["id"] for response in responses.values()} == {runs[0]["id"]}
    assert len(runs) == 1


class LoseFirstAnswer(httpx.AsyncBaseTransport):
    """Delivers every request; the first POST's answer is lost as if the connection reset."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.posted: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "POST":
            self.posted.append(json.loads(request.content))
            if len(self.posted) == 1:
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("connection reset by peer", request=request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.mark.asyncio
async def test_the_client_retries_a_lost_answer_with_its_key_and_gets_the_same_run(
    tmp_path: Path,
) -> None:
    transport = LoseFirstAnswer()
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        DaemonClient(running.url, transport=transport) as client,
    ):
        accepted = await client.submit({"scenario": "completed"})
        other = await client.submit({"scenario": "completed"})
        stored = await client.run(accepted["id"])
        runs = (await client.runs())["runs"]
    first, retried, second = (body["idempotency_key"] for body in transport.posted)
    assert first == retried  # the retry of one submission reuses its key
    assert len(first) == 32
    assert second != first  # a new submission gets a new key
    assert stored["request"]["idempotency_key"] == first  # what the daemon received
    assert sorted(run["id"] for run in runs) == sorted({accepted["id"], other["id"]})
    assert accepted["id"] != other["id"]


@pytest.mark.asyncio
async def test_a_non_ascii_token_authenticates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPFUSE_TEST_TOKENS", f"plain, {TOKEN}")
    config = daemon_config(tmp_path, token_env="LOOPFUSE_TEST_TOKENS")
    raw = TOKEN.encode()
    async with open_daemon(config) as running:
        async with DaemonClient(running.url, token=TOKEN) as client:
            accepted = await client.submit({"scenario": "completed"})
        async with httpx.AsyncClient(base_url=running.url) as http:
            right = await http.get("/v1/runs", headers=[(b"Authorization", b"Bearer " + raw)])
            # The token's bytes read as latin-1 and sent as UTF-8: not the token.
            mangled = raw.decode("latin-1").encode()
            wrong = await http.get("/v1/runs", headers=[(b"Authorization", b"Bearer " + mangled)])
            cut = await http.get("/v1/runs", headers=[(b"Authorization", b"Bearer " + raw[:-1])])
    assert right.status_code == 200
    assert [run["id"] for run in right.json()["runs"]] == [accepted["id"]]
    assert wrong.status_code == cut.status_code == 401


def test_tokens_are_compared_as_bytes() -> None:
    auth = Authenticator((TOKEN, "plain"), metrics_auth=False)
    header = b"Bearer " + TOKEN.encode()
    assert auth.accepts(header)
    assert auth.accepts(header.decode("latin-1"))  # the header as Starlette decodes it
    assert auth.accepts(b"bearer plain")
    assert not auth.accepts(f"Bearer {TOKEN}")  # text that is no header's latin-1 reading
    assert not auth.accepts(b"Bearer " + TOKEN.encode()[:-1])
    assert not auth.accepts(b"Basic " + TOKEN.encode())
    assert not auth.accepts(None)
