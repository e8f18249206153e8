"""JSON schemas for tool parameters, as the model sees them, and the check of a call's
arguments against one (by :mod:`jsonschema`).

msgspec writes a schema with ``$ref``/``$defs``; many OpenAI-compatible endpoints reject
references, so :func:`parameters_schema` inlines every reference into one flat object
schema and drops the ``title`` keys msgspec adds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.validators import Draft202012Validator, validator_for

__all__ = ["argument_checker", "inline_refs", "parameters_schema"]

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


def argument_checker(schema: dict[str, Any]) -> Callable[[Any], None]:
    """A check of decoded arguments against ``schema`` by :mod:`jsonschema`, its validator
    built once. It raises :class:`ValueError` with a message that reads like msgspec's
    (``Expected `string`, got `integer` - at `$.order_id```, ``Object missing required
    field `x```, ``Object contains unknown field `x```; jsonschema's own text for other
    keywords), so the model can fix its call.

    A schema of plain fields (an object of ``string``/``integer``/``number``/``boolean``
    properties, ``required`` and a boolean ``additionalProperties``) first tries a fast
    test that accepts only arguments the validator accepts; anything else goes to it.

    :raises ValueError: if ``schema`` is not a valid JSON schema, naming where and why.
    """
    if not isinstance(schema.get("$schema", ""), str):  # validator_for looks it up, unchecked
        raise ValueError("invalid JSON schema at `$['$schema']`: not a string")
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"invalid JSON schema at `{exc.json_path}`: {exc.message}") from None
    iter_errors = cls(schema).iter_errors
    fast = _plain_fields(schema)

    def check(arguments: Any) -> None:
        if fast is not None and _matches(fast, arguments):
            return
        error = best_match(iter_errors(arguments))
        if error is not None:
            raise ValueError(_message(error))

    return check


_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})
_OBJECT_KEYS = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties", "$schema"}
_PlainFields = tuple[dict[str, tuple[type, ...]], tuple[str, ...], bool]


def _plain_fields(schema: dict[str, Any]) -> _PlainFields | None:
    """(field -> exact Python types, required, closed) when ``schema`` (a valid one) is an
    object of plain fields and nothing else; ``None`` otherwise."""
    closed = schema.get("additionalProperties", True)
    if (
        schema.get("type") != "object"
        or not set(schema) <= _OBJECT_KEYS
        or not isinstance(closed, bool)
    ):
        return None
    fields: dict[str, tuple[type, ...]] = {}
    for name, field in schema.get("properties", {}).items():
        kind = field.get("type") if isinstance(field, dict) else None
        if not (
            isinstance(kind, str) and kind in _PLAIN_TYPES and set(field) <= _ANNOTATIONS | {"type"}
        ):
            return None
        fields[name] = _PLAIN_TYPES[kind]
    return fields, tuple(schema.get("required", ())), not closed


def _matches(fast: _PlainFields, arguments: Any) -> bool:
    """Whether ``arguments`` surely matches (exact types: ``bool`` is not an ``int``)."""
    fields, required, closed = fast
    if type(arguments) is not dict or not all(name in arguments for name in required):
        return False
    for name, value in arguments.items():
        types = fields.get(name)
        if types is None:
            if closed:
                return False
        elif type(value) not in types:
            return False
    return True


def _message(error: ValidationError) -> str:
    at = "" if error.json_path == "$" else f" - at `{error.json_path}`"
    instance: Any = error.instance  # the types say "maybe unset": never, for an error
    value: Any = error.validator_value
    schema: Any = error.schema
    if error.validator == "type":
        kinds = [value] if isinstance(value, str) else list(value)
        wanted = " | ".join(f"`{kind}`" for kind in kinds)
        got = next((k for k in _JSON_TYPES if _TYPES.is_type(instance, k)), type(instance).__name__)
        return f"Expected {wanted}, got `{got}`{at}"
    if error.validator == "required":
        missing = next(name for name in value if name not in instance)
        return f"Object missing required field `{missing}`{at}"
    if error.validator == "additionalProperties" and "patternProperties" not in schema:
        known = schema.get("properties", {})
        extra = next(name for name in instance if name not in known)
        return f"Object contains unknown field `{extra}`{at}"
    return f"{error.message}{at}"


_JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")

_TYPES = Draft202012Validator.TYPE_CHECKER
