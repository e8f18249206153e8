"""Defaults that fit small windows (#29, #30 item 4): the safety buffer and the output
reservation scale with the context window, so a 2,048-token model and the README's
8,192-token llama-cpp-python config run with no context settings (docs/context.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from actors.context.policy import OUTPUT_SHARE, SAFETY_BUFFER, SAFETY_SHARE, scaled_reserve
from bus import ExitReason, ModelRequest
from orchestrator.config import Config, ContextSettings, context_policy, load_config, run_settings
from orchestrator.errors import ConfigError
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import run_scenario
from orchestrator.sim import parse_scenario

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.parametrize(
    ("window", "kept"),
    [
        (2_048, (204, 512)),
        (8_192, (819, 2_048)),
        (32_768, (SAFETY_BUFFER, 8_192)),  # the caps: the default values
        (200_000, (SAFETY_BUFFER, 8_192)),
    ],
)
def test_default_reserves_are_capped_at_a_share_of_the_window(
    window: int, kept: tuple[int, int]
) -> None:
    safety = scaled_reserve(SAFETY_BUFFER, default=SAFETY_BUFFER, window=window, share=SAFETY_SHARE)
    output = scaled_reserve(8_192, default=8_192, window=window, share=OUTPUT_SHARE)
    assert (safety, output) == kept


def test_a_reserve_the_operator_set_is_kept_and_one_too_large_refused() -> None:
    config = Config(context=ContextSettings(safety_buffer_tokens=600, windows={"m": 512}))
    with pytest.raises(ConfigError) as no_room:
        context_policy(config, run_settings(config, {"model": "m"}))
    assert no_room.value.key == "config.context_safety_buffer"
    assert "safety buffer (600)" in no_room.value.reason
    assert "512-token" in no_room.value.reason
    kept = Config(context=ContextSettings(safety_buffer_tokens=100, windows={"m": 2_048}))
    policy = context_policy(kept, run_settings(kept, {"model": "m", "max_output_tokens": 1_500}))
    assert (policy.safety_buffer, policy.output_reserve) == (100, 1_500)


def test_the_readme_s_local_server_config_runs_as_written(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Local and self-hosted servers", 1)[1]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    config_file = tmp_path / "loopfuse.toml"
    config_file.write_text(block.group(1), encoding="utf-8")
    config = load_config(config_file, environ={})
    policy = context_policy(config, run_settings(config))  # raised ConfigError before
    assert policy.window == 8_192
    assert (policy.safety_buffer, policy.output_reserve) == (819, 2_048)
    assert policy.limit == 8_192 - 819 - 2_048


SMALL = """
task = "Look at the folder and say what it holds."
context_window = 2048          # the server's own window: it refuses longer prompts
wire = true

[config]
context_window = 2048          # what loopfuse is told: nothing else about the context

[folder]
"README.txt" = "Yeast growth curves at 30 C.\\n"

[[steps]]
tool_calls = [{ name = "list_dir", arguments = { path = "." } }]

[[steps]]
text = "Yeast growth curves."

[expect]
exit_reason = "completed"
"""


@pytest.mark.asyncio
async def test_a_2k_window_model_runs_with_no_context_settings() -> None:
    scenario = parse_scenario(SMALL, source="small_window.toml", name="small_window")
    async with Runtime(scenarios=[scenario]) as runtime:
        result = await run_scenario(runtime, scenario)
        requests = [
            e for e in runtime.event_log.events(result.run_id) if isinstance(e, ModelRequest)
        ]
    assert (result.exit_reason, result.cause) == (ExitReason.COMPLETED, "model.end_turn")
    assert result.llm_requests == 2
    # the reply may take a quarter of the window: max_tokens asks for no more than that
    assert [r.max_tokens for r in requests] == [512, 512]
