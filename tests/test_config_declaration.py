"""The run settings are declared once (``orchestrator.config.RUN_KEYS``): the defaults a run
gets, who may set a key from a request, and the docs table all derive from it."""

from __future__ import annotations

import dataclasses
import functools
import typing
from pathlib import Path

import msgspec
import pytest

from bus import RunStarted
from bus.causes import CAUSE_TABLE
from orchestrator.conductor import ConductorSettings
from orchestrator.config import (
    DEFAULT_CLIENT_KEYS,
    RUN_KEYS,
    BudgetSettings,
    ClientCeilings,
    ClientKey,
    Config,
    ContextSettings,
    RunSettings,
    ToolSettings,
    run_settings,
)
from orchestrator.daemon.policy import CEILINGED
from orchestrator.runtime.runtime import conductor_settings
from tests.config_docs import BUDGET_LIMITS, generated_tables

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_run_setting_is_declared_once() -> None:
    assert tuple(sorted(RUN_KEYS)) == tuple(sorted(RunSettings.__struct_fields__))


def test_a_declared_default_is_read_from_its_config_key() -> None:
    config = Config(context=ContextSettings(keep_recent_turns=7, collapse_at=0.5))
    settings = run_settings(config)
    for key, run in RUN_KEYS.items():
        if run.default:
            value = functools.reduce(getattr, run.default.split("."), config)
            assert getattr(settings, key) == value, key
    assert (settings.context_keep_turns, settings.context_collapse_at) == (7, 0.5)


def test_the_client_policy_derives_from_the_declaration() -> None:
    keys = typing.get_args(ClientKey)
    assert keys == tuple(key for key, run in RUN_KEYS.items() if run.client != "operator")
    assert set(DEFAULT_CLIENT_KEYS) < set(keys)
    assert "hooks" not in keys
    assert "max_cache_hits" not in keys
    assert set(keys) >= CEILINGED


def test_a_ceiling_has_its_run_setting_s_type_and_range() -> None:
    declared = {key for key, run in RUN_KEYS.items() if run.ceiling}
    assert set(ClientCeilings.__struct_fields__) == CEILINGED == declared
    assert {"max_turns", "cost_budget", "answer_max_tokens"} <= declared
    run = typing.get_type_hints(RunSettings, include_extras=True)
    ceilings = typing.get_type_hints(ClientCeilings, include_extras=True)
    for key, kind in ceilings.items():
        own = run[key]
        assert kind in (own | None, own), key


def test_each_budget_cause_names_the_budget_key_that_sets_it() -> None:
    # docs/budgets.md's table: a budget cause without its key, or a key without its cause,
    # fails here.
    assert set(BUDGET_LIMITS) == {cause for cause in CAUSE_TABLE if cause.startswith("budget.")}
    keys = {f"budget.{limit.key}" for limit in BUDGET_LIMITS.values()}
    assert {limit.key for limit in BUDGET_LIMITS.values()} <= set(BudgetSettings.__struct_fields__)
    assert keys <= {run.default for run in RUN_KEYS.values()}


@pytest.mark.parametrize("page", sorted(generated_tables()))
def test_the_docs_tables_are_generated_from_the_declaration(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    for table in generated_tables()[page]:
        assert table in text, (
            f"docs/{page} is out of date: regenerate its table with `python -m tests.config_docs`"
        )


def test_the_run_settings_a_run_carries_have_no_default_of_their_own() -> None:
    # A default beside the declaration's is a twin (RunStarted once had cache_max_entries=0
    # where the declaration says 256): the conductor fills each of them from the run's settings.
    message = {f.name: f.required for f in msgspec.structs.fields(RunStarted)}
    carried = set(message) & set(RUN_KEYS)
    assert {"max_turns", "cache_max_entries", "budget_mode"} <= carried
    assert {key for key in carried if not message[key]} == set()
    # …and the conductor fills each from its settings (``tools``: the names of the specs)
    assert carried - {"tools"} <= set(ConductorSettings.__dataclass_fields__)
    conductor = {f.name: f for f in dataclasses.fields(ConductorSettings)}
    assert set(conductor) <= set(RUN_KEYS)
    defaulted = [
        name
        for name, f in conductor.items()
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert defaulted == []


def test_a_run_carries_the_declared_defaults() -> None:
    settings = run_settings(Config())
    conductor = conductor_settings(settings)
    for f in dataclasses.fields(ConductorSettings):
        declared = getattr(settings, f.name)
        assert getattr(conductor, f.name) in (declared, declared or 0), f.name  # None: 0
    assert conductor.cache_max_entries == ToolSettings().cache_max_entries == 256
