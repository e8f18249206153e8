"""Every cause's hint matches the detail of a real run ending with it and names a next step.

A run per cause (a shipped scenario where one ends with it, else a small scenario written
here) through the real runtime and simulator; its result's hint is checked against its
detail: a config key the detail names is the key the hint says to change, a hint claims
nothing the detail contradicts (``context.prompt_too_long``: folded or not), and every hint
names an action and only config keys that exist.
"""

from __future__ import annotations

import re
from typing import Final

import anyio
import msgspec
import pytest

from bus import CAUSES, ExitReason, cause_hint
from orchestrator.config import Config, RunSettings
from orchestrator.daemon.recovery import crash_detail, crash_ending
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import run_scenario, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios

SHIPPED: Final = {scenario.name: scenario for scenario in shipped_scenarios()}

# Verbs a next step starts with (imperative, at the start of a clause).
_ACTIONS: Final = re.compile(
    r"(?:^|[;:,.] |\bor |\bthen )(raise|lower|check|resubmit|use|fix|say|set|accept|poll|give|"
    r"read|report|try|start|split|make|shorten|ask|add|name|change|nothing to do)\b",
    re.IGNORECASE,
)
_DOTTED_KEY: Final = re.compile(r"\b([a-z_]+)\.([a-z_]+)\b")
# A config key in parentheses: ``(max_turns)``, ``(budget.max_output_tokens)``.
_DETAIL_KEY: Final = re.compile(r"\(((?:[a-z]+\.)?[a-z]+_[a-z_]+)\)")


def _inline(name: str, body: str) -> Scenario:
    return parse_scenario(body, source=f"<{name}>", name=name)


# Causes no shipped scenario ends with: a scenario of a few lines that does.
INLINE: Final[dict[str, Scenario]] = {
    "budget.output_tokens": _inline(
        "hint_output_tokens",
        """
task = "Write a lot."
[config]
output_token_budget = 1000
[[steps]]
text_tokens = 600
tool_calls = [{ name = "list_dir", arguments = { path = "." } }]
repeat = true
[expect]
exit_reason = "max_turns"
cause = "budget.output_tokens"
""",
    ),
    "budget.input_tokens": _inline(
        "hint_input_tokens",
        """
task = "Read a lot."
[config]
input_token_budget = 1000
[[steps]]
tool_calls = [{ name = "list_dir", arguments = { path = "." } }]
usage = { prompt_tokens = 600 }
repeat = true
[expect]
exit_reason = "max_turns"
cause = "budget.input_tokens"
""",
    ),
    "budget.cost": _inline(
        "hint_cost",
        """
task = "Spend."
[config]
cost_budget = 0.01
input_price_per_million = 10.0
output_price_per_million = 10.0
[[steps]]
tool_calls = [{ name = "list_dir", arguments = { path = "." } }]
usage = { prompt_tokens = 600, completion_tokens = 100 }
repeat = true
[expect]
exit_reason = "max_turns"
cause = "budget.cost"
""",
    ),
    "model.bad_request": _inline(
        "hint_bad_request",
        """
task = "Anything."
[[steps]]
text = "never sent"
faults = [{ status = 400, message = "Unknown parameter: 'temprature'.", forever = true }]
[expect]
exit_reason = "aborted_streaming"
cause = "model.bad_request"
""",
    ),
    "loop.poll_no_progress": _inline(
        "hint_poll",
        """
task = "Wait for build 7."
[config]
loop_preset = "openclaw"
[config.loop]
record_blocked = true
poll_tools = [{ name = "job_status" }]
poll_no_progress = { warn_at = 2, block_at = 3, break_at = 4 }
[[tools]]
name = "job_status"
parameters = { job = "string" }
results = ["build 7: running"]
[[steps]]
tool_calls = [{ name = "job_status", arguments = { job = "build-7" } }]
repeat = true
[expect]
exit_reason = "hook_stopped"
cause = "loop.poll_no_progress"
""",
    ),
    "loop.progress_ceiling": _inline(
        "hint_progress_ceiling",  # a poll whose result changes every time, 50 times
        """
task = "Wait for the job."
[config]
max_turns = 60
[[tools]]
name = "job_status"
parameters = { job = "string" }
results = ["job 7: step {n} of 100 done"]
[[steps]]
tool_calls = [{ name = "job_status", arguments = { job = "7" } }]
repeat = true
[expect]
exit_reason = "hook_stopped"
cause = "loop.progress_ceiling"
""",
    ),
    "loop.tool_stagnation": _inline(
        "hint_tool_stagnation",
        """
task = "Search."
[config]
max_turns = 30
loop_preset = "qwen"
[[tools]]
name = "search"
parameters = { query = "string" }
results = ["no results for that query"]
[[steps]]
tool_calls = [{ name = "search", arguments = { query = "yeast {n}" } }]
repeat = true
[expect]
exit_reason = "hook_stopped"
cause = "loop.tool_stagnation"
""",
    ),
    "loop.error_streak": _inline(
        "hint_error_streak",  # a small model reading files at paths it invents (#32)
        """
task = "Read the six sensor files."
[config]
max_turns = 30
[folder]
"sensor_1.csv" = "t,v\\n0,1\\n"
[[steps]]
tool_calls = [{ name = "read_file", arguments = { path = "data/sensor_{n}.csv" } }]
repeat = true
[expect]
exit_reason = "hook_stopped"
cause = "loop.error_streak"
""",
    ),
    "loop.read_loop": _inline(
        "hint_read_loop",
        """
task = "Read."
[config]
max_turns = 40
loop_preset = "qwen"
[[tools]]
name = "write_note"
parameters = { text = "string" }
results = ["saved"]
[[tools]]
name = "read_notes"
parameters = { page = "integer" }
results = ["the same three notes: yeast, sugar, water"]
[[steps]]
tool_calls = [{ name = "write_note", arguments = { text = "start" } }]
[[steps]]
tool_calls = [{ name = "read_notes", arguments = { page = "{n}" } }]
repeat = true
[expect]
exit_reason = "hook_stopped"
cause = "loop.read_loop"
""",
    ),
    "context.prompt_too_long": _inline(
        "hint_early_413",  # a proxy refuses the first request: nothing to fold or compact
        """
task = "Anything."
[[steps]]
text = "never sent"
faults = [{ kind = "context_length", status = 413, forever = true }]
[expect]
exit_reason = "prompt_too_long"
cause = "context.prompt_too_long"
""",
    ),
}

