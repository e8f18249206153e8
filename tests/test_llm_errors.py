"""Error classification (every server shape of ecosystem §4.4) and the retry policy."""

from __future__ import annotations

import random
from typing import Any

import httpx2
import openai
import pytest

from actors.llm.errors import (
    Failure,
    IncompleteStream,
    classify,
    is_context_overflow,
    parse_retry_after,
)
from actors.llm.retry import RetryPolicy

REQUEST = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")


def status_error(status: int, body: Any, headers: dict[str, str] | None = None) -> openai.APIError:
    """The error the SDK raises for ``status`` with ``body`` (it unwraps ``{"error": …}``)."""
    response = httpx2.Response(status, json=body, headers=headers, request=REQUEST)
    data = body.get("error", body) if isinstance(body, dict) else body
    return openai.APIStatusError(f"Error code: {status}", response=response, body=data)


OVERFLOWS = {
    "openai": (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 8227 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    ),
    "deepseek": (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 131072 tokens. However, you "
                "requested 131134 tokens (122942 in the messages, 8192 in the completion).",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_request_error",
            }
        },
    ),
    "vllm_old": (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 32768 tokens. However, you "
            "requested 41648 tokens (37552 in the messages, 4096 in the completion).",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    "vllm": (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 32768 tokens.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        },
    ),
    "llama_cpp": (
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 14429,
                "n_ctx": 8192,
            }
        },
    ),
    "llama_cpp_first": (
        500,
        {
            "error": {
                "code": 500,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
            }
        },
    ),
    "proxy_413": (413, "<html>Request Entity Too Large</html>"),
    "prompt_too_long_422": (422, {"error": {"message": "prompt is too long: 210000 tokens"}}),
}


@pytest.mark.parametrize("shape", sorted(OVERFLOWS))
def test_context_overflow_in_every_shape(shape: str) -> None:
    status, body = OVERFLOWS[shape]
    failure = classify(status_error(status, body), streaming=False)
    assert failure.kind == "context_length"
    assert failure.status == status
    assert not failure.retryable


def test_the_message_is_the_servers_own() -> None:
    status, body = OVERFLOWS["deepseek"]
    failure = classify(status_error(status, body), streaming=False)
    assert failure.message.startswith("This model's maximum context length is 131072")


def err(message: str, **fields: str) -> dict[str, Any]:
    return {"error": {"message": message, **fields}}


@pytest.mark.parametrize(
    ("status", "body", "kind", "retryable"),
    [
        (400, err("messages: invalid role", code="invalid_value"), "bad_request", False),
        (404, err("model not found"), "bad_request", False),
        (401, err("Incorrect API key"), "auth", False),
        (402, err("Insufficient Balance"), "auth", False),
        (403, err("forbidden"), "auth", False),
        (429, err("Rate limit reached", code="rate_limit_exceeded"), "rate_limited", True),
        (429, err("quota", type="insufficient_quota"), "rate_limited", False),
        (500, err("boom", type="server_error"), "server_error", True),
        (503, err("Server overloaded", code="server_is_overloaded"), "server_error", True),
        (500, err("maximum context length is 10"), "server_error", True),
        (408, err("timeout"), "timeout", True),
        (409, err("lock"), "server_error", True),
    ],
)
def test_status_classification(status: int, body: Any, kind: str, retryable: bool) -> None:
    failure = classify(status_error(status, body), streaming=False)
    assert (failure.kind, failure.retryable, failure.status) == (kind, retryable, status)


def test_429_carries_its_retry_after() -> None:
    error = status_error(429, {"error": {"message": "slow down"}}, {"retry-after": "7"})
    assert classify(error, streaming=False).retry_after == 7.0
    error = status_error(429, {"error": {}}, {"retry-after-ms": "250", "retry-after": "7"})
    assert classify(error, streaming=False).retry_after == 0.25


def test_transport_failures() -> None:
    assert classify(openai.APITimeoutError(REQUEST), streaming=True).kind == "timeout"
    connection = openai.APIConnectionError(request=REQUEST)
    assert classify(connection, streaming=False) == Failure(
        "connection", "Connection error.", None, None, True
    )
    assert classify(connection, streaming=True).kind == "stream"  # the stream broke mid-way


def test_error_frame_mid_stream() -> None:
    frame = openai.APIError("overloaded", REQUEST, body={"message": "overloaded", "type": "x"})
    assert classify(frame, streaming=True) == Failure("stream", "overloaded", None, None, True)
    overflow = openai.APIError(
        "too long", REQUEST, body={"message": "This model's maximum context length is 4096"}
    )
    assert classify(overflow, streaming=True).kind == "context_length"


def test_anything_else_is_a_broken_stream() -> None:
    assert classify(ValueError("bad json"), streaming=True).kind == "stream"
    assert classify(IncompleteStream("no finish"), streaming=True) == Failure(
        "stream", "no finish", None, None, True
    )


def test_is_context_overflow_needs_an_overflow_status_for_the_message() -> None:
    message = "This model's maximum context length is 4096 tokens"
    assert is_context_overflow(400, None, None, message)
    assert not is_context_overflow(429, None, None, "too many tokens per minute")
    assert not is_context_overflow(401, "context_length_exceeded", None, "")
    assert not is_context_overflow(400, "invalid_value", None, "bad role")


def test_parse_retry_after() -> None:
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "2.5"}) == 2.5
    assert parse_retry_after({"retry-after": "-3"}) == 0.0
    assert parse_retry_after({"retry-after-ms": "nonsense", "retry-after": "1"}) == 1.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert parse_retry_after({"retry-after": date}, now=1445412480.0 - 30) == 30.0


# --------------------------------------------------------------------------- retry policy


def policy(**overrides: Any) -> RetryPolicy:
    settings: dict[str, Any] = {
        "max_attempts": 4,
        "backoff_base": 0.5,
        "backoff_cap": 8.0,
        "retry_after_cap": 60.0,
        "rng": random.Random(7),
    }
    settings.update(overrides)
    return RetryPolicy(**settings)


SERVER_ERROR = Failure("server_error", "boom", 500, None, True)


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    p = policy()
    for failures, full in [(1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (9, 8.0)]:
        delay = p.backoff(failures)
        assert 0.75 * full <= delay <= full


def test_retries_until_max_attempts() -> None:
    p = policy()
    assert [p.decide(SERVER_ERROR, failures=n, remaining=100).retry for n in (1, 2, 3, 4)] == [
        True,
        True,
        True,
        False,
    ]


def test_not_retryable_gives_up_at_once() -> None:
    decision = policy().decide(Failure("context_length", "x"), failures=1, remaining=100)
    assert not decision.retry


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    p = policy(retry_after_cap=10.0)
    ok = p.decide(SERVER_ERROR._replace(retry_after=3.0), failures=1, remaining=100)
    assert ok == (True, 3.0, "")
    too_long = p.decide(SERVER_ERROR._replace(retry_after=600.0), failures=1, remaining=100)
    assert not too_long.retry
    assert "exceeds the cap" in too_long.reason


def test_no_wait_past_the_deadline() -> None:
    decision = policy().decide(SERVER_ERROR._replace(retry_after=5.0), failures=1, remaining=2.0)
    assert not decision.retry
    assert "deadline" in decision.reason
