"""Run and trace ids: random version-4 UUIDs as 32 lowercase hex characters, as
``uuid.uuid4().hex`` gives, but cut from one block of ``os.urandom`` per 256 ids.

``uuid4`` reads 16 bytes per id with a ``getrandom`` system call, around which the
interpreter lets go of the GIL: under load the store's writer thread takes it and the event
loop waits for it back, twice per run. The ids come from the same kernel source, so they are
as hard to guess; each byte is used once, and a forked child drops its parent's block (it
would otherwise hand out the parent's next ids).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Final

__all__ = ["new_id"]

IDS_PER_BLOCK: Final = 256
_VERSION: Final = bytes((b & 0x0F) | 0x40 for b in range(256))
"""Byte 6 of a version-4 UUID: its high nibble is the version, 4."""
_VARIANT: Final = bytes((b & 0x3F) | 0x80 for b in range(256))
"""Byte 8: its two high bits are the RFC 4122 variant, ``10``."""

_ids: Iterator[str] = iter(())


def new_id() -> str:
    """A new random id: 32 lowercase hex characters, a valid version-4 UUID."""
    global _ids
    # next() on a list iterator is one step under the GIL: threads never get the same id.
    # Two threads refilling at once each make a block; ids of the one replaced are unused.
    found = next(_ids, None)
    if found is None:
        raw = bytearray(os.urandom(16 * IDS_PER_BLOCK))
        raw[6::16] = raw[6::16].translate(_VERSION)
        raw[8::16] = raw[8::16].translate(_VARIANT)
        text = raw.hex()
        block = [text[i : i + 32] for i in range(0, len(text), 32)]
        found = block[0]
        _ids = iter(block[1:])
    return found


def _forget() -> None:
    global _ids
    _ids = iter(())


os.register_at_fork(after_in_child=_forget)
