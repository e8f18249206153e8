"""The numeric ranges of the config types, read from their ``msgspec.Meta`` constraints.

Every integer and float setting carries its bounds on its type, where decoding enforces
them. This module reads them back, to say the whole range in an error message (and for the docs'
tables, ``python -m tests.config_docs``). It knows no config type.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, NamedTuple

import msgspec
import msgspec.inspect as mi

__all__ = ["NumericRange", "children", "node_range", "number_text", "range_at"]

Number = int | float


class NumericRange(NamedTuple):
    """The bounds of one numeric key; ``None`` where there is no such bound."""

    key: str
    kind: Literal["integer", "number"]
    ge: Number | None
    gt: Number | None
    le: Number | None
    lt: Number | None
    nullable: bool

    @property
    def bounded(self) -> bool:
        """Whether it has both a lower and an upper bound."""
        return (self.ge, self.gt) != (None, None) and (self.le, self.lt) != (None, None)

    def describe(self) -> str:
        """In words, for error messages (of a :attr:`bounded` range): ``a positive integer,
        at most 100``."""
        low = number_text(self.ge if self.ge is not None else self.gt)
        high = number_text(self.le if self.le is not None else self.lt)
        article = "an" if self.kind == "integer" else "a"
        if (self.kind == "integer" and self.ge == 1) or self.gt == 0:
            text = f"a positive {self.kind}"
        elif self.ge is not None and self.le is not None:
            return f"{article} {self.kind} from {low} to {high}"
        elif self.ge is not None:
            text = f"{article} {self.kind} of at least {low}"
        else:
            text = f"{article} {self.kind} above {low}"
        return f"{text}, {'at most' if self.le is not None else 'below'} {high}"


def number_text(value: Number | None) -> str:
    """``value`` for a person: ``100,000``, ``0.5``; empty for none."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def node_range(node: mi.Type, key: str) -> NumericRange | None:
    """The range of ``node`` if it is a number (or a number or null)."""
    nullable = False
    if isinstance(node, mi.UnionType):
        numbers = [t for t in node.types if isinstance(t, mi.IntType | mi.FloatType)]
        if len(numbers) != 1:
            return None
        nullable = any(isinstance(t, mi.NoneType) for t in node.types)
        node = numbers[0]
    if isinstance(node, mi.IntType | mi.FloatType):
        kind: Literal["integer", "number"] = "integer" if isinstance(node, mi.IntType) else "number"
        return NumericRange(key, kind, node.ge, node.gt, node.le, node.lt, nullable)
    return None


def children(node: mi.Type) -> Iterator[tuple[str, mi.Type]]:
    """``(key part, type)`` below ``node``: a Struct's fields, ``N`` for an array's items,
    ``<name>`` for a table's values; a union's members' children, each key once."""
    if isinstance(node, mi.StructType):
        for field in node.fields:
            yield field.encode_name, field.type
    elif isinstance(node, mi.VarTupleType | mi.ListType | mi.SetType | mi.FrozenSetType):
        yield "N", node.item_type
    elif isinstance(node, mi.DictType):
        yield "<name>", node.value_type
    elif isinstance(node, mi.UnionType):
        below: dict[str, mi.Type] = {}
        for part, child in (pair for member in node.types for pair in children(member)):
            below.setdefault(part, child)
        yield from below.items()


def range_at(kind: type[msgspec.Struct], key: str) -> NumericRange | None:
    """The range of the numeric setting at dotted ``key`` of ``kind`` (``hooks.0.x``:
    an array's item), or ``None`` if that is not a numeric setting."""
    node = mi.type_info(kind)
    for part in key.split(".") if key else ():
        below = dict(children(node))
        if (child := below.get("N" if part.isdigit() else part, below.get("<name>"))) is None:
            return None
        node = child
    return node_range(node, key)
