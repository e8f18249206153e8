"""The docs tables generated from the config types and the run settings' declaration:
``docs/security.md``'s ("Bounded configuration") and ``docs/scenarios.md``'s (``[config]``).
``python -m tests.config_docs`` prints them (a test compares). A tool for the docs, not
part of the product."""

from __future__ import annotations

import functools

import msgspec
import msgspec.inspect as mi

from actors.loop import LoopConfig
from orchestrator.config import RUN_KEYS, Config, RunSettings
from orchestrator.config_ranges import numeric_ranges, range_at

__all__ = ["config_roots", "doc_tables", "range_table", "run_keys_table"]

_WHO: dict[str, str] = {"default": "yes", "allowed": "if allowed", "operator": "no"}


def config_roots() -> tuple[tuple[str, type[msgspec.Struct]], ...]:
    """``(prefix, type)`` of everything numeric a config or a run's config can set: the
    config file, a run's keys (``config`` of a request, ``[config]`` of a scenario), and its
    ``loop`` table."""
    return (("", Config), ("config", RunSettings), ("config.loop", LoopConfig))


def doc_tables() -> list[str]:
    """The tables of ``docs/security.md`` ("Bounded configuration"), one per root."""
    return [range_table(kind, prefix) for prefix, kind in config_roots()]


def _value(value: object) -> str:
    return "none" if value is None else f"`{msgspec.json.encode(value).decode()}`"


def run_keys_table() -> str:
    """``docs/scenarios.md``'s table of a run's keys, from :data:`RUN_KEYS`."""
    lines = [
        "| key | default | range | a request may set it | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    info = mi.type_info(RunSettings)
    assert isinstance(info, mi.StructType)
    own = {field.name: field for field in info.fields}
    for key, run in RUN_KEYS.items():
        if run.default:
            value = functools.reduce(getattr, run.default.split("."), Config())
            default = f"`{run.default}` ({_value(value)})"
        else:
            field = own[key]
            default = _value(
                field.default_factory() if field.default is msgspec.NODEFAULT else field.default
            )
        bounds = range_at(RunSettings, key)
        notation = bounds.notation() if bounds is not None else ""
        who = f"no ({run.never})" if run.never else _WHO[run.client]
        lines.append(f"| `{key}` | {default} | {notation} | {who} | {run.doc} |")
    return "\n".join(lines)


def range_table(kind: type[msgspec.Struct], prefix: str = "") -> str:
    """A Markdown table of every numeric key of ``kind``, named under ``prefix``."""
    lines = ["| key | range | or null |", "| --- | --- | --- |"]
    for found in numeric_ranges(kind, prefix):
        nullable = "yes" if found.nullable else ""
        lines.append(f"| `{found.key}` | {found.notation()} | {nullable} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join([*doc_tables(), run_keys_table()]))
