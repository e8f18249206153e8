"""The docs tables generated from the config types and the run settings' declaration:
``docs/security.md``'s ("Bounded configuration"), ``docs/scenarios.md``'s (``[config]``) and
``docs/truncation-and-cache.md``'s (the cache's keys).
``python -m tests.config_docs`` prints them (a test compares). A tool for the docs, not
part of the product."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Collection, Iterator
from typing import Final

import msgspec
import msgspec.inspect as mi

from actors.loop import LoopConfig
from orchestrator.config import RUN_KEYS, Config, ContextSettings, RunSettings
from orchestrator.config_ranges import NumericRange, children, node_range, number_text, range_at

__all__ = [
    "config_roots",
    "doc_tables",
    "notation",
    "numeric_ranges",
    "range_table",
    "run_keys_table",
]

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


def run_keys_table(keys: Collection[str] = RUN_KEYS) -> str:
    """A table of the run's ``keys`` (all: ``docs/scenarios.md``'s), from :data:`RUN_KEYS`."""
    lines = [
        "| key | default | range | a request may set it | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    info = mi.type_info(RunSettings)
    assert isinstance(info, mi.StructType)
    own = {field.name: field for field in info.fields}
    for key in keys:
        run = RUN_KEYS[key]
        if run.default:
            value = functools.reduce(getattr, run.default.split("."), Config())
            default = f"`{run.default}` ({_value(value)})"
        else:
            field = own[key]
            default = _value(
                field.default_factory() if field.default is msgspec.NODEFAULT else field.default
            )
        bounds = range_at(RunSettings, key)
        inequality = notation(bounds) if bounds is not None else ""
        who = f"no ({run.never})" if run.never else _WHO[run.client]
        who += ", up to a ceiling" if run.ceiling else ""
        lines.append(f"| `{key}` | {default} | {inequality} | {who} | {run.doc} |")
    return "\n".join(lines)


def _doc_lines(kind: type) -> dict[str, str]:
    """Each field's doc line: the docstring after it in the class body, on one line."""
    body = ast.parse(textwrap.dedent(inspect.getsource(kind))).body[0]
    assert isinstance(body, ast.ClassDef)
    lines: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            lines[node.target.id] = " ".join(str(after.value.value).split()).replace("``", "`")
    return lines


def section_table(kind: type[msgspec.Struct]) -> str:
    """A config section's keys: default, range and doc line, from its declaration."""
    lines = ["| key | default | range | meaning |", "| --- | --- | --- | --- |"]
    docs = _doc_lines(kind)
    for field in msgspec.structs.fields(kind):
        value = field.default_factory() if field.default is msgspec.NODEFAULT else field.default
        bounds = range_at(kind, field.name)
        inequality = notation(bounds) if bounds is not None else ""
        doc = docs.get(field.name, "")
        lines.append(f"| `{field.name}` | {_value(value)} | {inequality} | {doc} |")
    return "\n".join(lines)


CACHE_KEYS: Final = tuple(key for key in RUN_KEYS if "cache" in key)


def generated_tables() -> dict[str, list[str]]:
    """The generated tables of each docs page (a test checks each page holds them)."""
    return {
        "security.md": doc_tables(),
        "scenarios.md": [run_keys_table()],
        "truncation-and-cache.md": [run_keys_table(CACHE_KEYS)],
        "context.md": [section_table(ContextSettings)],
    }


def range_table(kind: type[msgspec.Struct], prefix: str = "") -> str:
    """A Markdown table of every numeric key of ``kind``, named under ``prefix``."""
    lines = ["| key | range | or null |", "| --- | --- | --- |"]
    for found in numeric_ranges(kind, prefix):
        nullable = "yes" if found.nullable else ""
        lines.append(f"| `{found.key}` | {notation(found)} | {nullable} |")
    return "\n".join(lines)


def notation(found: NumericRange) -> str:
    """As an inequality, for tables: ``1 ≤ n ≤ 100``, ``0 < x ≤ 86,400``."""
    var = "n" if found.kind == "integer" else "x"
    left = ""
    if found.ge is not None:
        left = f"{number_text(found.ge)} ≤ "
    elif found.gt is not None:
        left = f"{number_text(found.gt)} < "
    right = ""
    if found.le is not None:
        right = f" ≤ {number_text(found.le)}"
    elif found.lt is not None:
        right = f" < {number_text(found.lt)}"
    return f"{left}{var}{right}"


def _walk(node: mi.Type, key: str) -> Iterator[NumericRange]:
    found = node_range(node, key)
    if found is not None:
        yield found
        return
    for part, child in children(node):
        yield from _walk(child, f"{key}.{part}" if key else part)


def numeric_ranges(kind: type[msgspec.Struct], prefix: str = "") -> list[NumericRange]:
    """Every numeric key of ``kind`` (nested sections, array items as ``N``, table values
    as ``<name>``), named under ``prefix``, in declaration order."""
    return list(_walk(mi.type_info(kind), prefix))


if __name__ == "__main__":
    for page, tables in generated_tables().items():
        print(f"<!-- docs/{page} -->", *tables, sep="\n\n", end="\n\n")