# The causes whose runs come from elsewhere (a daemon's crash or shutdown), or that no
# scenario can produce (a bug inside loopfuse, a pipeline stage's checks).
NOT_FROM_A_SCENARIO: Final = frozenset(
    {"abort.crash", "abort.shutdown", "internal.error", "stage.output_rejected"}
)


# Causes no run here ends with: model.interrupted (a llama-cpp-python stream cut by
# another request; retried, so only a live server's repeated cuts end a run with it),
# loop.shell_stagnation (qwen's tool-name stagnation stops the same calls first) and
# loop.call_cap (qwen's cap of 100+ calls); only their hint's next step is checked.
NO_RUN_YET: Final = frozenset({"model.interrupted", "loop.shell_stagnation", "loop.call_cap"})


def _scenario_for(cause: str) -> Scenario | None:
    for scenario in SHIPPED.values():
        if scenario.expect.cause == cause and scenario.pipeline is None:
            return scenario
    return INLINE.get(cause)


async def _real_result(scenario: Scenario) -> RunResult:
    async with Runtime(scenarios=[scenario]) as runtime:
        with anyio.fail_after(60):
            return await run_scenario(runtime, scenario)


def assert_names_a_next_step(hint: str) -> None:
    assert _ACTIONS.search(hint), f"no next step in {hint!r}"
    sections = set(Config.__struct_fields__)
    for section, key in _DOTTED_KEY.findall(hint):
        if section in sections:
            table = getattr(Config(), section)
            assert key in type(table).__struct_fields__, f"{section}.{key} is not a config key"


