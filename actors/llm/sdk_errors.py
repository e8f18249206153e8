"""The ``openai`` SDK's exceptions for what the transport meets, made with their public
constructors, so :func:`actors.llm.errors.classify` reads the same exceptions whether the
SDK or loopfuse's own transport sent the request.

A 4xx/5xx becomes the SDK's class for its status (``BadRequestError`` for 400, …,
``InternalServerError`` for any 5xx, plain ``APIStatusError`` otherwise) with the message
``"Error code: N - <the server's message>"`` and the body's ``error`` object as ``body``,
as ``AsyncOpenAI`` builds them (``tests/test_llm_contract.py`` compares); a failure of the
connection is ``APITimeoutError`` (a timeout) or ``APIConnectionError``, raised ``from`` the
network error.

The ``httpx2.Request`` an exception carries names the URL and the run but not the
credentials: its ``Authorization`` and every operator header are ``***``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

import httpx2
import openai

__all__ = ["connection_error", "status_error"]

_STATUS_CLASSES: Final[dict[int, type[openai.APIStatusError]]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    403: openai.PermissionDeniedError,
    404: openai.NotFoundError,
    409: openai.ConflictError,
    422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


def status_error(
    status: int,
    headers: Sequence[tuple[bytes, bytes]],
    content: bytes,
    request: httpx2.Request,
) -> openai.APIStatusError:
    """The SDK's exception for a response with this ``status``, ``headers`` and body."""
    response = httpx2.Response(status, headers=list(headers), content=content, request=request)
    message = f"Error code: {status}"
    text = response.text.strip()
    try:
        body: object = json.loads(text)
    except ValueError:
        body = text
    data = body.get("error", body) if isinstance(body, Mapping) else body
    inner = data.get("message") if isinstance(data, Mapping) else None
    if isinstance(inner, str) and inner:
        message += f" - {inner}"
    other = openai.InternalServerError if status >= 500 else openai.APIStatusError
    return _STATUS_CLASSES.get(status, other)(message, response=response, body=data)


def connection_error(cause: BaseException, request: httpx2.Request) -> openai.APIConnectionError:
    """What the SDK raises when the connection fails (raise it ``from cause``)."""
    if isinstance(cause, TimeoutError):  # aiohttp's timeouts are TimeoutError
        return openai.APITimeoutError(request=request)
    return openai.APIConnectionError(request=request)
