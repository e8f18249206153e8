"""Policy by effect (issue #28): no request the policy accepts yields a run config beyond
an operator's ceiling or below its floor, whatever keys it uses.

Hypothesis writes random ``config`` documents: every key a policy can allow, the whole
``loop`` table (every section and field, read from the loop config's types), extreme
values. Each is put to the policy; for each one it accepts, the run's effective config is
built as the runtime builds it, and checked here, without the policy's code, against
what ``docs/security.md`` promises:

* every ceilinged number is the operator's own or within its ceiling;
* the model, the loop preset and the tools are among the operator's;
* the loop detection stops every loop no later than the operator's does: both configs
  judge the same adversarial call sequences and streamed text (a real
  :class:`~actors.loop.LoopDetector`), the call at which each stops the run is compared;
* the model-based loop check, switched on by a request, asks for no more tokens than the
  reply ceiling, and one the operator keeps on stays on.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from actors.loop import PRESETS, LoopConfig, LoopDetector
from actors.loop.config import LEVELLED, THRESHOLD_MAX
from actors.loop.presets import OFF
from orchestrator.config import (
    BudgetSettings,
    ClientCeilings,
    ClientKey,
    ClientOverrides,
    Config,
    DaemonSettings,
    ModelPrice,
    ModelSettings,
    RunSettings,
    merge_loop_overrides,
    run_settings,
)
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.loop_floor import STOP_FIELDS
from orchestrator.daemon.policy import Policy
from orchestrator.daemon.schemas import RunRequest
from orchestrator.errors import ConfigError
from orchestrator.sim import find_scenario

# ------------------------------------------------------------------ the operators

EVERY_KEY: Final = typing.get_args(ClientKey)
PRESETS_ALLOWED: Final = ("strict", "openclaw", "openclaw-current", "gemini", "qwen")

DEFAULTS: Final = Config(
    daemon=DaemonSettings(
        client_overrides=ClientOverrides(allowed=EVERY_KEY, loop_presets=PRESETS_ALLOWED)
    )
)
"""Every key a policy can allow, every preset but ``off``; the config's defaults."""

TIGHT: Final = Config(
    model=ModelSettings(max_output_tokens=600),
    budget=BudgetSettings(max_turns=12, max_output_tokens=5_000, max_cost=2.0),
    prices={"completed": ModelPrice(input_per_million=1, output_per_million=2)},
    daemon=DaemonSettings(
        client_overrides=ClientOverrides(
            allowed=EVERY_KEY,
            loop_presets=("openclaw", "qwen"),
            ceilings=ClientCeilings(max_turns=30, max_output_tokens=1_000, cost_budget=5.0),
        )
    ),
)
"""Budgets set, some ceilings above them, a price for the cost budget."""

_COMPLETED = find_scenario("completed")
GUARDED: Final = msgspec.structs.replace(
    _COMPLETED,
    name="guarded",
    config={
        **_COMPLETED.config,
        "max_turns": 15,
        "loop_preset": "openclaw",
        "loop": {
            "generic_repeat": {"break_at": 15},
            "cycle": {"enabled": True, "block_at": None, "break_at": 9},
            "content": {"enabled": True, "stop_at_offence": 3},
        },
    },
)
"""A scenario whose own ``[config]`` (the operator's) has a ``loop`` table."""

OPERATORS: Final = {"defaults": DEFAULTS, "tight": TIGHT}
SCENARIOS: Final = {"guarded": GUARDED, "completed": _COMPLETED}

# ------------------------------------------------------------------ the documents

NAMES: Final = ("read_file", "list_dir", "finish_exploration", "run_shell_command", "nope")
INTS: Final = st.integers(1, 12) | st.sampled_from(
    [0, 1, 2, 3, 4, 5, 8, 10, 20, 30, 100, THRESHOLD_MAX, 10**9, -1]
)
FLOATS: Final = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0, 1.5, 1e9, -1.0])


