"""The registry, schema generation, raw-schema and scripted tools, the public API."""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
import pytest

import actors.tools
from actors.tools import (
    Tool,
    ToolContext,
    ToolRegistry,
    default_registry,
    invoke,
    parameters_schema,
)
from actors.tools.schema import inline_refs
from tests.sandbox_support import HAS_MATPLOTLIB
from tests.scripted_tools import scripted_tool


class Inner(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A nested part."""

    x: int
    title: str = ""


class Params(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Do the thing."""

    name: Annotated[str, msgspec.Meta(description="Who to greet.")]
    inner: Inner
    many: tuple[Inner, ...] = ()
    maybe: Inner | None = None
    count: int = 1


async def _echo(params: Any, ctx: ToolContext) -> str:
    return repr(params)


def _walk(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [*node, *(k for v in node.values() for k in _walk(v))]
    if isinstance(node, list):
        return [k for v in node for k in _walk(v)]
    return []


def test_schema_is_flat_with_required_fields_and_descriptions() -> None:
    schema = parameters_schema(Params)
    assert schema["type"] == "object"
    assert schema["description"] == "Do the thing."
    assert schema["required"] == ["name", "inner"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["name"]["description"] == "Who to greet."
    assert schema["properties"]["inner"]["properties"]["x"] == {"type": "integer"}
    assert schema["properties"]["many"]["items"]["required"] == ["x"]
    keys = _walk(schema)
    assert "$ref" not in keys
    assert "$defs" not in keys
    # "title" the keyword is dropped; "title" the field name is kept
    assert "title" not in schema
    assert "title" in schema["properties"]["inner"]["properties"]


def test_recursive_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="recursive"):
        inline_refs(
            {"$ref": "#/$defs/A", "$defs": {"A": {"properties": {"a": {"$ref": "#/$defs/A"}}}}}
        )


def test_spec_carries_the_schema_as_json_text() -> None:
    tool = Tool("greet", "Greets.", Params, _echo)
    assert tool.spec.name == "greet"
    assert tool.spec.description == "Greets."
    assert json.loads(tool.spec.parameters) == json.loads(json.dumps(parameters_schema(Params)))
    assert not tool.idempotent
    assert not tool.finishes_stage
    assert tool.timeout_seconds is None


def test_params_must_be_frozen_and_strict() -> None:
    class Loose(msgspec.Struct):
        a: int

    class Thawed(msgspec.Struct, forbid_unknown_fields=True):
        a: int

    for bad in (Loose, Thawed):
        with pytest.raises(ValueError, match="frozen=True and forbid_unknown_fields=True"):
            Tool("t", "", bad, _echo)
    with pytest.raises(ValueError, match="Struct"):
        Tool("t", "", dict, _echo)


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "dots.no"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="must match"):
        Tool(name, "", Params, _echo)


def test_registry_specs_and_lookup() -> None:
    registry = default_registry()
    figure = ("make_figure",) if HAS_MATPLOTLIB else ()  # the figures extra
    core = ("finish_exploration", "list_dir", "read_file", "read_image")
    assert registry.names() == tuple(sorted(core + figure))
    assert [s.name for s in registry.specs(["read_file", "list_dir"])] == ["read_file", "list_dir"]
    assert [s.name for s in registry.specs()] == list(registry.names())
    assert "read_file" in registry
    assert "nope" not in registry
    assert len(registry) == 4 + len(figure)
    with pytest.raises(KeyError, match="unknown tool 'nope'"):
        registry.specs(["nope"])
    with pytest.raises(ValueError, match="already registered"):
        registry.add(Tool("read_file", "", Params, _echo))
    idempotent = {t.name: t.idempotent for t in registry}
    assert idempotent == {
        "list_dir": True,
        "read_file": True,
        "read_image": True,
        "finish_exploration": False,
        **dict.fromkeys(figure, False),  # a figure is new output: never served from cache
    }


def test_decode_reports_msgspec_messages() -> None:
    tool = Tool("greet", "", Params, _echo)
    assert tool.decode('{"name": "a", "inner": {"x": 1}}') == Params(name="a", inner=Inner(x=1))
    for arguments, expected in [
        ('{"name": "a", "inner": {"x": "1"}}', "Expected `int`, got `str` - at `$.inner.x`"),
        ('{"inner": {"x": 1}}', "missing required field `name`"),
        ("[1]", "Expected `object`, got `array`"),
        ("{nope", "not valid JSON"),
    ]:
        with pytest.raises(actors.tools.ToolError) as info:
            tool.decode(arguments)
        assert info.value.kind == "invalid_arguments"
        assert expected in info.value.message


# ---------------------------------------------------------------------------- raw schema

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}},
    "required": ["order_id"],
    "additionalProperties": False,
}


