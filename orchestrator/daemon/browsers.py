"""Browsers as clients: what keeps another site's page out of a daemon on loopback.

A page on any site can make the browser send a "simple" cross-site POST to the daemon
without a preflight, and a site whose DNS name is rebound to 127.0.0.1 is served as if it
were the daemon's own. Three checks answer both, before any route or token check
(``docs/security.md``, Browsers as clients):

* **Host**: the ``Host`` header must name the daemon (``localhost``, an IP address,
  ``daemon.host`` or one of ``daemon.allowed_hosts``), else ``400 bad_host``.
* **Content type**: a POST that says what it carries must say ``application/json``, and
  ``POST /v1/runs`` must say it: else ``415 unsupported_media_type`` (cross-site JSON needs
  a CORS preflight, which the daemon does not grant).
* **CORS**: no ``Access-Control-*`` header unless ``daemon.cors_origins`` names the origins.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.types import Scope

from orchestrator.config import Config
from orchestrator.daemon.errors import ApiError

__all__ = [
    "LOOPBACK_NAMES",
    "HostCheck",
    "add_cors",
    "browser_refusal",
    "content_type_refusal",
    "host_name",
]

LOOPBACK_NAMES: Final = frozenset({b"localhost", b"127.0.0.1", b"[::1]"})
"""``Host`` names always served (with any port, or none)."""
_JSON: Final = b"application/json"


def host_name(value: bytes) -> bytes | None:
    """The name of a ``Host`` header value, lowercased, without its port (``[::1]:80`` →
    ``[::1]``); ``None`` if it is not ``name``, ``name:port`` or ``[v6]:port``."""
    value = value.strip().lower()
    if value.startswith(b"["):
        end = value.find(b"]")
        name, rest = value[: end + 1], value[end + 1 :]
        if end < 0 or (rest and not rest.startswith(b":")):
            return None
        port = rest[1:]
    else:
        name, _, port = value.partition(b":")
    if not name or (port and not port.isdigit()) or b":" in port:
        return None
    return name


@dataclass(frozen=True, slots=True)
class HostCheck:
    """Which ``Host`` names a daemon serves (``names`` empty and ``any``: every one)."""

    names: frozenset[bytes]
    any: bool = False

    @classmethod
    def from_config(cls, config: Config) -> HostCheck:
        daemon = config.daemon
        if "*" in daemon.allowed_hosts:
            return cls(frozenset(), any=True)
        names = set(LOOPBACK_NAMES)
        bound = daemon.host.strip().lower()
        try:
            wildcard = ipaddress.ip_address(bound).is_unspecified
        except ValueError:
            wildcard = bound == ""
        if not wildcard:
            names.add(f"[{bound}]".encode() if ":" in bound else bound.encode())
        for allowed in daemon.allowed_hosts:
            name = host_name(allowed.encode() if allowed.isascii() else allowed.encode("idna"))
            if name is not None:
                names.add(name)
        return cls(frozenset(names))

    def refusal(self, values: Sequence[bytes]) -> ApiError | None:
        """Why a request with these ``Host`` header values is refused, if it is."""
        if self.any:
            return None
        name = host_name(values[0]) if len(values) == 1 else None
        if name is not None and (name in self.names or _address(name)):
            return None
        return ApiError(
            400,
            "bad_host",
            "the Host header must name this daemon (localhost, an IP address, daemon.host "
            "or one of daemon.allowed_hosts)",
            key="Host",
        )


def _address(name: bytes) -> bool:
    """Whether ``name`` is an IP address (``10.0.0.7``, ``[fe80::1]``)."""
    text = name[1:-1] if name.startswith(b"[") else name
    try:
        ipaddress.ip_address(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return False
    return True


def content_type_refusal(value: bytes | None, *, required: bool) -> ApiError | None:
    """Why a POST with this ``Content-Type`` is refused, if it is: it must be JSON when
    given, and given when ``required``."""
    if value is None and not required:
        return None
    if value is not None and value.partition(b";")[0].strip().lower() == _JSON:
        return None
    return ApiError(
        415,
        "unsupported_media_type",
        "a POST body must be JSON (Content-Type: application/json)",
        key="Content-Type",
    )


def browser_refusal(scope: Scope, hosts: HostCheck, *, body_required: bool) -> ApiError | None:
    """Why an HTTP request is refused by the ``Host`` or ``Content-Type`` check, if it is
    (``body_required``: a POST must say it carries JSON)."""
    found: list[bytes] = []
    content_type = None
    for name, value in scope["headers"]:
        if name == b"host":
            found.append(value)
        elif name == b"content-type":
            content_type = value
    refusal = hosts.refusal(found)
    if refusal is None and scope["method"] == "POST":
        refusal = content_type_refusal(content_type, required=body_required)
    return refusal


def add_cors(app: Starlette, origins: Sequence[str]) -> None:
    """Answer CORS for ``origins`` (none: add nothing, so no CORS header is ever sent)."""
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID", "traceparent"],
        )