def _value(node: mi.Type) -> st.SearchStrategy[Any]:
    """Values for a field of type ``node``: in range and out of it, of its type or not."""
    if isinstance(node, mi.UnionType):
        return st.one_of([_value(member) for member in node.types])
    if isinstance(node, mi.NoneType):
        return st.none()
    if isinstance(node, mi.BoolType):
        return st.booleans()
    if isinstance(node, mi.IntType):
        return INTS
    if isinstance(node, mi.FloatType):
        return FLOATS
    if isinstance(node, mi.StrType):
        return st.sampled_from(NAMES)
    if isinstance(node, mi.LiteralType):
        return st.sampled_from([*node.values, "bogus"])
    if isinstance(node, mi.VarTupleType | mi.ListType):
        return st.lists(_value(node.item_type), max_size=3)
    if isinstance(node, mi.StructType):
        return _table(node)
    return st.none()


def _table(node: mi.StructType) -> st.SearchStrategy[dict[str, Any]]:
    """A few of the struct's fields (a request changes some, not all)."""
    fields = {field.encode_name: field.type for field in node.fields}
    return st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({key: _value(fields[key]) for key in keys})
    )


LOOP_TABLES: Final = _table(typing.cast(mi.StructType, mi.type_info(LoopConfig)))

TOP: Final[dict[str, st.SearchStrategy[Any]]] = {
    "model": st.sampled_from(["completed", "max_turns", "path_escape", "gpt-x"]),
    "max_turns": INTS,
    "max_tool_calls": INTS,
    "deadline_seconds": FLOATS | INTS,
    "max_output_tokens": INTS | st.none(),
    "output_token_budget": INTS | st.none(),
    "input_token_budget": INTS | st.none(),
    "cost_budget": FLOATS | st.none(),
    "answer_max_tokens": INTS,
    "budget_mode": st.sampled_from(["ceiling", "target", "x"]),
    "on_stop": st.sampled_from(["keep", "answer"]),
    "loop_preset": st.sampled_from([*PRESETS, "off"]),
    "loop": LOOP_TABLES,
    "tools": st.lists(st.sampled_from([*NAMES, "make_figure"]), max_size=4),
    "on_crash": st.sampled_from(["resume", "abort"]),
}
assert set(TOP) == set(EVERY_KEY)

DOCUMENTS: Final = st.lists(st.sampled_from(sorted(TOP)), max_size=4, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({key: TOP[key] for key in keys})
)
"""A request's ``config``: the loop table more often than not."""
LOOP_DOCUMENTS: Final = st.fixed_dictionaries(
    {"loop": LOOP_TABLES}, optional={"loop_preset": TOP["loop_preset"]}
)

# ------------------------------------------------------------------ the oracle

Call = tuple[str, str, str, bool]
"""tool, arguments (JSON), result, whether the tool exists not."""


def _call(tool: str, result: str, **arguments: Any) -> Call:
    return tool, json.dumps(arguments), result, tool == "nope"


LOOPS: Final[dict[str, list[Call]]] = {
    "same call, same result": [_call("read_file", "same", path="a")] * 120,
    "same call, new results": [_call("read_file", f"r{n}", path="a") for n in range(120)],
    "ping-pong": [_call("read_file", "a", path="a"), _call("list_dir", "b", path=".")] * 60,
    "cycle of three": [
        _call("read_file", "a", path="a"),
        _call("list_dir", "b", path="."),
        _call("read_file", "c", path="c"),
    ]
    * 40,
    "unknown tool": [_call("nope", "Error: unknown tool 'nope'")] * 120,
    "no new information": [_call("read_file", "nothing here", path=f"p{n}") for n in range(120)],
    "poll": [_call("command_status", "running", id=1)] * 120,
    "git status": [_call("run_shell_command", "clean", command="git status")] * 120,
    "reading": [
        _call("run_shell_command", "x", command="ls"),
        *(_call("read_file", f"text {n}", path=f"p{n}") for n in range(119)),
    ],
    "finishing": [_call("finish_exploration", "done")] * 120,
}
"""Call sequences a looping model makes, each longer than any preset lets run."""

CHANT: Final = "I will now read the file again. " * 400
"""A reply repeating itself (the content detector's loop)."""


