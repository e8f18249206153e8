"""JSON schemas for tool parameters, as the model sees them.

msgspec writes a schema with ``$ref``/``$defs``; many OpenAI-compatible endpoints reject
references, so :func:`parameters_schema` inlines every reference into one flat object
schema and drops the ``title`` keys msgspec adds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

__all__ = ["argument_checker", "check_arguments", "inline_refs", "parameters_schema"]

_REF_PREFIX = "#/$defs/"
_NAME_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})


def parameters_schema(params: type[msgspec.Struct]) -> dict[str, Any]:
    """The flat object schema of a parameters Struct (no ``$ref``, no ``$defs``).

    Field descriptions come from ``Annotated[..., msgspec.Meta(description=...)]`` and the
    Struct's docstring becomes the schema's description.

    :raises ValueError: if the Struct refers to itself (a recursive schema cannot be flat).
    """
    schema = inline_refs(msgspec.json.schema(params))
    if schema.get("type") != "object":
        raise ValueError(f"parameters of {params.__name__} must be an object schema")
    return schema


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``#/$defs/…`` reference replaced by its definition.

    :raises ValueError: on a recursive or dangling reference.
    """
    defs: dict[str, Any] = schema.get("$defs", {})

    def walk(node: Any, seen: tuple[str, ...], *, names: bool = False) -> Any:
        if isinstance(node, list):
            return [walk(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        if names:  # a map of property names to schemas: keys are data, not keywords
            return {key: walk(value, seen) for key, value in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.removeprefix(_REF_PREFIX)
            if not ref.startswith(_REF_PREFIX) or name not in defs:
                raise ValueError(f"cannot inline schema reference {ref!r}")
            if name in seen:
                raise ValueError(f"recursive schema reference {ref!r} cannot be inlined")
            merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return walk(merged, (*seen, name))
        return {
            key: walk(value, seen, names=key in _NAME_MAPS)
            for key, value in node.items()
            if key not in ("$defs", "title")
        }

    result = walk(schema, ())
    assert isinstance(result, dict)
    return result


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def check_arguments(schema: dict[str, Any], arguments: Any) -> None:
    """A shallow check of decoded ``arguments`` against an object ``schema``.

    Checks what matters for hand-written tool schemas (the simulator's fake tools): an
    object, its required fields, unknown fields when ``additionalProperties`` is false, and
    the JSON ``type`` of each top-level field. Messages read like msgspec's.

    :raises ValueError: naming the field and the reason.
    """
    if not isinstance(arguments, dict):
        raise ValueError(f"Expected `object`, got `{_json_type(arguments)}`")
    properties: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in arguments:
            raise ValueError(f"Object missing required field `{name}`")
    for name, value in arguments.items():
        field = properties.get(name)
        if field is None:
            if schema.get("additionalProperties", True) is False:
                raise ValueError(f"Object contains unknown field `{name}`")
            continue
        expected = field.get("type") if isinstance(field, dict) else None
        kinds = [expected] if isinstance(expected, str) else list(expected or ())
        if kinds and not any(_is_type(value, kind) for kind in kinds):
            wanted = " | ".join(f"`{kind}`" for kind in kinds)
            raise ValueError(f"Expected {wanted}, got `{_json_type(value)}` - at `$.{name}`")


def argument_checker(schema: dict[str, Any]) -> Callable[[Any], None]:
    """:func:`check_arguments` against ``schema``, with what it reads of the schema read
    once: the same checks in the same order, the same messages. A schema whose parts are
    not what a JSON schema has there (``properties`` not an object, ...) is checked by
    :func:`check_arguments` itself at each call, as before.
    """
    try:
        properties = schema.get("properties", {})
        required = tuple(schema.get("required", ()))
        closed = schema.get("additionalProperties", True) is False
        fields: dict[str, tuple[tuple[type, ...], bool, str] | None] = {}
        for name, field in properties.items():
            if field is None:
                continue  # read as no schema for the field: an unknown field
            expected = field.get("type") if isinstance(field, dict) else None
            kinds = [expected] if isinstance(expected, str) else list(expected or ())
            if not kinds:
                fields[name] = None  # any value
                continue
            types = tuple(t for kind in kinds for t in _JSON_TYPES.get(kind, (object,)))
            takes_bool = any(_is_type(True, kind) for kind in kinds)
            fields[name] = (types, takes_bool, " | ".join(f"`{kind}`" for kind in kinds))
    except (AttributeError, TypeError):

        def check_each_time(arguments: Any) -> None:
            check_arguments(schema, arguments)

        return check_each_time

    def check(arguments: Any) -> None:
        if not isinstance(arguments, dict):
            raise ValueError(f"Expected `object`, got `{_json_type(arguments)}`")
        for name in required:
            if name not in arguments:
                raise ValueError(f"Object missing required field `{name}`")
        for name, value in arguments.items():
            if name not in fields:
                if closed:
                    raise ValueError(f"Object contains unknown field `{name}`")
                continue
            field = fields[name]
            if field is None:
                continue
            types, takes_bool, wanted = field
            if takes_bool if isinstance(value, bool) else isinstance(value, types):
                continue
            raise ValueError(f"Expected {wanted}, got `{_json_type(value)}` - at `$.{name}`")

    return check


def _is_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    return isinstance(value, _JSON_TYPES.get(kind, (object,)))


def _json_type(value: Any) -> str:
    for kind in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _is_type(value, kind):
            return kind
    return type(value).__name__