def test_raw_schema_tool_checks_arguments() -> None:
    tool = Tool.from_json_schema("query_order", "Query an order.", ORDER_SCHEMA, _echo)
    assert json.loads(tool.spec.parameters) == ORDER_SCHEMA
    assert tool.decode('{"order_id": "A1"}') == {"order_id": "A1"}
    for arguments, expected in [
        ("{}", "missing required field `order_id`"),
        ('{"order_id": 5}', "Expected `string`, got `integer` - at `$.order_id`"),
        ('{"order_id": "A", "verbose": 1}', "- at `$.verbose`"),
        ('{"order_id": "A", "x": 1}', "unknown field `x`"),
        ('"A1"', "Expected `object`"),
    ]:
        with pytest.raises(actors.tools.ToolError, match="invalid arguments") as info:
            tool.decode(arguments)
        assert expected in info.value.message
    with pytest.raises(ValueError, match="type 'object'"):
        Tool.from_json_schema("bad", "", {"type": "string"}, _echo)


# ---------------------------------------------------------------------------- scripted


async def _run(tool: Tool[Any], ctx: ToolContext, arguments: str) -> str:
    outcome = await invoke(tool, arguments, ctx, max_chars=1000)
    assert not outcome.is_error, outcome
    return outcome.content


@pytest.mark.asyncio
async def test_scripted_results_per_call_last_repeats_counted_per_run() -> None:
    tool = scripted_tool("query_order", "Query.", ORDER_SCHEMA, ["pending", "shipped", "done"])
    run1, run2 = ToolContext("r1"), ToolContext("r2")
    args = '{"order_id": "A1001"}'
    assert [await _run(tool, run1, args) for _ in range(5)] == [
        "pending",
        "shipped",
        "done",
        "done",
        "done",
    ]
    assert await _run(tool, run2, args) == "pending"  # each run counts its own calls


@pytest.mark.asyncio
async def test_scripted_results_keyed_by_canonical_arguments() -> None:
    schema = {"type": "object", "properties": {"order_id": {}, "n": {}}}
    tool = scripted_tool(
        "query_order",
        "Query.",
        schema,
        {
            '{"order_id": "A1", "n": 1}': ["a1 first", "a1 again"],
            '{"order_id": "B2"}': "b2",
            "*": ["unknown order"],
        },
        idempotent=True,
    )
    assert tool.idempotent
    ctx = ToolContext("r1")
    assert await _run(tool, ctx, '{"n": 1.0, "order_id": "A1"}') == "a1 first"
    assert await _run(tool, ctx, '{"order_id": "B2"}') == "b2"
    assert await _run(tool, ctx, '{"order_id":"A1","n":1}') == "a1 again"
    assert await _run(tool, ctx, '{"order_id": "Z9"}') == "unknown order"


@pytest.mark.asyncio
async def test_scripted_without_a_match_is_an_error_result() -> None:
    tool = scripted_tool("q", "", {"type": "object"}, {'{"a": 1}': "one"})
    outcome = await invoke(tool, '{"a": 2}', ToolContext("r"), max_chars=100)
    assert outcome.is_error
    assert outcome.error_kind == "scripted"


@pytest.mark.parametrize("results", [[], "just text", {"not json": ["x"]}, {"*": []}, [1]])
def test_bad_scripts_are_refused(results: Any) -> None:
    with pytest.raises(ValueError, match="scripted tool 'q'"):
        scripted_tool("q", "", {"type": "object"}, results)


# ---------------------------------------------------------------------------- public API


def test_public_api_is_pinned() -> None:
    assert actors.tools.__all__ == [
        "PATH_ERROR",
        "READ_CHARS",
        "FinishExploration",
        "ListDir",
        "Outcome",
        "ReadFile",
        "Tool",
        "ToolContext",
        "ToolError",
        "ToolExecutorSettings",
        "ToolFn",
        "ToolLimits",
        "ToolRegistry",
        "builtin_tools",
        "cap_text",
        "default_registry",
        "guard_path",
        "invoke",
        "parameters_schema",
    ]
    for name in actors.tools.__all__:
        assert getattr(actors.tools, name) is not None


def test_registry_from_nothing_is_empty() -> None:
    assert len(ToolRegistry()) == 0
    assert ToolRegistry().specs() == ()


def test_raw_schema_checked_in_depth_and_a_bad_schema_refused() -> None:
    schema = {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}}},
    }
    tool = Tool.from_json_schema("ids", "", schema, _echo)
    assert tool.decode('{"ids": [1, 2]}') == {"ids": [1, 2]}
    with pytest.raises(actors.tools.ToolError) as info:
        tool.decode('{"ids": [1, "x"]}')
    assert info.value.message == (
        "invalid arguments for ids: Expected `integer`, got `string` - at `$.ids[1]`"
    )
    bad = {"type": "object", "properties": {"a": {"type": "text"}}}
    with pytest.raises(
        ValueError, match=r"tool 'bad': invalid JSON schema at `\$\.properties\.a\.type`"
    ):
        Tool.from_json_schema("bad", "", bad, _echo)
    dialects: tuple[object, ...] = ([], {}, 5, None)
    for dialect in dialects:  # jsonschema's validator_for raised TypeError on some
        with pytest.raises(ValueError, match=r"invalid JSON schema at `\$\['\$schema'\]`"):
            Tool.from_json_schema("bad", "", {"type": "object", "$schema": dialect}, _echo)
