"""The embedded default model: an OpenAI-compatible chat-completions server driven by scenarios.

A scenario file scripts a model (steps, tracks, nudge branches, faults) and the run around
it (task, folder, fake tools, config overrides, expected ending); see ``docs/scenarios.md``.
"""

from __future__ import annotations

from orchestrator.sim.app import RUN_ID_HEADER, make_app
from orchestrator.sim.loader import (
    SCENARIO_DIR,
    ScenarioError,
    find_scenario,
    load_scenario,
    load_scenarios,
    parse_scenario,
    shipped_scenarios,
)
from orchestrator.sim.scenario import (
    MAIN_TRACK,
    Branch,
    CallExpectation,
    Expect,
    Fault,
    RunVariant,
    Scenario,
    ScriptedCall,
    ScriptedUsage,
    Step,
    StreamShape,
    ToolCase,
    ToolDef,
    ToolReply,
)
from orchestrator.sim.server import RunningSimulator, open_simulator, serve_simulator

__all__ = [
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
]
