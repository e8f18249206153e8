"""What an OpenAI-compatible server says about a model: its window and its tokenizer.

Asked once per model (the context gatekeeper starts :func:`probe` at the model's first
run, in its own task; nothing waits for it): ``GET {base_url}/models`` for a
``max_model_len`` (vLLM), then the server's own tokenizer on a sample of the run's text
(``POST {root}/extras/tokenize``, then ``POST {root}/tokenize``, ``root`` being
``base_url`` without its ``/v1``; each server's shape: ``docs/context.md``).

The base URL and key are the operator's (``[model]``), never a request's. Every request
has a time limit (:data:`TIMEOUT_SECONDS`) and a size limit on the answer
(:data:`MAX_ANSWER_BYTES`); a failure of any kind is an answer of "nothing known".
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import httpx2

from actors.context.policy import WINDOW_MAX

__all__ = [
    "MAX_ANSWER_BYTES",
    "TIMEOUT_SECONDS",
    "TOKENIZER_PATHS",
    "ServerEndpoint",
    "ServerReport",
    "probe",
]

logger = logging.getLogger("loopfuse.context")

TIMEOUT_SECONDS: Final = 5.0
"""Each probe request's time limit (connect, read, write, pool)."""
MAX_ANSWER_BYTES: Final = 4 * 1024 * 1024
"""Larger answers are not read (a tokenizer's answer to the sample is a few kilobytes)."""
TOKENIZER_PATHS: Final = ("/extras/tokenize", "/tokenize")


@dataclass(frozen=True, slots=True)
class ServerEndpoint:
    """The operator's endpoint (``model.base_url`` and its key)."""

    base_url: str
    api_key: str = ""


class ServerReport(NamedTuple):
    """What the server said (``None``: it did not say)."""

    window: int | None = None
    tokenizer: str | None = None
    """The path of the tokenizer endpoint that answered."""
    sample_tokens: int | None = None
    """How many tokens that tokenizer made of the sample."""


async def probe(endpoint: ServerEndpoint, model: str, sample: str) -> ServerReport:
    """Ask ``endpoint`` about ``model``: its window and its count of ``sample``."""
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    url = endpoint.base_url.rstrip("/")
    async with httpx2.AsyncClient(timeout=TIMEOUT_SECONDS, headers=headers) as http:
        window = await _window(http, url, model)
        bodies = (
            {"input": sample, "model": model},
            {"content": sample, "prompt": sample, "model": model},
        )
        for path, body in zip(TOKENIZER_PATHS, bodies, strict=True):
            # the tokenizer paths live at the base URL without its /v1
            answer = await _ask(http, "POST", url.removesuffix("/v1") + path, body)
            if not isinstance(answer, dict):
                continue
            tokens, count = answer.get("tokens"), answer.get("count")
            if isinstance(tokens, list) and tokens:
                return ServerReport(window, path, len(tokens))
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                return ServerReport(window, path, count)
    return ServerReport(window)


async def _window(http: httpx2.AsyncClient, base_url: str, model: str) -> int | None:
    answer = await _ask(http, "GET", base_url + "/models", None)
    entries = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == model:
            window = entry.get("max_model_len")  # a JSON integer (type(True) is bool)
            return window if type(window) is int and 1 <= window <= WINDOW_MAX else None
    return None


async def _ask(http: httpx2.AsyncClient, method: str, url: str, body: dict[str, str] | None) -> Any:
    """The JSON answer of one request, or ``None`` (any failure: not an error here)."""
    try:
        async with http.stream(method, url, json=body) as response:
            if response.status_code != 200:
                return None
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > MAX_ANSWER_BYTES:
                    return None
        return json.loads(data)
    except (httpx2.HTTPError, ValueError) as exc:
        logger.debug("probe %s %s: %s", method, url, exc)
        return None
