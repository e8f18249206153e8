"""Scenario files: decoding, validation messages, shipped scenarios, tools and the script."""

from __future__ import annotations

from pathlib import Path

import pytest

import orchestrator.sim
from bus import ExitReason, nudge_text
from orchestrator.sim import (
    ScenarioError,
    find_scenario,
    load_scenario,
    parse_scenario,
    shipped_scenarios,
)
from orchestrator.sim.script import AttemptCounter, fault_for, locate, render_arguments, step_at

MINIMAL = """
task = "Say hi."
[[steps]]
text = "hi"
[expect]
exit_reason = "completed"
"""


def parse(text: str):
    return parse_scenario(text, source="scenarios/x.toml", name="x")


def test_public_api_is_pinned() -> None:
    assert set(orchestrator.sim.__all__) == {
        "MAIN_TRACK",
        "RUN_ID_HEADER",
        "SCENARIO_DIR",
        "Branch",
        "CallExpectation",
        "Expect",
        "Fault",
        "RunVariant",
        "RunningSimulator",
        "Scenario",
        "ScenarioError",
        "ScriptedCall",
        "ScriptedUsage",
        "Step",
        "StreamShape",
        "ToolCase",
        "ToolDef",
        "ToolReply",
        "find_scenario",
        "load_scenario",
        "load_scenarios",
        "make_app",
        "open_simulator",
        "parse_scenario",
        "serve_simulator",
        "shipped_scenarios",
    }


def test_every_shipped_scenario_loads_with_an_expectation() -> None:
    scenarios = {s.name: s for s in shipped_scenarios()}
    assert {"completed", "max_turns", "max_tool_calls", "deadline", "path_escape"} <= set(scenarios)
    for scenario in scenarios.values():
        assert scenario.task
        assert isinstance(scenario.expect.exit_reason, ExitReason)
        assert scenario.expect.cause is not None
    assert scenarios["max_turns"].config == {"max_turns": 3}
    assert scenarios["max_turns"].expect.turns == 3


def test_find_scenario_by_name_or_path(tmp_path: Path) -> None:
    assert find_scenario("completed").name == "completed"
    file = tmp_path / "mine.toml"
    file.write_text(MINIMAL)
    assert find_scenario(str(file)).name == "mine"
    assert load_scenario(file).steps[0].text == "hi"
    with pytest.raises(ScenarioError, match=r"no-such: no such file or shipped scenario"):
        find_scenario("no-such")
    with pytest.raises(ScenarioError, match=r"missing\.toml: cannot read"):
        find_scenario(tmp_path / "missing.toml")


def test_a_minimal_scenario_has_defaults() -> None:
    scenario = parse(MINIMAL)
    assert scenario.name == "x"
    assert scenario.config == {}
    assert scenario.folder == {}
    assert scenario.expect.exit_reason is ExitReason.COMPLETED


BAD = [
    (
        'task = "t"\n[[steps]]\ntool_calls = [{ name = "f", arguments = "x" }]\n'
        '[expect]\nexit_reason = "completed"',
        "scenarios/x.toml: steps[0].tool_calls[0].arguments: expected a table, got a string",
    ),
    (
        'task = "t"\n[[steps]]\ntext = "a"\nspeed = 3\n[expect]\nexit_reason = "completed"',
        "scenarios/x.toml: steps[0].speed: unknown key",
    ),
    ('[[steps]]\ntext = "a"\n[expect]\nexit_reason = "completed"', "task: missing required key"),
    (
        'task = "t"\n[[steps]]\ntext = "a"\n[expect]\nexit_reason = "done"',
        "expect.exit_reason: invalid value 'done'; expected one of completed, max_turns,",
    ),
    ('task = "t"\nsteps = []\n[expect]\nexit_reason = "completed"', "steps: must have at least"),
    (
        'task = "t"\n[[steps]]\ntext = "a"\n[[branches]]\nnudge = "k"\ntrack = "nope"\n'
        '[expect]\nexit_reason = "completed"',
        "branches[0].track: unknown track 'nope' (known: main)",
    ),
    (
        'task = "t"\n[[steps]]\ntext = "a"\nfaults = [{ status = 200 }]\n'
        '[expect]\nexit_reason = "completed"',
        "steps[0].faults[0].status: 200 is not an error status (400-599)",
    ),
    (
        'task = "t"\n[[steps]]\ntext = "a"\n[[tracks.calm]]\nlatency = -1\ntext = "b"\n'
        '[[branches]]\nnudge = "k"\ntrack = "calm"\n[expect]\nexit_reason = "completed"',
        "tracks.calm[0].latency: must not be negative",
    ),
    (
        'task = "t"\n[[steps]]\ntext = "a"\nlatency = nan\nfaults = [{ status = 429, '
        'retry_after = inf }]\n[expect]\nexit_reason = "completed"',
        "steps[0].latency: must be finite",
    ),
    (
        'task = "t"\n[[steps]]\ntext = "a"\nfaults = [{ status = 429, retry_after = inf }]\n'
        '[expect]\nexit_reason = "completed"',
        "steps[0].faults[0].retry_after: must be finite",
    ),
    (
        'task = "t"\n[[steps]]\ntext = "a"\n[[tracks.calm]]\ntext = 3\n'
        '[expect]\nexit_reason = "completed"',
        "tracks.calm[0].text: expected a string, got an integer",
    ),
    (
        'task = "t"\n[[steps]]\ntext = "a"\nrepeat = true\n[[steps]]\ntext = "b"\n'
        '[expect]\nexit_reason = "completed"',
        "steps[0].repeat: only the last step of a track can repeat",
    ),
    (
        'task = "t"\n[folder]\n"../up.txt" = "x"\n[[steps]]\ntext = "a"\n'
        '[expect]\nexit_reason = "completed"',
        "folder.'../up.txt': must be a relative path inside the folder",
    ),
    (
        'task = "t"\n[[tools]]\nname = "f"\nparameters = { q = "text" }\n[[steps]]\ntext = "a"\n'
        '[expect]\nexit_reason = "completed"',
        "tools[0].parameters.q: expected a type name",
    ),
    (
        'task = "t"\n[[tools]]\nname = "f"\n[tools.parameters]\ntype = "object"\n'
        '[tools.parameters.properties.q]\ntype = "text"\n[[steps]]\ntext = "a"\n'
        '[expect]\nexit_reason = "completed"',
        "tools[0].parameters: invalid JSON schema at `$.properties.q.type`",
    ),
    (
        'task = "t"\n[[steps]]\ntext = "a"\n[expect]\nexit_reason = "completed"\ncause = "x.y"',
        "expect.cause: unknown cause 'x.y'",
    ),
    (
        'task = "t"\n[[steps]]\n[expect]\nexit_reason = "completed"',
        "scenarios/x.toml: steps[0]: a step needs text",
    ),
    ("task = = 1", "scenarios/x.toml: invalid TOML: "),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_validation_errors_name_the_file_key_and_reason(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse(text)
    assert message in str(caught.value)
    assert str(caught.value).startswith("scenarios/x.toml: ")


def test_scenario_error_exposes_its_parts() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse('task = "t"\nsteps = []\n[expect]\nexit_reason = "completed"')
    assert (caught.value.source, caught.value.path) == ("scenarios/x.toml", "steps")
    assert caught.value.reason == "must have at least one step"


TOOLS = """
task = "t"
[[tools]]
name = "order_status"
description = "Look up an order."
idempotent = true
parameters = { order_id = "string", verbose = "boolean?" }
results = ["unknown order"]
[[tools.cases]]
arguments = { order_id = "A1" }
results = ["pending", "pending", { text = "shipped" }]
[[tools.cases]]
arguments = { order_id = "B2" }
results = [{ error = "database down" }]
[[steps]]
text = "a"
[expect]
exit_reason = "completed"
"""


def test_tool_definitions_give_a_schema_and_results_per_case() -> None:
    (tool,) = parse(TOOLS).tools
    assert tool.idempotent
    assert tool.json_schema() == {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}},
        "required": ["order_id"],
    }
    assert tool.match({"order_id": "A1", "verbose": True}) == 0
    assert tool.match({"order_id": "Z"}) == -1
    replies = [tool.reply({"order_id": "A1"}, n).text for n in range(5)]
    assert replies == ["pending", "pending", "shipped", "shipped", "shipped"]
    assert tool.reply({"order_id": "B2"}, 0).error == "database down"
    assert tool.reply({"order_id": "Z"}, 7).text == "unknown order"


