"""The context package's records: msgspec Structs, kept apart from the code that uses them.

:mod:`actors.context.tokens` and :mod:`actors.context.ledger` are compiled with mypyc
(``setup.py``), which would build a Struct class without its options (``frozen=True``);
the Structs they use live here, in a module that stays Python.
"""

from __future__ import annotations

import msgspec

from bus import Role

__all__ = ["Entry", "Estimate"]


class Estimate(msgspec.Struct, frozen=True, gc=False):
    """Tokens of a piece: ``tokens`` (never knowingly low) and ``floor`` (never knowingly
    high); equal when the model's own tokenizer counted them. ``bound`` is an upper bound
    for any byte-fallback tokenizer (UTF-8 bytes, framing at its largest measured), kept
    for models whose tokenizer is unknown; 0 when the model's own tokenizer counted."""

    tokens: int = 0
    floor: int = 0
    bound: int = 0

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(
            self.tokens + other.tokens, self.floor + other.floor, self.bound + other.bound
        )

    def __sub__(self, other: Estimate) -> Estimate:
        return Estimate(
            self.tokens - other.tokens, self.floor - other.floor, self.bound - other.bound
        )


class Entry(msgspec.Struct, gc=False):
    """One transcript message as the ledger knows it (a mutable Struct, cheaper to make than
    a slotted dataclass: one per message of every run)."""

    role: Role
    estimate: Estimate
    chars: int
    """Characters of its content."""
    turn: int
    """The turn that added it (0: the system prompt and the task)."""
    tool: str | None = None
    """For a tool result: the tool that produced it."""
    call_id: str | None = None
    folded: bool = False
