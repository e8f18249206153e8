"""Classify a failed model call into a :data:`bus.ModelErrorKind`, by status *and* message.

Context overflow is recognised in every shape of ecosystem.md §4.4 (OpenAI, DeepSeek,
vLLM old and new, llama.cpp, a 413 from a proxy) and is never retried by the caller: the
context gatekeeper owns it. A request the server refuses as invalid is ``bad_request`` and
never retried, whatever the status: a 4xx that is not an overflow, auth or rate limit, and
a 5xx whose body says the request itself is invalid (:func:`says_request_invalid`: a
validation dump about the request, as llama-cpp-python answers ``content: null`` with a 500;
an ``invalid_request_error``). Exception tree handled (openai 3.x)::

    APIError                      error frame mid-stream           -> stream (or context_length)
    ├── APIStatusError            4xx / 5xx                        -> by status and body
    ├── APIResponseValidationError                                 -> stream
    └── APIConnectionError        before the response / mid-stream -> connection / stream
        └── APITimeoutError                                        -> timeout
    IncompleteStream              ended without a finish reason    -> stream
    anything else while reading the stream                         -> stream
"""

from __future__ import annotations

import contextlib
import email.utils
import time
from collections.abc import Mapping
from typing import Final, NamedTuple

import openai
import re2

from bus import ModelErrorKind

__all__ = [
    "Failure",
    "IncompleteStream",
    "classify",
    "clip",
    "is_context_overflow",
    "parse_retry_after",
    "says_request_invalid",
]

MESSAGE_LIMIT: Final = 500
"""Longest error message carried on the bus (characters)."""

SCAN_LIMIT: Final = 20_000
"""Characters of an error body read for its meaning (a validation dump's entries)."""