def test_a_json_schema_is_kept_as_is() -> None:
    text = TOOLS.replace(
        'parameters = { order_id = "string", verbose = "boolean?" }',
        'parameters = { type = "object", properties = { id = { type = "string" } } }',
    )
    (tool,) = parse(text).tools
    assert tool.has_json_schema
    assert tool.json_schema()["properties"] == {"id": {"type": "string"}}


BRANCHING = """
task = "t"
[[steps]]
text = "main {n}"
repeat = true
[[tracks.warned]]
text = "warned"
[[tracks.warned]]
text = "wrapping up"
[[tracks.second]]
text = "second"
[[branches]]
nudge = "budget.warning"
track = "warned"
[[branches]]
nudge = "truncation"
nth = 2
track = "second"
[expect]
exit_reason = "completed"
"""


def test_locate_counts_replies_within_the_track_after_a_nudge() -> None:
    scenario = parse(BRANCHING)
    convo = [("system", "s"), ("user", "task"), ("assistant", ""), ("tool", "x")]
    assert locate(scenario, convo) == ("main", 1, 1)
    convo += [("assistant", ""), ("user", nudge_text("budget.warning", "wrap up"))]
    assert locate(scenario, convo) == ("warned", 0, 2)
    convo += [("assistant", "")]
    assert locate(scenario, convo) == ("warned", 1, 3)
    position = locate(scenario, [*convo, ("assistant", "")])
    assert step_at(scenario, position) is None
    convo += [("user", nudge_text("truncation", "go on"))]
    assert locate(scenario, convo).track == "warned"  # only the second one branches
    convo += [("assistant", ""), ("user", nudge_text("truncation", "shorter"))]
    assert locate(scenario, convo) == ("second", 0, 4)
    assert step_at(scenario, locate(scenario, [("assistant", "")] * 9)) == scenario.steps[0]


def test_faults_cover_their_attempts_in_order() -> None:
    text = MINIMAL.replace(
        'text = "hi"',
        'text = "hi"\nfaults = [{ status = 429, times = 2 }, { kind = "drop" }]',
    )
    (step,) = parse(text).steps
    kinds = [None if (f := fault_for(step, n)) is None else f.kind for n in range(5)]
    assert kinds == ["status", "status", "drop", None, None]


def test_attempt_counter_forgets_the_oldest_beyond_capacity() -> None:
    counter = AttemptCounter(capacity=2)
    assert [counter.next("a"), counter.next("a"), counter.next("b")] == [0, 1, 0]
    counter.next("c")
    assert len(counter) == 2
    assert counter.next("a") == 0


def test_render_arguments_substitutes_the_reply_index() -> None:
    args = {"path": "dir{n}", "offset": "{n}", "deep": [{"x": "{n}"}], "k": 1}
    assert render_arguments(args, 4) == {"path": "dir4", "offset": 4, "deep": [{"x": 4}], "k": 1}
