"""The operator's loop detection as a floor: what a request's ``loop`` table may change.

A request's ``loop`` table is judged by its effect: the run's effective loop config (the
preset with the request's table merged on top, levels clamped) against the *floor*, the same
preset with the operator's own table (a scenario's ``[config] loop``, none for a task).
:func:`loop_refusal` names the first way the effective config is laxer, by the rule of
``docs/security.md``, "Loop detection by effect": a detector the floor has on stays on and
only its stop fields (:data:`STOP_FIELDS`) may be lowered, everything else of it kept; one
the floor has off may be switched on as a fuse only; the settings every detector shares
stay; under ``strikes`` only ``strikes.stop_at`` may be lowered, and none may be added. So
before the run's first stop every call gets the decision the floor gives it, and the
effective config stops a run no later than the floor does.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from actors.loop.config import LEVELLED, LoopConfig
from actors.loop.config import SECTIONS as LOOP_SECTIONS

__all__ = ["SECTIONS", "STOP_FIELDS", "loop_refusal"]

SECTIONS: Final = tuple(sorted(LOOP_SECTIONS, key=lambda name: name not in LEVELLED))
"""The detector sections, each with an ``enabled`` switch (the levelled ones first: the
order refusals are looked for in)."""

STOP_FIELDS: Final[dict[str, frozenset[str]]] = {
    name: type(getattr(LoopConfig(), name)).stops for name in SECTIONS
}
"""Per detector section, the fields a request may lower (lower stops sooner): its
``Section.stops``."""

_HOLD_FIELDS: Final = ("warn_at", "block_at", "progress_warn_at", "progress_block_at")
"""Levels that warn or refuse a call without stopping the run."""

_SHARED_WHY: Final = {
    "exempt_tools": "an exempt tool is never counted by any detector",
    "poll_tools": "a poll tool is judged by other rules than other tools",
}


def _number(value: Any) -> str:
    return "null (no limit)" if value is None else f"{value:g}"


def loop_refusal(
    effective: LoopConfig, floor: LoopConfig, *, reply_limit: int | None
) -> tuple[str, str] | None:
    """The first way ``effective`` is laxer than ``floor``: ``(key under loop, reason)``,
    or ``None`` when it is not. Both configs checked (levels clamped) as the detector uses
    them; ``reply_limit``: the most a request's model reply may ask for (``None``: no limit).
    """
    if floor.strikes is None and effective.strikes is not None:
        return "strikes", "a request may not add strikes (a strike refuses a call the run stops at)"
    if floor.strikes is not None:
        if effective.strikes is None:
            return "strikes", "the operator's strikes stay on"
        if effective.strikes.text != floor.strikes.text:
            return "strikes.text", "a request may not change it"
        if effective.strikes.stop_at > floor.strikes.stop_at:
            return "strikes.stop_at", (
                f"{effective.strikes.stop_at} is above the operator's {floor.strikes.stop_at}"
            )
    for field in LoopConfig.__struct_fields__:
        if field in SECTIONS or field == "strikes":
            continue
        if getattr(effective, field) != getattr(floor, field):
            why = _SHARED_WHY.get(field, "it applies to every detector")
            return field, f"a request may not change the operator's value ({why})"
    for name in SECTIONS:
        refused = _section_refusal(
            name,
            getattr(effective, name),
            getattr(floor, name),
            reply_limit=reply_limit,
            frozen=floor.strikes is not None,
        )
        if refused is not None:
            return refused
    return None


def _section_refusal(
    name: str, effective: Any, floor: Any, *, reply_limit: int | None, frozen: bool
) -> tuple[str, str] | None:
    if floor.enabled:
        if not effective.enabled:
            return f"{name}.enabled", "the operator keeps this detector on"
        stops = frozenset() if frozen else STOP_FIELDS[name]
        for field in type(floor).__struct_fields__:
            value, own = getattr(effective, field), getattr(floor, field)
            if field in stops:
                if own is not None and (value is None or value > own):  # stops later (None: never)
                    return f"{name}.{field}", (
                        f"{_number(value)} is above the operator's {_number(own)} "
                        "(a request may only make a detector stop sooner)"
                    )
            elif value != own:
                why = "under strikes, only strikes.stop_at" if frozen else "only its stop levels"
                return f"{name}.{field}", (
                    f"a request may not change it ({why} may be lowered; the operator's "
                    f"value is {msgspec.to_builtins(own)!r})"
                )
        return None
    if not effective.enabled:
        return None
    if frozen:
        return f"{name}.enabled", "under strikes a request may not switch on a detector"
    for field in _HOLD_FIELDS:
        if getattr(effective, field, None) is not None:
            return f"{name}.{field}", (
                "a detector a request switches on may only stop the run (a warning or a "
                "refusal can hide the operator's detectors): leave it null"
            )
    if name == "content" and effective.stop_at_offence != 1:
        return f"{name}.stop_at_offence", (
            "a content detector a request switches on must stop the run at its first offence (1)"
        )
    if name == "llm_check" and reply_limit is not None and effective.max_tokens > reply_limit:
        return f"{name}.max_tokens", (
            f"{effective.max_tokens} is above the operator's ceiling of {reply_limit} tokens "
            "for a model reply (max_output_tokens)"
        )
    return None
