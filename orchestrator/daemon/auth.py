"""Bearer-token authentication: tokens from the environment, compared in constant time.

``daemon.token_env`` names an environment variable holding one or more tokens separated by
commas. With none, every request is let through (the daemon binds to loopback by default).
``/healthz``, ``/readyz`` and the OpenAPI document are always open; ``/metrics`` is open
unless ``daemon.metrics_auth``. Tokens are never logged, and a refusal never says which part
of a token was wrong.

Tokens are compared as bytes: a configured token is its UTF-8 encoding, a presented one the
header's bytes as they came over the wire, so a token in any script authenticates.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from typing import Final

__all__ = ["OPEN_PATHS", "OPERATOR_PATHS", "Authenticator"]

OPEN_PATHS: Final = frozenset({"/healthz", "/readyz", "/v1/openapi.json"})
OPERATOR_PATHS: Final = frozenset({"/v1/replay"})
"""Paths that check the operator's tokens themselves (``daemon.operator_token_env``)."""


class Authenticator:
    """Decides whether a request's ``Authorization`` header is acceptable for a path."""

    def __init__(self, tokens: tuple[str, ...], *, metrics_auth: bool) -> None:
        # surrogateescape: a variable that is not UTF-8 keeps its bytes, as os.environb has them
        self._tokens = tuple(token.encode("utf-8", "surrogateescape") for token in tokens)
        self._metrics_auth = metrics_auth

    @classmethod
    def from_environment(
        cls, token_env: str, *, metrics_auth: bool, environ: Mapping[str, str] | None = None
    ) -> Authenticator:
        raw = (os.environ if environ is None else environ).get(token_env, "")
        tokens = tuple(token.strip() for token in raw.split(",") if token.strip())
        return cls(tokens, metrics_auth=metrics_auth)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def needs_token(self, path: str) -> bool:
        if not self._tokens or path in OPEN_PATHS or path in OPERATOR_PATHS:
            return False
        return path != "/metrics" or self._metrics_auth

    def accepts(self, authorization: bytes | str | None) -> bool:
        """``True`` for ``Bearer <one of the tokens>``; every token is compared, always.

        ``authorization`` is the header's raw bytes, or the text an ASGI framework makes of
        them (latin-1, byte for byte, as Starlette's ``request.headers`` does).
        """
        if authorization is None:
            return False
        if isinstance(authorization, str):
            try:
                authorization = authorization.encode("latin-1")
            except UnicodeEncodeError:  # not a header's text: no byte string it could be
                return False
        scheme, _, presented = authorization.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        given = presented.strip()
        matches = [hmac.compare_digest(given, token) for token in self._tokens]
        return any(matches)