def stops_at_call(config: LoopConfig, calls: list[Call]) -> int | None:
    """The call at which ``config`` stops the run (``None``: it never does)."""
    detector = LoopDetector(config)
    for index, (tool, arguments, result, unknown) in enumerate(calls):
        decision = detector.propose(tool, arguments, call_id=f"c{index}")
        if decision.level == "break":
            return index
        if decision.level == "critical":
            detector.record_result(f"c{index}", "Not run: loop.", is_error=True)
        else:
            detector.record_result(f"c{index}", result, unknown, unknown_tool=unknown)
    return None


def stops_at_reply(config: LoopConfig, replies: int = 120) -> int | None:
    """The chanting reply at which ``config`` stops the run (``None``: never)."""
    detector = LoopDetector(config)
    for reply in range(replies):
        detector.new_stream()
        for start in range(0, len(CHANT), 40):
            if detector.feed_text(CHANT[start : start + 40]).level == "break":
                return reply
    return None


def _later(stop: int | None, floor: int | None) -> bool:
    return floor is not None and (stop is None or stop > floor)


def _loop(settings: RunSettings, table: Mapping[str, Any], config: Config) -> LoopConfig:
    """The loop config the runtime gives a run with these settings and ``loop`` table."""
    return merge_loop_overrides(
        PRESETS.get(settings.loop_preset, OFF),
        table,
        result_patterns=config.loop.result_patterns,
        llm_check_model=config.loop.llm_check_model,
    )


def _reply_ceiling(config: Config, own: RunSettings) -> int | None:
    ceiling = config.daemon.client_overrides.ceilings.max_output_tokens
    return ceiling if ceiling is not None else own.max_output_tokens


def beyond_the_operator(
    config: Config, operator: Mapping[str, Any], client: Mapping[str, Any]
) -> Iterator[str]:
    """How the run ``client`` asks for (over the operator's ``operator`` overrides) goes
    beyond ``config``'s ceilings or below its floors, one line per breach."""
    policy = config.daemon.client_overrides
    own = run_settings(config, operator)
    try:
        effective = run_settings(config, {**operator, **client})
    except ConfigError as exc:
        yield f"accepted, but the runtime refuses it: {exc}"
        return
    for key in ClientCeilings.__struct_fields__:
        value, mine = getattr(effective, key), getattr(own, key)
        ceiling = getattr(policy.ceilings, key)
        limit = ceiling if ceiling is not None else mine
        if value == mine or limit is None:
            continue
        if value is None or value > limit:
            yield f"{key} = {value}, the operator's {mine}, ceiling {ceiling}"
    offered = {config.model.model, *config.models, *config.prices, *policy.models, own.model}
    if effective.model not in offered:
        yield f"model {effective.model!r} not offered"
    if effective.loop_preset not in {own.loop_preset, *policy.loop_presets}:
        yield f"loop preset {effective.loop_preset!r} not allowed"
    if not set(effective.tools) <= set(own.tools):
        yield f"tools {effective.tools} beyond {own.tools}"
    # the floor: the detection the operator gives a run of the chosen (allowed) preset
    loop = _loop(effective, effective.loop, config)
    floor = _loop(effective, own.loop, config)
    for name, calls in LOOPS.items():
        stop, floor_stop = stops_at_call(loop, calls), stops_at_call(floor, calls)
        if _later(stop, floor_stop):
            yield f"{name}: stopped at call {stop}, the operator's loop detection at {floor_stop}"
    stop, floor_stop = stops_at_reply(loop), stops_at_reply(floor)
    if _later(stop, floor_stop):
        yield f"chanting: stopped at reply {stop}, the operator's at {floor_stop}"
    check, floor_check = loop.llm_check, floor.llm_check
    if floor_check.enabled and not check.enabled:
        yield "the model-based loop check switched off"
    reply_ceiling = _reply_ceiling(config, own)
    if (
        check.enabled
        and check != floor_check
        and reply_ceiling is not None
        and check.max_tokens > reply_ceiling
    ):
        yield f"the loop check asks for {check.max_tokens} tokens, ceiling {reply_ceiling}"


