"""What an API request may ask of a run: the operator's policy at the daemon's door.

A request body is untrusted, authenticated or not. :func:`admit` checks a ``POST /v1/runs``
request against the operator's config when the daemon (or a fleet member) accepts it and
again when it starts it, so a stored request never gets more than the policy of the daemon
that runs it (``docs/security.md``, "What a client may set", "Folders and scenarios"):
``scenario`` is a name the daemon serves, never a path; ``config`` sets only the keys
``daemon.client_overrides.allowed`` lists, judged by their effect on the run's effective
settings, whichever key set a value (every budget against its ceiling, the loop config
against the operator's: :mod:`orchestrator.daemon.loop_floor`); ``folder`` must resolve
(symlinks followed) inside one of ``daemon.folder_roots``, and with none no request may name
a folder.

Every refusal is an :class:`ApiError` 422 naming the key. The CLI and the library are the
operator: :class:`~orchestrator.runtime.RunSpec` and friends take any setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import msgspec

from actors.loop import PRESETS, LoopConfig, check_config
from actors.loop.presets import OFF
from orchestrator.config import (
    RUN_KEYS,
    ClientCeilings,
    ClientOverrides,
    Config,
    RunSettings,
    merge_loop_overrides,
    run_settings,
)
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.loop_floor import loop_refusal
from orchestrator.daemon.schemas import RunRequest
from orchestrator.errors import ConfigError
from orchestrator.sim import Scenario

__all__ = ["Admitted", "Policy", "admit", "allowed_models", "resolve_folder"]

CEILINGED: Final = frozenset(ClientCeilings.__struct_fields__)
"""Numbers a request may lower but not raise above the operator's value or ceiling."""

_OPERATOR_ONLY: Final = {key: run.never for key, run in RUN_KEYS.items() if run.never}
_PIPELINE_KEYS: Final = frozenset({"on_crash"})


class Admitted(NamedTuple):
    """A request the policy let through."""

    request: RunRequest
    scenario: Scenario | None
    """The scenario it names, with the request's ``config`` on top of the scenario's."""
    folder: str | None
    """``request.folder`` resolved (symlinks followed), inside a root."""
    settings: RunSettings
    """The run's effective settings (a pipeline's stages have their own; its ``on_crash``
    is the run's)."""


def admit(request: RunRequest, config: Config, scenarios: Mapping[str, Scenario]) -> Admitted:
    """Check ``request`` against ``config``'s policy (see the module docstring).

    :raises ApiError: 422 naming the offending key.
    """
    return Policy(config, scenarios).admit(request)


class Policy:
    """The operator's policy of one daemon, for many requests: :meth:`admit` is
    :func:`admit`, with the settings a run gets before a request's ``config`` (the
    operator's, under a scenario's own) worked out once per scenario, not per request."""

    def __init__(self, config: Config, scenarios: Mapping[str, Scenario]) -> None:
        self.config = config
        self.scenarios = scenarios
        self._bases: dict[str | None, tuple[Scenario | None, RunSettings]] = {}
        """Per scenario name (``None``: a task), the scenario and its runs' settings."""

    def admit(self, request: RunRequest) -> Admitted:
        """Check ``request`` against the policy (see the module docstring).

        :raises ApiError: 422 naming the offending key.
        """
        config = self.config
        _check_shape(request)
        folder = resolve_folder(request.folder, config) if request.folder is not None else None
        client = dict(request.config)
        if request.pipeline is not None:
            _check_keys(client, config.daemon.client_overrides, allowed=_PIPELINE_KEYS)
            return Admitted(request, None, folder, _settings(config, client))
        # A scenario is a name, never a path: nothing is looked up on disk.
        scenario = self.scenarios.get(request.scenario) if request.scenario is not None else None
        if request.scenario is not None and scenario is None:
            raise ApiError(
                422,
                "unknown_scenario",
                f"no scenario named {request.scenario!r}; GET /v1/scenarios lists them",
                key="scenario",
            )
        operator: dict[str, Any] = (
            {"model": scenario.name, **scenario.config} if scenario is not None else {}
        )
        policy = config.daemon.client_overrides
        _check_keys(client, policy)
        base = self._base(scenario, operator)
        settings = _settings(config, {**operator, **client}) if client else base
        for key in client:
            _check_value(key, settings, base, config, policy)
        _check_effect(settings, base, config, policy)
        if scenario is not None and client:
            scenario = msgspec.structs.replace(scenario, config={**scenario.config, **client})
        return Admitted(request, scenario, folder, settings)

    def _base(self, scenario: Scenario | None, operator: Mapping[str, Any]) -> RunSettings:
        name = scenario.name if scenario is not None else None
        known = self._bases.get(name)
        if known is not None and known[0] is scenario:
            return known[1]
        base = _settings(self.config, operator)
        self._bases[name] = (scenario, base)
        return base


def _check_shape(request: RunRequest) -> None:
    if request.scenario is not None:
        for name in ("task", "pipeline", "system", "folder"):
            if getattr(request, name) is not None:
                raise ApiError(
                    422,
                    "conflicting_fields",
                    f"`{name}` cannot be combined with `scenario`",
                    key=name,
                )
    elif request.pipeline is not None:
        if request.task is not None:
            raise ApiError(
                422, "conflicting_fields", "`task` cannot be combined with `pipeline`", key="task"
            )
        if request.folder is None:
            raise ApiError(422, "missing_field", "a `pipeline` needs a `folder`", key="folder")
    elif request.task is None:
        raise ApiError(
            422, "missing_field", "give a `task`, a `pipeline` or a `scenario`", key="task"
        )


def _settings(config: Config, overrides: Mapping[str, Any]) -> RunSettings:
    try:
        return run_settings(config, overrides, source="request")
    except ConfigError as exc:
        raise ApiError(422, "invalid_config", exc.reason, key=exc.key) from None