_OVERFLOW_CODES: Final = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_OVERFLOW_STATUSES: Final = frozenset({400, 413, 422})
# RE2 (linear time): an endpoint's error body is not ours.
_OVERFLOW_MESSAGE: Final = re2.compile(
    r"(?i)maximum context length|context (?:window|size|length)|too many tokens"
    r"|exceeds the available context|prompt is too long"
)
_NO_RETRY_CODES: Final = frozenset({"insufficient_quota"})
_INVALID_REQUEST: Final = "invalid_request_error"
# A pydantic / FastAPI validation dump ("7 validation errors:", "1 validation error for
# CreateChatCompletionRequest") about the request: an entry located in the request's body,
# query, path or headers, or a model named ...Request.
_DUMP: Final = re2.compile(r"\b\d+ validation errors?\b")
_REQUEST_LOCATION: Final = re2.compile(
    r"""['"]loc['"]:\s*[(\[]\s*['"](?:body|query|path|header)['"]"""
    r"|validation errors? for \w*Request\b"
)
# One entry of a dump printed as Python reprs: {'type': ..., 'loc': (...), 'msg': ...}.
_ENTRY: Final = re2.compile(
    r"""\{'type': '(?P<type>[^']*)', 'loc': \((?P<loc>[^)]*)\), 'msg': """
    r"""(?P<msg>'[^']*'|"[^"]*")"""
)
_LOC_PART: Final = re2.compile(r"""'([^']*)'|"([^"]*)"|(-?\d+)""")
_UNION_TAGS: Final = frozenset({"role", "type"})


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
        with contextlib.suppress(ValueError):
            return max(float(raw_ms) / 1000.0, 0.0)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    with contextlib.suppress(ValueError):
        return max(float(raw), 0.0)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` on one line, at most ``limit`` characters: cut at a word boundary (a word
    longer than a fifth of the limit is cut where it stands), an ellipsis marking the cut."""
    line = " ".join(text[: limit * 4].split()) if len(text) > limit or "\n" in text else text
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit * 4 // 5:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def says_request_invalid(code: str | None, type_: str | None, message: str) -> bool:
    """Whether an error body says the request itself is invalid, so no retry can pass: an
    ``invalid_request_error`` (type or code), or a validation dump about the request
    (pydantic / FastAPI, e.g. llama-cpp-python's 500 to ``"content": null``). What decides
    a 5xx: one that says anything else (an overloaded or crashed server) is retried."""
    if _INVALID_REQUEST in (code, type_):
        return True
    head = message[:SCAN_LIMIT]
    return bool(_DUMP.search(head) and _REQUEST_LOCATION.search(head))


def _validation_summary(message: str) -> str | None:
    """A validation dump printed as Python reprs, as ``N validation errors: loc: msg; …``.

    Entries of the members of a union whose ``role``/``type`` did not match are left out
    (pydantic reports every member: for an assistant message with ``content: null`` only the
    assistant member's ``content`` entry says what is wrong); all are kept if none matched.
    """
    head = message[:SCAN_LIMIT]
    count = _DUMP.search(head)
    entries: list[tuple[str, tuple[str, ...], str]] = []
    for found in _ENTRY.finditer(head):
        loc = tuple(
            next(part for part in match.groups() if part is not None)
            for match in _LOC_PART.finditer(found.group("loc"))
        )
        entries.append((found.group("type"), loc, found.group("msg")[1:-1]))
    if count is None or not entries:
        return None
    return f"{count.group()}: {_render_entries(entries)}"


def _detail_summary(detail: object) -> str | None:
    """FastAPI's 422 body ``{"detail": [{"type", "loc", "msg"}, …]}`` rendered alike."""
    if not isinstance(detail, list) or not detail:
        return None
    entries: list[tuple[str, tuple[str, ...], str]] = []
    for item in detail[:50]:
        if not isinstance(item, Mapping):
            return None
        loc = item.get("loc")
        parts = tuple(str(p) for p in loc) if isinstance(loc, (list, tuple)) else ()
        entries.append((str(item.get("type", "")), parts, str(item.get("msg", ""))))
    count = len(detail)
    return f"{count} validation error{'s' if count != 1 else ''}: {_render_entries(entries)}"


def _render_entries(entries: list[tuple[str, tuple[str, ...], str]]) -> str:
    unmatched = {
        loc[:-1]
        for kind, loc, _ in entries
        if kind == "literal_error" and loc[-1:] and loc[-1] in _UNION_TAGS
    }
    kept = [entry for entry in entries if entry[1][:-1] not in unmatched] or entries
    located = [(".".join(loc[1:] if loc[:1] == ("body",) else loc), msg) for _, loc, msg in kept]
    return "; ".join(dict.fromkeys(f"{where}: {msg}" if where else msg for where, msg in located))


def _body_fields(exc: openai.APIError) -> tuple[str | None, str | None, str]:
    """``code``, ``type`` and the server's own message (the SDK's is "Error code: N - …"),
    whole: :func:`clip` cuts it for the bus."""
    body = exc.body
    message = exc.message
    if isinstance(body, Mapping):
        inner = body.get("message")
        if isinstance(inner, str) and inner:
            message = inner
        else:
            message = _detail_summary(body.get("detail")) or message
    elif isinstance(body, str) and body:
        message = body
    return exc.code, exc.type, message


def _status_failure(exc: openai.APIStatusError) -> Failure:
    status = exc.status_code
    code, type_, whole = _body_fields(exc)
    message = clip(whole)
    if is_context_overflow(status, code, type_, whole[:SCAN_LIMIT]):
        return Failure("context_length", message, status)
    if status == 429:
        retry_after = parse_retry_after(exc.response.headers)
        retryable = code not in _NO_RETRY_CODES and type_ not in _NO_RETRY_CODES
        return Failure("rate_limited", message, status, retry_after, retryable)
    if status == 409 or (status >= 500 and not says_request_invalid(code, type_, whole)):
        retry_after = parse_retry_after(exc.response.headers)
        return Failure("server_error", message, status, retry_after, True)
    if status == 408:
        return Failure("timeout", message, status, None, True)
    if status in (401, 402, 403):
        return Failure("auth", message, status)
    # Refused as invalid: never retried; the message quotes the server (a dump summarised).
    reason = _validation_summary(whole) or whole
    refused = f"the server refused the request as invalid (HTTP {status}): {reason}"
    return Failure("bad_request", clip(refused), status)


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
            return Failure(kind, clip(detail), None, None, True)
        case openai.APIError():
            code, type_, whole = _body_fields(exc)
            message = clip(whole)
            if is_context_overflow(None, code, type_, whole[:SCAN_LIMIT]):
                return Failure("context_length", message)
            return Failure("stream", message, None, None, True)
        case IncompleteStream():
            return Failure("stream", clip(str(exc)), None, None, True)
        case _:
            return Failure("stream", clip(f"malformed stream: {exc!r}"), None, None, True)