def _judge(operator_name: str, scenario: str | None, client: dict[str, Any]) -> list[str]:
    """The policy's answer (accepted or not), then the breaches if it accepted."""
    config = OPERATORS[operator_name]
    body: dict[str, Any] = {"config": client}
    body.update({"scenario": scenario} if scenario else {"task": "Read a.txt."})
    try:
        request = msgspec.convert(body, RunRequest)
    except msgspec.ValidationError:
        event("not a request")
        return []
    refusal: ApiError | None
    try:
        Policy(config, SCENARIOS).admit(request)
    except ApiError as exc:
        refusal = exc
    else:
        refusal = None
    if refusal is not None:
        assert 400 <= refusal.status < 500
        assert refusal.key  # the refusal names a key
        event("refused")
        return []
    event("accepted" + (" with a loop table" if "loop" in client else ""))
    operator = {"model": scenario, **SCENARIOS[scenario].config} if scenario else {}
    return list(beyond_the_operator(config, operator, client))


SETTINGS: Final = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(
    st.sampled_from(sorted(OPERATORS)),
    st.sampled_from([None, "guarded", "completed"]),
    DOCUMENTS | LOOP_DOCUMENTS,
)
def test_no_accepted_request_goes_beyond_a_ceiling_or_below_a_floor(
    operator: str, scenario: str | None, client: dict[str, Any]
) -> None:
    assert _judge(operator, scenario, client) == []


# ------------------------------------------------------------------ the oracle itself


@pytest.mark.parametrize(
    ("client", "breach"),
    [
        (
            {
                "loop": {
                    "generic_repeat": {"enabled": False},
                    "no_new_information": {"enabled": False},
                    "unknown_tool": {"enabled": False},
                }
            },
            "same call, same result: stopped at call None",
        ),
        (
            {"loop": {"exempt_tools": ["read_file", "finish_exploration"]}},
            "same call, same result: stopped at call None",
        ),
        (
            {"loop": {"generic_repeat": {"break_at": 100_000}}},
            "same call, same result: stopped at call None, the operator's loop detection at 4",
        ),
        ({"loop": {"llm_check": {"enabled": True, "max_tokens": 100_000}}}, "100000 tokens"),
        ({"max_turns": 21}, "max_turns = 21"),
        # a lower block level: refused calls are not recorded, the break is never reached;
        # only the refusal limit ends the run, 9 calls after the operator's config would
        (
            {"loop": {"generic_repeat": {"block_at": 2}}},
            "same call, same result: stopped at call 13, the operator's loop detection at 4",
        ),
    ],
)
def test_the_oracle_sees_each_back_door(client: dict[str, Any], breach: str) -> None:
    """The check above is not vacuous: the back doors of issue #28 are breaches to it."""
    found = list(beyond_the_operator(DEFAULTS, {}, client))
    assert any(breach in line for line in found), found


def test_the_docs_name_every_level_a_request_may_lower() -> None:
    text = (Path(__file__).parent.parent / "docs" / "security.md").read_text(encoding="utf-8")
    section = text.split("### Loop detection by effect", 1)[1].split("\n## ", 1)[0]
    for name, fields in STOP_FIELDS.items():
        assert f"`{name}" in section or name in LEVELLED, name
        for field in fields:
            assert f"`{field}`" in section or f"{field}`" in section, (name, field)


@pytest.mark.parametrize(
    "client",
    [
        {"loop": {"generic_repeat": {"break_at": 4}}},
        {"loop": {"cycle": {"enabled": True, "block_at": None, "break_at": 6}}},
        {"loop": {"call_cap": {"enabled": True, "soft_cap": 20}}},
        {"loop": {"llm_check": {"enabled": True}}},
        {"loop_preset": "gemini", "loop": {"strikes": {"stop_at": 1}}},
        {"max_turns": 5, "output_token_budget": 100},
    ],
)
def test_a_stricter_request_is_accepted(client: dict[str, Any]) -> None:
    """The policy does not pass the property by refusing everything."""
    request = msgspec.convert({"task": "x", "config": client}, RunRequest)
    Policy(DEFAULTS, SCENARIOS).admit(request)
    assert list(beyond_the_operator(DEFAULTS, {}, client)) == []
