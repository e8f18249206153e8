"""Budget and price config: file keys map to run settings; bad values name their key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import Config, ModelPrice, load_config, run_settings
from orchestrator.errors import ConfigError

PRICED = """
[model]
model = "gpt-4o"

[budget]
max_output_tokens = 30000
max_input_tokens = 400000
max_cost = 1.5
mode = "target"
on_stop = "answer"
answer_max_tokens = 300
answer_deadline_seconds = 20

[prices."gpt-4o"]
input_per_million = 2.5
output_per_million = 10.0
"""


ONE = ModelPrice(input_per_million=1, output_per_million=1)


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Config:
    path = tmp_path / "loopfuse.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ=environ or {})


def test_budget_keys_and_prices_reach_the_run_settings(tmp_path: Path) -> None:
    config = load(tmp_path, PRICED)
    settings = run_settings(config)
    assert (settings.output_token_budget, settings.input_token_budget) == (30_000, 400_000)
    assert (settings.cost_budget, settings.budget_mode, settings.on_stop) == (
        1.5,
        "target",
        "answer",
    )
    assert (settings.answer_max_tokens, settings.answer_deadline_seconds) == (300, 20.0)
    assert (settings.input_price_per_million, settings.output_price_per_million) == (2.5, 10.0)
    # The per-reply cap is another key, untouched by the run's budget.
    assert settings.max_output_tokens == config.model.max_output_tokens != 30_000


def test_defaults_set_no_token_budget() -> None:
    settings = run_settings(Config())
    assert settings.output_token_budget is None
    assert settings.input_token_budget is None
    assert settings.cost_budget is None
    assert (settings.budget_mode, settings.on_stop) == ("ceiling", "keep")


def test_environment_and_run_overrides(tmp_path: Path) -> None:
    config = load(tmp_path, PRICED, {"LOOPFUSE_BUDGET__MAX_OUTPUT_TOKENS": "5000"})
    assert config.budget.max_output_tokens == 5_000
    settings = run_settings(
        config, {"output_token_budget": 800, "budget_mode": "ceiling", "input_price_per_million": 1}
    )
    assert (settings.output_token_budget, settings.budget_mode) == (800, "ceiling")
    assert (settings.input_price_per_million, settings.output_price_per_million) == (1.0, 10.0)


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("[budget]\nmax_output_tokens = 0\n", "budget.max_output_tokens", ">= 1"),
        ("[budget]\nmax_cost = -2\n", "budget.max_cost", "> 0"),
        ('[budget]\nmode = "goal"\n', "budget.mode", "Invalid enum value 'goal'"),
        ('[budget]\non_stop = "retry"\n', "budget.on_stop", "Invalid enum value 'retry'"),
        (
            '[prices."gpt-4o"]\ninput_per_million = -1\noutput_per_million = 10\n',
            'prices."gpt-4o".input_per_million',
            ">= 0",
        ),
        (
            '[prices."gpt-4o"]\ninput_per_million = 2.5\n',
            'prices."gpt-4o"',
            "missing required field `output_per_million`",
        ),
        (
            '[prices."gpt-4o"]\ninput_per_million = 1\noutput_per_million = 1\ncurrency = "EUR"\n',
            'prices."gpt-4o".currency',
            "unknown key",
        ),
    ],
)
def test_a_bad_budget_or_price_names_the_key(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert caught.value.key == key
    assert reason in caught.value.reason


def test_a_cost_budget_needs_the_runs_model_to_have_a_price(tmp_path: Path) -> None:
    config = load(tmp_path, PRICED)
    with pytest.raises(ConfigError) as caught:
        run_settings(config, {"model": "gpt-5"})
    assert caught.value.key == 'prices."gpt-5"'
    assert "gpt-5" in str(caught.value)
    # A price given with the run is enough.
    settings = run_settings(
        config,
        {"model": "gpt-5", "input_price_per_million": 1.25, "output_price_per_million": 10},
    )
    assert settings.cost_budget == 1.5


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"output_token_budget": 0}, "config.output_token_budget"),
        ({"budget_mode": "goal"}, "config.budget_mode"),
        ({"on_stop": "retry"}, "config.on_stop"),
        ({"answer_max_tokens": 0}, "config.answer_max_tokens"),
        ({"cost_budget": "cheap"}, "config.cost_budget"),
    ],
)
def test_a_bad_run_override_names_the_key(overrides: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        run_settings(
            Config(prices={"completed": ModelPrice(input_per_million=1, output_per_million=1)}),
            overrides,
        )
    assert caught.value.key == key
