"""`loopfuse sim` and `loopfuse run --base-url` as real processes on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

SECRET = "sk-test-RECOGNISABLE-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def simulator() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "sim", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()  # printed once it listens
        assert base_url in banner, banner
        yield base_url
    finally:
        process.terminate()
        process.communicate(timeout=10)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OPENAI_API_KEY": SECRET,
        "LOOPFUSE_MODEL__MAX_ATTEMPTS": "2",
        "LOOPFUSE_MODEL__BACKOFF_BASE_SECONDS": "0.01",
    }
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_run_against_an_endpoint_over_http(simulator: str, tmp_path: object) -> None:
    done = run_cli("run", "--base-url", simulator, "--model", "completed", "--task", "hi", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["exit_reason"] == "completed"
    assert result["cause"] == "model.end_turn"
    assert result["llm_requests"] == 2
    assert SECRET not in done.stdout + done.stderr


def test_run_prints_an_ending_for_a_person(simulator: str) -> None:
    done = run_cli("run", "--base-url", simulator, "--model", "max_turns", "--task", "go")
    assert done.returncode == 1, done.stderr  # the run failed (docs/cli.md)
    assert "Stopped:" in done.stdout
    assert "Next:" in done.stdout
    assert SECRET not in done.stdout + done.stderr


def test_an_unreachable_endpoint_ends_the_run_with_a_reason() -> None:
    port = free_port()  # nothing listens there
    done = run_cli(
        "run", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m", "--task", "x", "--json"
    )
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert result["exit_reason"] == "aborted_streaming"
    assert result["cause"] == "model.unavailable"
    assert "connection" in result["detail"]
    assert "2 attempt" in result["detail"]


def test_the_simulator_answers_health_checks(simulator: str) -> None:
    with urllib.request.urlopen(simulator.removesuffix("/v1") + "/healthz", timeout=10) as reply:
        assert reply.status == 200
        assert json.loads(reply.read()) == {"status": "ok"}
