"""Classify a failed model call into a :data:`bus.ModelErrorKind`, by status *and* message.

Context overflow is recognised in every shape of ecosystem.md §4.4 (OpenAI, DeepSeek,
vLLM old and new, llama.cpp, a 413 from a proxy) and is never retried by the caller: the
context gatekeeper owns it. Exception tree handled (openai 3.x)::

    APIError                      error frame mid-stream           -> stream (or context_length)
    ├── APIStatusError            4xx / 5xx                        -> by status and body
    ├── APIResponseValidationError                                 -> stream
    └── APIConnectionError        before the response / mid-stream -> connection / stream
        └── APITimeoutError                                        -> timeout
    IncompleteStream              ended without a finish reason    -> stream
    anything else while reading the stream                         -> stream
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from typing import Final, NamedTuple

import openai

from bus import ModelErrorKind

__all__ = [
    "RETRYABLE",
    "Failure",
    "IncompleteStream",
    "classify",
    "is_context_overflow",
    "parse_retry_after",
]

RETRYABLE: Final[frozenset[ModelErrorKind]] = frozenset(
    {"rate_limited", "server_error", "timeout", "connection", "stream"}
)
"""Kinds worth another attempt (unless the failure says otherwise)."""

MESSAGE_LIMIT: Final = 500
"""Longest error message carried on the bus (characters)."""

_OVERFLOW_CODES: Final = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_OVERFLOW_STATUSES: Final = frozenset({400, 413, 422})
_OVERFLOW_MESSAGE: Final = re.compile(
    r"maximum context length|context (?:window|size|length)|too many tokens"
    r"|exceeds the available context|prompt is too long",
    re.IGNORECASE,
)
_NO_RETRY_CODES: Final = frozenset({"insufficient_quota"})


class IncompleteStream(Exception):
    """The response ended before the model said why it stopped (no ``finish_reason``)."""


class Failure(NamedTuple):
    """A classified failure: what to publish and whether another attempt may help."""

    kind: ModelErrorKind
    message: str
    status: int | None = None
    retry_after: float | None = None
    retryable: bool = False


def is_context_overflow(
    status: int | None, code: str | None, type_: str | None, message: str
) -> bool:
    """Whether an error says the prompt did not fit (§4.4). ``status`` None: a stream frame."""
    if status == 413:
        return True
    if status is not None and status not in _OVERFLOW_STATUSES and status < 500:
        return False
    if code in _OVERFLOW_CODES or type_ == "exceed_context_size_error":
        return True
    # A 5xx only counts with an explicit code (llama.cpp's first version answered 500).
    return (status is None or status < 500) and bool(_OVERFLOW_MESSAGE.search(message))


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms``, or ``retry-after`` (seconds or an HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(float(raw_ms) / 1000.0, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _body_fields(exc: openai.APIError) -> tuple[str | None, str | None, str]:
    """``code``, ``type`` and the server's own message (the SDK's is "Error code: N - …")."""
    body = exc.body
    message = exc.message
    if isinstance(body, Mapping):
        inner = body.get("message")
        if isinstance(inner, str) and inner:
            message = inner
    elif isinstance(body, str) and body:
        message = body
    return exc.code, exc.type, message[:MESSAGE_LIMIT]


def _status_failure(exc: openai.APIStatusError) -> Failure:
    status = exc.status_code
    code, type_, message = _body_fields(exc)
    if is_context_overflow(status, code, type_, message):
        return Failure("context_length", message, status)
    if status == 429:
        retry_after = parse_retry_after(exc.response.headers)
        retryable = code not in _NO_RETRY_CODES and type_ not in _NO_RETRY_CODES
        return Failure("rate_limited", message, status, retry_after, retryable)
    if status >= 500 or status == 409:
        retry_after = parse_retry_after(exc.response.headers)
        return Failure("server_error", message, status, retry_after, True)
    if status == 408:
        return Failure("timeout", message, status, None, True)
    if status in (401, 402, 403):
        return Failure("auth", message, status)
    return Failure("bad_request", message, status)


def classify(exc: BaseException, *, streaming: bool) -> Failure:
    """Classify ``exc``; ``streaming`` is true once the response headers had arrived."""
    match exc:
        case openai.APIStatusError():
            return _status_failure(exc)
        case openai.APITimeoutError():
            return Failure("timeout", "request timed out", None, None, True)
        case openai.APIConnectionError():
            kind: ModelErrorKind = "stream" if streaming else "connection"
            detail = f"{exc.message} ({exc.__cause__!r})" if exc.__cause__ else exc.message
            return Failure(kind, detail[:MESSAGE_LIMIT], None, None, True)
        case openai.APIError():
            code, type_, message = _body_fields(exc)
            if is_context_overflow(None, code, type_, message):
                return Failure("context_length", message)
            return Failure("stream", message, None, None, True)
        case IncompleteStream():
            return Failure("stream", str(exc), None, None, True)
        case _:
            return Failure("stream", f"malformed stream: {exc!r}"[:MESSAGE_LIMIT], None, None, True)