def _refuse(key: str, why: str) -> ApiError:
    return ApiError(422, "override_not_allowed", f"`config.{key}`: {why}", key=f"config.{key}")


def _check_keys(
    client: Mapping[str, Any], policy: ClientOverrides, *, allowed: frozenset[str] | None = None
) -> None:
    for key in client:
        if key not in RunSettings.__struct_fields__:
            raise ApiError(422, "invalid_config", "unknown key", key=f"config.{key}")
        if key in _OPERATOR_ONLY:
            raise _refuse(key, f"a request may never set it ({_OPERATOR_ONLY[key]})")
        if allowed is not None and key not in allowed:
            raise _refuse(
                key, f"a pipeline run takes only {sorted(allowed)} from `config`, not {key!r}"
            )
        if key not in policy.allowed:
            raise _refuse(
                key,
                "not allowed by daemon.client_overrides.allowed (the operator's policy "
                f"lets a request set: {', '.join(policy.allowed) or 'nothing'})",
            )


def _check_value(
    key: str, settings: RunSettings, base: RunSettings, config: Config, policy: ClientOverrides
) -> None:
    value, own = getattr(settings, key), getattr(base, key)
    if key in CEILINGED:
        ceiling = getattr(policy.ceilings, key)
        limit = ceiling if ceiling is not None else own
        where = f"daemon.client_overrides.ceilings.{key}" if ceiling is not None else "the run's"
        if limit is None:
            return
        if value is None:
            raise _refuse(key, f"the operator's limit of {_number(limit)} ({where}) stays")
        if value > limit:
            raise _refuse(
                key,
                f"{_number(value)} is above the operator's ceiling of {_number(limit)} ({where}; "
                f"daemon.client_overrides.ceilings.{key} raises it)",
            )
    elif key == "model" and value != own:
        models = allowed_models(config)
        if value not in models:
            raise _refuse(
                key,
                f"{value!r} is not a model this daemon offers (model.model, [models], "
                f"[prices], daemon.client_overrides.models: {', '.join(sorted(models))})",
            )
    elif key == "loop_preset" and value != own and value not in policy.loop_presets:
        raise _refuse(
            key,
            f"{value!r} is not allowed by daemon.client_overrides.loop_presets "
            f"({', '.join(policy.loop_presets) or 'none'})",
        )
    elif key == "tools":
        extra = [name for name in value if name not in own]
        if extra:
            raise _refuse(
                key,
                f"{', '.join(extra)} not among the run's tools ({', '.join(own)}); "
                "a request may only leave tools out",
            )


def _check_effect(
    settings: RunSettings, base: RunSettings, config: Config, policy: ClientOverrides
) -> None:
    """Check what the request's ``config`` does to the run, whichever key did it: every
    ceilinged number that differs from the operator's, and the effective loop config
    against the operator's (the floor) when the request sets ``loop`` or ``loop_preset``."""
    for key in CEILINGED:
        if getattr(settings, key) != getattr(base, key):
            _check_value(key, settings, base, config, policy)
    if settings.loop == base.loop and settings.loop_preset == base.loop_preset:
        return
    preset = PRESETS.get(settings.loop_preset, OFF)
    effective = _loop_config(preset, settings.loop, config)
    floor = _loop_config(preset, base.loop, config)
    ceiling = policy.ceilings.max_output_tokens
    refused = loop_refusal(
        effective, floor, reply_limit=ceiling if ceiling is not None else base.max_output_tokens
    )
    if refused is not None:
        key, why = refused
        raise _refuse(f"loop.{key}", why)


def _loop_config(preset: LoopConfig, table: Mapping[str, Any], config: Config) -> LoopConfig:
    """The loop config a run gets from ``preset`` and its ``loop`` table, as the runtime
    builds it, checked (levels clamped) as the detector uses it."""
    try:
        merged = merge_loop_overrides(
            preset,
            table,
            source="request",
            result_patterns=config.loop.result_patterns,
            llm_check_model=config.loop.llm_check_model,
        )
    except ConfigError as exc:
        raise ApiError(422, "invalid_config", exc.reason, key=exc.key) from None
    return check_config(merged)


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def allowed_models(config: Config) -> frozenset[str]:
    """The models a request may choose: ``model.model``, the names under ``[models]`` and
    ``[prices]``, and ``daemon.client_overrides.models``."""
    return frozenset(
        (
            config.model.model,
            *config.models,
            *config.prices,
            *config.daemon.client_overrides.models,
        )
    )


def resolve_folder(folder: str, config: Config) -> str:
    """``folder`` with its symlinks resolved, if that is inside one of
    ``daemon.folder_roots`` and a directory.

    A refusal says nothing about what exists outside the roots.

    :raises ApiError: 422 ``folder_not_allowed`` (no roots, or outside them) or
        ``invalid_folder`` (inside, but not a directory), naming ``folder``.
    """
    roots = config.daemon.folder_roots
    if not roots:
        raise ApiError(
            422,
            "folder_not_allowed",
            "this daemon takes no `folder` from a request: the operator enables folder "
            "runs by listing the folders they may read in daemon.folder_roots",
            key="folder",
        )
    outside = ApiError(
        422,
        "folder_not_allowed",
        "`folder` must be an absolute path inside one of the daemon's folder roots "
        "(daemon.folder_roots)",
        key="folder",
    )
    if not os.path.isabs(folder) or "\0" in folder:
        raise outside
    resolved = os.path.realpath(folder)
    if not any(_inside(resolved, os.path.realpath(root)) for root in roots):
        raise outside
    if not os.path.isdir(resolved):
        raise ApiError(422, "invalid_folder", f"{folder!r} is not a directory here", key="folder")
    return resolved


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
