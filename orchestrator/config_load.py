"""Loading the config: a TOML file, then ``LOOPFUSE_*`` environment overrides, then defaults.

A nested key is written ``LOOPFUSE_SECTION__KEY`` in the environment (``LOOPFUSE_BUDGET__
MAX_TURNS=5``); values are read as TOML scalars (``5``, ``true``, ``"text"``) and as plain
text otherwise. Every bad key or value fails at load time with a :class:`ConfigError` that
names the key and the reason. Secrets never live here: the API key is read from the
environment variable named by ``model.api_key_env`` when the endpoint is opened.
"""

from __future__ import annotations

import os
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import msgspec

from actors.context.policy import WINDOW_MAX
from actors.tools.mcp import INSTALL_HINT, mcp_installed
from orchestrator.config_ranges import range_at
from orchestrator.config_sections import Config, ModelCapabilities, ModelPrice
from orchestrator.errors import ConfigError

ENV_PREFIX: Final = "LOOPFUSE_"
ENV_CONFIG_FILE: Final = "LOOPFUSE_CONFIG"
ENV_NOT_CONFIG: Final = frozenset(
    {
        ENV_CONFIG_FILE,
        "LOOPFUSE_URL",
        "LOOPFUSE_TOKEN",
        "LOOPFUSE_API_TOKENS",
        "LOOPFUSE_OPERATOR_TOKENS",
    }
)
"""Variables with the prefix that are not config keys: the config file, the daemon's API
tokens (``daemon.token_env``) and the URL and token its command-line clients use."""


_S = TypeVar("_S", bound=msgspec.Struct)

_AT_PATH = re.compile(r"^(?P<reason>.*?) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


def _choices(kind: type[msgspec.Struct], key: str) -> tuple[object, ...]:
    """The values a ``Literal`` field at dotted ``key`` of ``kind`` allows (else empty)."""
    node: Any = kind
    for part in key.split("."):
        if part.isdigit() and typing.get_origin(node) is tuple:  # an item of a list
            node = typing.get_args(node)[0]
            continue
        if part not in getattr(node, "__struct_fields__", ()):
            return ()
        node = typing.get_type_hints(node)[part]
    for candidate in (node, *typing.get_args(node)):
        if typing.get_origin(candidate) is Literal:
            return typing.get_args(candidate)
    return ()


def convert(data: Mapping[str, Any], kind: type[_S], *, prefix: str, source: str) -> _S:
    """``data`` as a ``kind``; else msgspec's reason as a :class:`ConfigError` naming the
    whole key under ``prefix``, with the allowed values (a choice) or the range (a number)
    of ``kind``'s field there."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        match = _AT_PATH.match(message := str(exc))
        reason, path = (match["reason"], match["path"]) if match else (message, "")
        key = path.lstrip(".").replace("[", ".").replace("]", "")
        if unknown := _UNKNOWN.match(reason):
            key = f"{key}.{unknown['field']}" if key else unknown["field"]
            reason = "unknown key"
        if reason.startswith("Invalid enum value") and (choices := _choices(kind, key)):
            reason += f" (one of: {', '.join(repr(c) for c in choices)})"
        bounds = range_at(kind, key) if reason.startswith("Expected `") else None
        if bounds is not None and bounds.bounded:
            reason += f" ({bounds.describe()})"
        full_key = ".".join(part for part in (prefix, key) if part) or "(root)"
        raise ConfigError(full_key, reason, source=source) from None


def _apply_environment(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_CONFIG:
            continue
        parts = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            raise ConfigError(name, "malformed variable name (empty key part)", source="env")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(".".join(parts), "is not a section", source=f"env {name}")
            node = child
        try:
            node[parts[-1]] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            node[parts[-1]] = text


def load_config(
    path: str | Path | None = None, *, environ: Mapping[str, str] | None = None
) -> Config:
    """Load the config file (``path``, else ``$LOOPFUSE_CONFIG``, else none) plus the env.

    :raises ConfigError: a key is unknown or its value is invalid; names the key and why.
    """
    environ = os.environ if environ is None else environ
    path = path or environ.get(ENV_CONFIG_FILE) or None
    data: dict[str, Any] = {}
    source = "env" if path is None else str(path)
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError("(file)", "file not found", source=source) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("(file)", f"not valid TOML: {exc}", source=source) from None
    _apply_environment(data, environ)
    _check_context_windows(data.get("context"), source=source)
    _check_each(data.get("prices"), ModelPrice, "prices", source=source)
    _check_each(data.get("models"), ModelCapabilities, "models", source=source)
    config = convert(data, Config, prefix="", source=source)
    if config.mcp.servers and not mcp_installed():
        raise ConfigError("mcp.servers", INSTALL_HINT, source=source)
    return config


def _check_each(tables: Any, kind: type[msgspec.Struct], section: str, *, source: str) -> None:
    """Check each ``[section."<model>"]`` table alone, so an error names its model."""
    if isinstance(tables, Mapping):
        for model, table in tables.items():
            convert(table, kind, prefix=f'{section}."{model}"', source=source)


def _check_context_windows(context: Any, *, source: str) -> None:
    """Check ``[context.windows]`` entry by entry, so an error names its model."""
    windows = context.get("windows") if isinstance(context, Mapping) else None
    if not isinstance(windows, Mapping):
        return
    for model, window in windows.items():
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= WINDOW_MAX:
            raise ConfigError(
                f'context.windows."{model}"',
                f"must be a whole number of tokens, at least 1 and at most {WINDOW_MAX:,} "
                f"(got {window!r})",
                source=source,
            )
