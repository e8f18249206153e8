"""Replaced algorithms against the ones they replaced, on random inputs: the canonical
arguments of a call fingerprint (floats normalised while decoding instead of by a second
walk) and the argument check of a raw-schema tool (its fast test of plain fields against
jsonschema)."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import msgspec
import pytest

from actors.fingerprint import canonical_arguments, fingerprint_call
from actors.tools.schema import argument_checker

# ---------------------------------------------------------------------------- fingerprints

_old_decode = msgspec.json.Decoder().decode
_old_encoder = msgspec.json.Encoder(order="sorted")


def _old_normalise(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _old_normalise(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_old_normalise(item) for item in value]
    return value


def old_canonical_arguments(arguments: str) -> bytes:
    """The canonical form as it was computed before (decode, walk, encode)."""
    try:
        return _old_encoder.encode(_old_normalise(_old_decode(arguments)))
    except (msgspec.DecodeError, msgspec.EncodeError, RecursionError, ValueError, TypeError):
        return b"raw:" + arguments.encode("utf-8", "surrogatepass")


NUMBERS = [
    "0",
    "-0",
    "1",
    "1.0",
    "-0.0",
    "2.50",
    "1e2",
    "1E+2",
    "1.5e-3",
    "0.1e1",
    "9007199254740992.0",
    "9007199254740993.0",
    "1e16",
    "1e308",
    "1.7976931348623157e308",
    "1.7976931348623159e308",
    "1e400",
    "-1e400",
    "1e-400",
    "123456789012345678901234567890",
    "-9223372036854775809",
    "3.141592653589793",
    "0.30000000000000004",
]
STRINGS = ['"a"', '""', '"\\u00e9"', '"é"', '"\\ud800"', '"\\n\\t"', '"step 12"', '"日本"']


def random_json(rng: random.Random, depth: int = 0) -> str:
    """JSON text with random spacing, key order and number spellings."""
    kind = rng.randrange(6 if depth < 5 else 3)
    space = rng.choice(["", " ", "\n  "])
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return rng.choice(STRINGS)
    if kind == 2:
        return rng.choice(["true", "false", "null"])
    if kind == 3:
        items = [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
        return "[" + f",{space}".join(items) + "]"
    keys = rng.sample(["a", "b", "path", "n", "Z", "é", "a b"], rng.randrange(5))
    members = [f"{json.dumps(key)}:{space}{random_json(rng, depth + 1)}" for key in keys]
    return "{" + f",{space}".join(members) + "}"


def test_canonical_arguments_agree_with_the_old_walk_on_random_json() -> None:
    rng = random.Random(8)
    for _ in range(20_000):
        text = random_json(rng)
        assert canonical_arguments(text) == old_canonical_arguments(text), text


def test_canonical_arguments_agree_on_text_that_is_not_json() -> None:
    rng = random.Random(9)
    alphabet = '{}[]",:0123456789.eE+- abcnulltruefalse\\\ud800é'
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        assert canonical_arguments(text) == old_canonical_arguments(text), text
    for text in NUMBERS + STRINGS + ["", "nan", "NaN", "Infinity", "{", '{"a": 1,}']:
        assert canonical_arguments(text) == old_canonical_arguments(text), text


def test_integral_floats_and_key_order_do_not_change_the_fingerprint() -> None:
    same = ['{"b": 1, "a": [2, {"d": 3.0}]}', '{"a":[2.0,{"d":3}],"b":1e0}']
    assert len({fingerprint_call("t", text) for text in same}) == 1
    assert fingerprint_call("t", '{"a": 1.5}') != fingerprint_call("t", '{"a": 1}')
    assert canonical_arguments("1e400") == b"raw:1e400"  # out of range: the raw text


def test_deep_nesting_is_canonical_wherever_it_is_computed() -> None:
    # The old walk recursed in Python, so arguments a few hundred levels deep fell back to
    # their raw text depending on the caller's stack depth; the decoder's float hook makes
    # the form the same from anywhere, up to msgspec's own depth limit.
    deep = '{"a": ' * 300 + "1.0" + "}" * 300
    assert canonical_arguments(deep) == b'{"a":' * 300 + b"1" + b"}" * 300


# ---------------------------------------------------------------------------- arguments

KINDS = ["string", "integer", "number", "boolean", "array", "object", "null", "weird"]
VALUES: list[Any] = ["x", "", 0, 1, -5, 1.5, 2.0, True, False, None, [], [1], {}, {"a": 1}]


def random_schema(rng: random.Random) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name in rng.sample(["a", "b", "c", "d"], rng.randrange(5)):
        shape = rng.randrange(6)
        if shape == 0:
            properties[name] = {"type": rng.choice(KINDS)}
        elif shape == 1:
            properties[name] = {"type": rng.sample(KINDS, rng.randrange(1, 4))}
        elif shape == 2:
            properties[name] = {"description": "no type"}
        elif shape == 3:
            properties[name] = {"type": "string", "maxLength": 1}
        elif shape == 4:
            properties[name] = True
        else:
            properties[name] = None
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if rng.random() < 0.5:
        schema["required"] = rng.sample(["a", "b", "c", "e"], rng.randrange(3))
    if rng.random() < 0.5:
        schema["additionalProperties"] = rng.choice([False, True, {}])
    if rng.random() < 0.1:
        del schema["properties"]
    return schema


def random_arguments(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return rng.choice(VALUES)
    names = rng.sample(["a", "b", "c", "d", "e", "f"], rng.randrange(5))
    return {name: rng.choice(VALUES) for name in names}


def test_the_argument_check_agrees_with_jsonschema_on_random_schemas() -> None:
    """The fast test of plain fields accepts only what jsonschema accepts, and whatever
    jsonschema rejects is an error (a malformed schema is refused when the check is built)."""
    rng = random.Random(10)
    checked = 0
    for _ in range(3_000):
        schema = random_schema(rng)
        validator = jsonschema.Draft202012Validator(schema)
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError:
            with pytest.raises(ValueError, match="invalid JSON schema at"):
                argument_checker(schema)
            continue
        check = argument_checker(schema)
        for _ in range(10):
            arguments = random_arguments(rng)
            try:
                check(arguments)
            except ValueError:
                assert not validator.is_valid(arguments), (schema, arguments)
            else:
                assert validator.is_valid(arguments), (schema, arguments)
            checked += 1
    assert checked > 10_000


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": []},
        {"type": "object", "properties": None},
        {"type": "object", "required": 5},
        {"type": "object", "required": "ab"},
        {"type": "object", "properties": {"a": {"type": 5}}},
        {"type": "object", "properties": {"a": {"type": [["string"]]}}},
        {"type": "object", "properties": {"a": {"type": {"string": 1}}}},
    ],
)
def test_a_malformed_schema_is_refused_naming_where(schema: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"invalid JSON schema at `\$\.(properties|required)"):
        argument_checker(schema)
