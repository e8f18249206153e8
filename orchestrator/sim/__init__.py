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
    parse_scenario,
    shipped_scenarios,
)
from orchestrator.sim.scenario import (
    MAIN_TRACK,
    Branch,
    Expect,
    Fault,
    Scenario,
    ScriptedCall,
    ScriptedUsage,
    Step,
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
    "Expect",
    "Fault",
    "RunningSimulator",
    "Scenario",
    "ScenarioError",
    "ScriptedCall",
    "ScriptedUsage",
    "Step",
    "ToolCase",
    "ToolDef",
    "ToolReply",
    "find_scenario",
    "load_scenario",
    "make_app",
    "open_simulator",
    "parse_scenario",
    "serve_simulator",
    "shipped_scenarios",
]
