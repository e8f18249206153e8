"""Typed config: TOML file, LOOPFUSE_* environment overrides, errors naming key and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.context import ContextPolicy
from actors.llm.settings import EndpointLimits, EndpointSettings, endpoint_settings
from actors.tools import ToolExecutorSettings
from orchestrator.config import Config, ModelSettings, context_policy, load_config, run_settings
from orchestrator.errors import ConfigError
from orchestrator.runtime.runtime import tool_executor_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "loopfuse.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_need_no_file_and_no_environment() -> None:
    config = load_config(environ={})
    assert config == Config()
    assert config.model.base_url is None  # the embedded simulator


def test_file_then_environment_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, '[budget]\nmax_turns = 7\n[model]\nmodel = "m1"\n')
    config = load_config(
        path,
        environ={
            "LOOPFUSE_BUDGET__MAX_TOOL_CALLS": "9",
            "LOOPFUSE_MODEL__MODEL": "m2",
            "LOOPFUSE_MODEL__BASE_URL": "http://127.0.0.1:9/v1",
            "LOOPFUSE_LOG_LEVEL": '"debug"',
            "UNRELATED": "x",
        },
    )
    assert (config.budget.max_turns, config.budget.max_tool_calls) == (7, 9)
    assert config.model.model == "m2"
    assert config.model.base_url == "http://127.0.0.1:9/v1"
    assert config.log_level == "debug"


def test_config_file_named_by_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[runtime]\nmax_concurrent_runs = 3\n")
    config = load_config(environ={"LOOPFUSE_CONFIG": str(path)})
    assert config.runtime.max_concurrent_runs == 3


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("[budget]\nmax_turns = 0\n", "budget.max_turns", ">= 1"),
        ('[budget]\nmax_turns = "ten"\n', "budget.max_turns", "Expected `int`, got `str`"),
        ("[budget]\nmax_turnz = 3\n", "budget.max_turnz", "unknown key"),
        ("[nonsense]\nx = 1\n", "nonsense", "unknown key"),
        ('log_level = "loud"\n', "log_level", "Invalid enum value 'loud' (one of: 'debug', 'info'"),
        ("[model]\ntimeout_seconds = -1\n", "model.timeout_seconds", "> 0"),
        ('[tools]\nenabled = "read_file"\n', "tools.enabled", "Expected `array`"),
    ],
)
def test_a_bad_file_names_the_key_and_the_reason(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert caught.value.key == key
    assert reason in caught.value.reason
    assert key in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_bad_environment_value_names_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ={"LOOPFUSE_BUDGET__DEADLINE_SECONDS": "soon"})
    assert caught.value.key == "budget.deadline_seconds"
    with pytest.raises(ConfigError, match="malformed"):
        load_config(environ={"LOOPFUSE_BUDGET____X": "1"})


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.toml", environ={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[budget\n"), environ={})


def test_run_settings_take_the_config_defaults_and_the_overrides() -> None:
    settings = run_settings(Config(), {"max_turns": 2, "model": "x"})
    assert (settings.max_turns, settings.model) == (2, "x")
    assert settings.max_tool_calls == Config().budget.max_tool_calls
    with pytest.raises(ConfigError) as caught:
        run_settings(Config(), {"deadline_seconds": 0})
    assert caught.value.key == "config.deadline_seconds"


def test_the_model_section_is_the_llm_callers_endpoint_limits(tmp_path: Path) -> None:
    # One definition: the defaults are the documented ones (README: a 30 s Retry-After cap)
    # on both sides, and every limit set under [model] reaches the endpoint.
    assert ModelSettings().retry_after_cap_seconds == 30.0
    assert EndpointSettings(base_url="http://127.0.0.1:9/v1").retry_after_cap_seconds == 30.0
    defaults = EndpointLimits()
    limits = {name: getattr(defaults, name) * 2 + 1 for name in EndpointLimits.__struct_fields__}
    text = "[model]\n" + "".join(f"{name} = {value}\n" for name, value in limits.items())
    config = load_config(write(tmp_path, text), environ={})
    endpoint = endpoint_settings(config.model, base_url="http://127.0.0.1:9/v1", api_key="k")
    assert {name: getattr(endpoint, name) for name in EndpointLimits.__struct_fields__} == limits
    assert (endpoint.base_url, endpoint.api_key) == ("http://127.0.0.1:9/v1", "k")


def test_the_tools_and_context_sections_take_the_actors_defaults() -> None:
    config = Config()
    assert tool_executor_settings(config) == ToolExecutorSettings()
    policy = context_policy(config, run_settings(config))
    assert policy == ContextPolicy(window=policy.window, output_reserve=policy.output_reserve)
