"""What a run's token budget has seen, as bytes a checkpoint keeps (``docs/budgets.md``).

A resumed run (daemon restart, fleet takeover) goes on with the token account it had: the
warning already given, the continuations already made toward a target and their last
increments, so a restart neither repeats a warning nor grants a target run a fresh set of
continuations. Turns, tool calls and the deadline need nothing here: the checkpoint's
counters carry them (``RunStarted``'s limits are what is left of them).
"""

from __future__ import annotations

from typing import Final

import msgspec

from actors.budget.tokens import TokenAccount

__all__ = ["TokenSnapshot", "restore_account", "snapshot_account"]


class TokenSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A :class:`~actors.budget.tokens.TokenAccount`'s state, without its limits (the
    resumed run's own settings give those)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    warned: bool = False
    continuations: int = 0
    checked_at: int = 0
    last_increment: int | None = None


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(TokenSnapshot)


def snapshot_account(account: TokenAccount) -> bytes:
    """``account``'s state as JSON bytes."""
    state = {name: getattr(account, name) for name in TokenSnapshot.__struct_fields__}
    return _ENCODER.encode(TokenSnapshot(**state))


def restore_account(account: TokenAccount, data: bytes) -> None:
    """Put a :func:`snapshot_account` back into ``account``.

    :raises msgspec.DecodeError: ``data`` is not such a snapshot.
    """
    snap = _DECODER.decode(data)
    for name in TokenSnapshot.__struct_fields__:
        setattr(account, name, getattr(snap, name))
