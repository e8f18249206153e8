"""Typed configuration (a TOML file, then ``LOOPFUSE_*`` environment overrides, then
defaults) and what is derived from it for a run.

Its parts: the settings declaration (:mod:`orchestrator.settings`: the value types with their
ranges, every run setting once, the client policy), the sections
(:mod:`orchestrator.config_sections`), loading and its errors
(:mod:`orchestrator.config_load`). This module gives them one name and derives a run's
settings, context policy and request options from a :class:`Config`.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from actors.context import (
    SAFETY_BUFFER,
    ContextPolicy,
    match_model,
    policy_problems,
    warn_default_window,
    window_for,
)
from actors.context.policy import OUTPUT_SHARE, SAFETY_SHARE, scaled_reserve
from actors.llm.settings import TOOL_CHOICE_MODES, RequestOptions
from actors.loop import LoopConfig, LoopConfigError, ResultPattern, check_config
from orchestrator.config_load import convert, load_config
from orchestrator.config_sections import (
    BudgetSettings,
    Config,
    ContextSettings,
    DaemonSettings,
    LoopSettings,
    McpSettings,
    ModelCapabilities,
    ModelPrice,
    ModelSettings,
    RuntimeSettings,
    ToolSettings,
    TracingSettings,
)
from orchestrator.errors import ConfigError
from orchestrator.settings import (
    CACHE_HITS_MAX,
    DEFAULT_CLIENT_KEYS,
    MAX_OUTPUT_TOKENS,
    OUTPUT_RESERVE,
    RUN_KEYS,
    ClientCeilings,
    ClientKey,
    ClientOverrides,
    LoopPreset,
    RunSettings,
)

__all__ = [
    "CACHE_HITS_MAX",
    "DEFAULT_CLIENT_KEYS",
    "RUN_KEYS",
    "BudgetSettings",
    "ClientCeilings",
    "ClientKey",
    "ClientOverrides",
    "Config",
    "ContextSettings",
    "DaemonSettings",
    "LoopPreset",
    "LoopSettings",
    "McpSettings",
    "ModelCapabilities",
    "ModelPrice",
    "ModelSettings",
    "RunSettings",
    "RuntimeSettings",
    "ToolSettings",
    "TracingSettings",
    "check_tool_choice",
    "context_policy",
    "load_config",
    "merge_loop_overrides",
    "model_reads_images",
    "request_options",
    "run_settings",
]


def model_reads_images(config: Config, model: str) -> bool:
    """Whether ``[models."<model>"]`` says ``vision = true`` (default: no)."""
    capabilities = config.models.get(model)
    return capabilities is not None and capabilities.vision


def request_options(config: Config) -> tuple[RequestOptions, dict[str, RequestOptions]]:
    """How requests are shaped: ``[model]``'s options, and each ``[models."<id>"]`` that
    sets one of them (its unset keys ``[model]``'s)."""
    default = RequestOptions(
        **{k: getattr(config.model, k) for k in RequestOptions.__struct_fields__}
    )
    own: dict[str, RequestOptions] = {}
    for name, caps in config.models.items():
        changes = {k: getattr(caps, k) for k in _PER_MODEL if getattr(caps, k) is not None}
        if changes:
            own[name] = msgspec.structs.replace(default, **changes)
    return default, own


_PER_MODEL: Final = ("stream", "tool_choice", "reset_tool_choice")
"""The request options a ``[models."<id>"]`` table may set."""


def check_tool_choice(config: Config, model: str, tools: tuple[str, ...]) -> None:
    """A ``tool_choice`` naming a tool must name one of a run's ``tools`` (nothing is sent
    to a run without tools, so nothing is checked).

    :raises ConfigError: naming the key that set it (``model.tool_choice`` or
        ``models."<model>".tool_choice``).
    """
    caps = config.models.get(model)
    key = f'models."{model}".tool_choice'
    choice = caps.tool_choice if caps is not None else None
    if choice is None:
        key, choice = "model.tool_choice", config.model.tool_choice
    if not tools or choice in TOOL_CHOICE_MODES or choice in tools:
        return
    raise ConfigError(
        key,
        f"names the tool {choice!r}, which is not among the run's tools "
        f"({', '.join(tools)}); use one of them, or 'auto', 'none' or 'required'",
    )


_CONTEXT_KEYS: Final = {
    "window": "config.context_window",
    "safety_buffer": "config.context_safety_buffer",
    "output_reserve": "config.context_output_reserve",
    "collapse_at": "config.context_collapse_at",
    "keep_recent_turns": "config.context_keep_turns",
}


def context_policy(config: Config, settings: RunSettings) -> ContextPolicy:
    """The context limits of a run: its window (``context_window``, else by model name
    from ``[context]``) and the room kept free of it: the safety buffer and the output
    reservation; at their defaults each is capped at its share of the window
    (:func:`~actors.context.policy.scaled_reserve`), values the operator set are kept.

    :raises ConfigError: they leave no room for a prompt, or a value is out of range.
    """
    context = config.context
    configured = settings.context_window or match_model(settings.model, context.windows)
    window = configured or window_for(settings.model, default=context.default_window)
    if configured is None and config.model.base_url and window_for(settings.model, default=0) == 0:
        warn_default_window(settings.model, window)  # once per model
    collapse_at = settings.context_collapse_at
    reserve, default = (
        (settings.max_output_tokens, MAX_OUTPUT_TOKENS)
        if settings.max_output_tokens
        else (settings.context_output_reserve, OUTPUT_RESERVE)
    )
    policy = ContextPolicy(
        window=window,
        safety_buffer=scaled_reserve(
            settings.context_safety_buffer, default=SAFETY_BUFFER, window=window, share=SAFETY_SHARE
        ),
        output_reserve=scaled_reserve(reserve, default=default, window=window, share=OUTPUT_SHARE),
        collapse_at=collapse_at,
        collapse_to=min(context.collapse_to, collapse_at) if collapse_at else context.collapse_to,
        keep_recent_turns=settings.context_keep_turns,
        fold_min_chars=context.fold_min_chars,
        summary_max_tokens=context.summary_max_tokens,
        silent_truncation_ratio=context.silent_truncation_ratio,
        tool_result_share=context.tool_result_share,
        window_configured=configured is not None,
    )
    for name, reason in policy_problems(policy):
        key = _CONTEXT_KEYS.get(name, f"context.{name}")
        raise ConfigError(key, f"{reason} (model {settings.model!r})")
    return policy


_DEFAULTS: Final = tuple(
    (key, operator.attrgetter(run.default)) for key, run in RUN_KEYS.items() if run.default
)
"""Each run key with a config default, and the getter of that config key."""


def run_settings(
    config: Config, overrides: Mapping[str, Any] | None = None, *, source: str = "run"
) -> RunSettings:
    """The flat settings of one run: ``config``'s defaults with ``overrides`` on top.

    :raises ConfigError: an override names an unknown key or has a bad value, or a cost
        budget is set for a model with no price (key ``prices."<model>"``).
    """
    data = {key: default(config) for key, default in _DEFAULTS}
    data.update(overrides or {})
    settings = convert(data, RunSettings, prefix="config", source=source)
    # The run model's prices filled in: a cost budget needs them.
    price = config.prices.get(settings.model)
    if price is not None:
        own_in, own_out = settings.input_price_per_million, settings.output_price_per_million
        settings = msgspec.structs.replace(
            settings,
            input_price_per_million=price.input_per_million if own_in is None else own_in,
            output_price_per_million=price.output_per_million if own_out is None else own_out,
        )
    if settings.cost_budget is not None and (
        settings.input_price_per_million is None or settings.output_price_per_million is None
    ):
        raise ConfigError(
            f'prices."{settings.model}"',
            f"a cost budget needs the price of model {settings.model!r}: set "
            "input_per_million and output_per_million",
            source=source,
        )
    return settings


def _merged(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, dict):
            merged[key] = _merged(below, value)
        else:
            merged[key] = value
    return merged


def merge_loop_overrides(
    base: LoopConfig,
    overrides: Mapping[str, Any],
    *,
    source: str = "run",
    result_patterns: tuple[ResultPattern, ...] = (),
    llm_check_model: str = "",
    notes: list[str] | None = None,
) -> LoopConfig:
    """``base`` (a loop preset) with a run's ``loop`` table on top: tables merge key by key
    (``ping_pong = {break_at = 30}`` keeps the preset's other ping-pong keys), anything else
    replaces (``poll_tools = [...]`` replaces the preset's list). ``result_patterns`` (the
    operator's ``[loop] result_patterns``) and ``llm_check_model`` are set last; a run's
    table may not set them. With ``notes``, each threshold clamped is said there (a
    sentence naming it and the value used) as well as logged.

    :raises ConfigError: a key is unknown or a value is bad, as the loop package checks
        them; the key is named ``config.loop.<key>``.
    """
    if "result_patterns" in overrides:
        raise ConfigError(
            "config.loop.result_patterns",
            "operator config only: set [loop] result_patterns in the config file",
            source=source,
        )
    llm_check = overrides.get("llm_check")
    if isinstance(llm_check, Mapping) and "model" in llm_check:
        raise ConfigError(
            "config.loop.llm_check.model",
            "operator config only: set [loop] llm_check_model in the config file",
            source=source,
        )
    if result_patterns:
        base = msgspec.structs.replace(base, result_patterns=result_patterns)
    if llm_check_model:
        llm = msgspec.structs.replace(base.llm_check, model=llm_check_model)
        base = msgspec.structs.replace(base, llm_check=llm)
    if not overrides:
        return check_config(base, notes=notes) if result_patterns or llm_check_model else base
    data = _merged(msgspec.to_builtins(base), overrides)
    config = convert(data, LoopConfig, prefix="config.loop", source=source)
    try:
        return check_config(config, notes=notes)
    except LoopConfigError as exc:
        key, _, reason = str(exc).partition(": ")
        raise ConfigError(f"config.loop.{key}", reason or str(exc), source=source) from None
