"""The docs tables generated from the config types and the run settings' declaration:
``docs/security.md``'s ("Bounded configuration"), ``docs/scenarios.md``'s (``[config]``),
``docs/truncation-and-cache.md``'s (the cache's keys), ``docs/context.md``'s
(``[context]``), ``docs/budgets.md``'s (the limits), ``docs/hooks.md``'s (a ``[[hooks]]``
entry) and ``docs/mcp.md``'s (an ``[[mcp.servers]]`` entry).
``python -m tests.config_docs`` prints them (a test compares). A tool for the docs, not
part of the product."""

from __future__ import annotations

import ast
import functools
import inspect
import operator
import textwrap
from collections.abc import Collection, Iterator
from typing import Final, NamedTuple

import msgspec
import msgspec.inspect as mi

from actors.hooks import CommandHook, PythonHook
from actors.loop import LoopConfig
from actors.tools.mcp import McpServer
from bus.causes import CAUSE_TABLE
from orchestrator.config import RUN_KEYS, Config, ContextSettings, RunSettings
from orchestrator.config_ranges import NumericRange, children, node_range, number_text, range_at

__all__ = [
    "BUDGET_LIMITS",
    "budget_table",
    "config_roots",
    "doc_tables",
    "entry_table",
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
    """Each field's doc line: the docstring after it in the class body (or a base's), on one
    line."""
    lines: dict[str, str] = {}
    for owner in reversed(kind.__mro__):
        if not issubclass(owner, msgspec.Struct) or owner is msgspec.Struct:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(owner))).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, after in zip(body.body, body.body[1:], strict=False):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                text = " ".join(str(after.value.value).split()).replace("``", "`")
                lines[node.target.id] = text
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


class BudgetLimit(NamedTuple):
    """How a ``[budget]`` key ends a run (docs/budgets.md's table derives from these)."""

    key: str
    """The ``[budget]`` key that sets the limit."""
    limit: str
    """What it limits, in words."""
    checked: str
    """When the budget monitor checks it."""
    value: str | None = None
    """The value of ``key`` that turns it on (``None``: any value but unset)."""


BUDGET_LIMITS: Final = {
    "budget.max_turns": BudgetLimit("max_turns", "turns", "when a turn ends (its tools ran)"),
    "budget.max_tool_calls": BudgetLimit(
        "max_tool_calls", "tool calls", "before the call that would exceed it"
    ),
    "budget.deadline": BudgetLimit(
        "deadline_seconds", "wall clock", "a timer, and at every turn start"
    ),
    "budget.output_tokens": BudgetLimit("max_output_tokens", "output tokens", "when a turn ends"),
    "budget.input_tokens": BudgetLimit("max_input_tokens", "input tokens", "when a turn ends"),
    "budget.cost": BudgetLimit("max_cost", "cost", "when a turn ends"),
    "budget.diminishing_returns": BudgetLimit(
        "mode", "(target mode)", "when the model ends its turn", "target"
    ),
}
"""Each ``budget.*`` cause of the cause table (``bus.causes``) with the key that sets it."""


def budget_table() -> str:
    """``docs/budgets.md``'s limits: each ``budget.*`` cause of the cause table, with the
    ``[budget]`` key that sets it (:data:`BUDGET_LIMITS`) and the run key it defaults."""
    lines = [
        "| limit | config key | run key (`[config]` of a scenario, `RunSpec.overrides`) "
        "| cause | checked |",
        "| --- | --- | --- | --- | --- |",
    ]
    run_keys = {run.default: key for key, run in RUN_KEYS.items() if run.default}
    for cause in CAUSE_TABLE:
        if not cause.startswith("budget."):
            continue
        limit = BUDGET_LIMITS[cause]
        config_key = f"budget.{limit.key}"
        value = "" if limit.value is None else f" = {_json(limit.value)}"
        lines.append(
            f"| {limit.limit} | `{config_key}{value}` | `{run_keys[config_key]}{value}` "
            f"| `{cause}` | {limit.checked} |"
        )
    return "\n".join(lines)


def _json(value: object) -> str:
    return msgspec.json.encode(value).decode()


def _type_text(node: mi.Type) -> str:
    """A setting's type for people: its declared description, else spelled from the type."""
    if isinstance(node, mi.Metadata):
        described = (node.extra_json_schema or {}).get("description")
        return str(described) if described else _type_text(node.type)
    if isinstance(node, mi.UnionType):
        return " or ".join(_type_text(t) for t in node.types if not isinstance(t, mi.NoneType))
    if isinstance(node, mi.LiteralType):
        return " \\| ".join(f"`{value}`" for value in node.values)
    if isinstance(node, mi.StrType):
        return "non-empty string" if node.min_length == 1 and not node.pattern else "string"
    if isinstance(node, mi.BoolType):
        return "boolean"
    found = node_range(node, "")
    if found is not None:
        return f"{found.kind}, {notation(found)}"
    if isinstance(node, mi.VarTupleType | mi.ListType):
        text = f"array of {_type_text(node.item_type)}s"
        return text + (f", ≥ {node.min_length}" if node.min_length else "")
    if isinstance(node, mi.DictType):
        return f"table: {_type_text(node.key_type)} → {_type_text(node.value_type)}"
    raise TypeError(f"no words for {node!r}")


def entry_table(*variants: type[msgspec.Struct]) -> str:
    """The keys of one entry of an array of tables (``[[mcp.servers]]``; ``[[hooks]]``, whose
    ``variants`` are tagged): type, default ("required for" the variants that require it)
    and doc line, from the declaration."""
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    infos = [mi.type_info(kind) for kind in variants]
    structs = [info for info in infos if isinstance(info, mi.StructType)]
    assert len(structs) == len(variants)
    if structs[0].tag_field is not None:
        tags = " \\| ".join(f"`{info.tag}`" for info in structs)
        lines.append(f"| `{structs[0].tag_field}` | {tags} | required | |")
    docs = functools.reduce(operator.or_, (_doc_lines(kind) for kind in reversed(variants)))
    seen: set[str] = set()
    for info in structs:
        for field in info.fields:
            if field.name in seen:
                continue
            seen.add(field.name)
            owners = [f"`{i.tag}`" for i in structs if field.name in {f.name for f in i.fields}]
            if not field.required:
                default = _value(
                    field.default_factory() if field.default is msgspec.NODEFAULT else field.default
                )
            elif len(owners) == len(structs):
                default = "required"
            else:
                default = f"required for {', '.join(owners)}"
            text = _type_text(field.type)
            lines.append(f"| `{field.name}` | {text} | {default} | {docs.get(field.name, '')} |")
    return "\n".join(lines)


CACHE_KEYS: Final = tuple(key for key in RUN_KEYS if "cache" in key)


def generated_tables() -> dict[str, list[str]]:
    """The generated tables of each docs page (a test checks each page holds them)."""
    return {
        "security.md": doc_tables(),
        "scenarios.md": [run_keys_table()],
        "truncation-and-cache.md": [run_keys_table(CACHE_KEYS)],
        "context.md": [section_table(ContextSettings)],
        "budgets.md": [budget_table()],
        "hooks.md": [entry_table(CommandHook, PythonHook)],
        "mcp.md": [entry_table(McpServer)],
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
