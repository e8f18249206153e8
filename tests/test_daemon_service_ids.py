"""Run and trace ids (:mod:`orchestrator.daemon.ids`): what ``uuid.uuid4().hex`` gave, cut
from a block of ``os.urandom``: the same form, never repeated, across threads and forks, and
what the daemon answers with."""

from __future__ import annotations

import os
import re
import threading
import uuid
import warnings
from pathlib import Path

import httpx
import pytest

from orchestrator.daemon import open_daemon
from orchestrator.daemon.ids import IDS_PER_BLOCK, new_id
from tests.daemon_support import daemon_config

HEX_ID = re.compile(r"[0-9a-f]{32}")
MANY = 20 * IDS_PER_BLOCK + 7  # across many blocks, ending inside one


def assert_uuid4_hex(value: str) -> None:
    assert HEX_ID.fullmatch(value), value
    parsed = uuid.UUID(hex=value)
    assert parsed.version == 4, value
    assert parsed.variant == uuid.RFC_4122, value
    assert parsed.hex == value


def test_ids_are_version_4_uuids_in_lowercase_hex() -> None:
    for _ in range(MANY):
        assert_uuid4_hex(new_id())


def test_ids_never_repeat_and_every_free_digit_varies() -> None:
    ids = [new_id() for _ in range(MANY)]
    assert len(set(ids)) == len(ids)
    # Only the version digit (12) is fixed, and the variant digit (16) is one of 8, 9, a, b:
    # a block cut wrong (an offset that does not move, bytes reused) would fix others too.
    for position in range(32):
        digits = {value[position] for value in ids}
        if position == 12:
            assert digits == {"4"}
        elif position == 16:
            assert digits == set("89ab")
        else:
            assert len(digits) == 16, (position, digits)


def test_threads_drawing_at_once_never_get_the_same_id() -> None:
    drawn: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(len(drawn))

    def draw(into: list[str]) -> None:
        start.wait()
        into.extend(new_id() for _ in range(5 * IDS_PER_BLOCK))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [value for into in drawn for value in into]
    assert len(every) == len(drawn) * 5 * IDS_PER_BLOCK
    assert len(set(every)) == len(every)


def test_a_forked_child_does_not_hand_out_its_parent_s_next_ids() -> None:
    """The parent has a block in hand (one id drawn from it); a child forked now must not
    draw the ids the parent draws next."""
    new_id()
    count = IDS_PER_BLOCK  # the rest of the parent's block, and one more
    read, write = os.pipe()
    with warnings.catch_warnings():  # pytest's own threads: the child only draws and writes
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child
        status = 1
        try:
            os.close(read)
            os.write(write, "".join(new_id() for _ in range(count)).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    parent = [new_id() for _ in range(count)]
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    child = [text[i : i + 32] for i in range(0, len(text), 32)]
    assert len(child) == count
    for value in child:
        assert_uuid4_hex(value)
    assert not set(child) & set(parent)


@pytest.mark.asyncio
async def test_the_daemon_answers_with_such_ids_or_the_caller_s_trace(tmp_path: Path) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        plain = [(await http.post("/v1/runs", json={"scenario": "completed"})) for _ in range(3)]
        traced = await http.post(
            "/v1/runs",
            json={"scenario": "completed"},
            headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"},
        )
    for response in (*plain, traced):
        assert response.status_code == 202, response.text
        assert_uuid4_hex(response.json()["id"])
    for response in plain:
        assert_uuid4_hex(response.json()["trace_id"])
    assert traced.json()["trace_id"] == trace
    every = [r.json()[k] for r in plain for k in ("id", "trace_id")] + [traced.json()["id"]]
    assert len(set(every)) == len(every)