def assert_consistent(cause: str, detail: str, hint: str) -> None:
    """The hint says to change the key the detail names, and claims nothing it contradicts."""
    for key in _DETAIL_KEY.findall(detail):
        section, _, bare = key.rpartition(".")
        if bare not in RunSettings.__struct_fields__ and section not in Config.__struct_fields__:
            continue  # not a config key: a tool's name
        assert re.search(rf"\b(?:[a-z_]+\.)?{bare}\b", hint), (cause, detail, hint)
    if cause == "context.prompt_too_long":
        shortened = "after collapsing" in detail or "compacting" in detail
        assert ("folded or summarised earlier turns" in hint) == shortened, (detail, hint)
        assert ("Nothing was folded" in hint) == (not shortened), (detail, hint)
    if cause == "model.bad_request":
        assert "not retried" in hint
        assert "temprature" in detail


def _causes_with_a_run() -> list[str]:
    return sorted(c for c in CAUSES if c not in NOT_FROM_A_SCENARIO | NO_RUN_YET)


def test_every_cause_has_a_run_or_is_listed_as_not_from_a_scenario() -> None:
    missing = [cause for cause in _causes_with_a_run() if _scenario_for(cause) is None]
    assert missing == []


@pytest.mark.asyncio
@pytest.mark.parametrize("cause", _causes_with_a_run())
async def test_a_real_run_ending_with_the_cause_has_a_hint_matching_its_detail(
    cause: str,
) -> None:
    scenario = _scenario_for(cause)
    assert scenario is not None
    result = await _real_result(scenario)
    assert result.cause == cause, result.detail
    assert result.hint == cause_hint(
        cause, shortened=("after " in result.detail) if cause.startswith("context.p") else None
    )
    assert_names_a_next_step(result.hint)
    assert_consistent(cause, result.detail, result.hint)


@pytest.mark.asyncio
async def test_prompt_too_long_after_collapse_and_compaction_says_so() -> None:
    result = await _real_result(SHIPPED["prompt_too_long"])
    assert "after collapsing and compacting" in result.detail
    assert result.hint.startswith("loopfuse folded or summarised earlier turns")
    assert_consistent(result.cause, result.detail, result.hint)


@pytest.mark.asyncio
async def test_prompt_too_long_refused_at_once_does_not_claim_a_collapse() -> None:
    result = await _real_result(INLINE["context.prompt_too_long"])
    assert "with nothing to fold or compact" in result.detail
    assert "collaps" not in result.hint
    assert "after" not in result.hint.split(";")[0]
    assert "413" in result.hint
    assert "context.windows" in result.hint


@pytest.mark.asyncio
async def test_a_hook_cause_names_the_hook_and_a_next_step() -> None:
    result = await _real_result(SHIPPED["hook_denied"])
    assert result.cause == "hook.read_only"
    assert "'read_only'" in result.hint
    assert_names_a_next_step(result.hint)


@pytest.mark.asyncio
async def test_a_shutdown_abort_has_the_shutdown_hint() -> None:
    scenario = msgspec.structs.replace(
        SHIPPED["completed"],
        name="hint_shutdown",
        steps=(msgspec.structs.replace(SHIPPED["completed"].steps[0], latency=30.0),),
    )
    async with Runtime(scenarios=[scenario]) as runtime:
        handle = await start_scenario(runtime, scenario)
        await handle.abort("The daemon is shutting down.", source="shutdown")
        with anyio.fail_after(30):
            result = await handle.result()
    assert result.exit_reason is ExitReason.ABORTED_STREAMING
    assert result.cause == "abort.shutdown"
    assert result.hint == CAUSES["abort.shutdown"]
    assert_names_a_next_step(result.hint)


def test_a_crash_ending_has_the_crash_hint() -> None:
    _, result = crash_ending("r1", "t1", ExitReason.ABORTED_STREAMING, None, crash_detail())
    assert result.cause == "abort.crash"
    assert "stopped while this run was active" in result.detail
    assert "did not resume it" in result.hint
    assert_names_a_next_step(result.hint)


@pytest.mark.parametrize("cause", sorted(NOT_FROM_A_SCENARIO | NO_RUN_YET))
def test_causes_without_a_scenario_still_name_a_next_step(cause: str) -> None:
    assert_names_a_next_step(cause_hint(cause))


def test_an_unknown_shortened_fact_gives_the_generic_prompt_too_long_hint() -> None:
    assert cause_hint("context.prompt_too_long") == CAUSES["context.prompt_too_long"]
    assert cause_hint("budget.cost", shortened=True) == CAUSES["budget.cost"]
