"""Loop detection: a pure engine (usable without a bus) and its presets.

:class:`LoopDetector` judges proposed tool calls (``propose``), learns their results
(``record_result``) and watches streamed text (``feed_text``); each answer is a
:class:`Decision` at one of three levels. The detectors are listed once, in
``actors.loop.registry``. The bus actor is ``actors.loop.monitor``.
"""

from __future__ import annotations

from actors.loop.config import (
    CallCapConfig,
    ContentConfig,
    CycleConfig,
    GenericRepeatConfig,
    GlobalBreakerConfig,
    LlmCheckConfig,
    LoopConfig,
    LoopConfigError,
    NoNewInformationConfig,
    PingPongConfig,
    PollConfig,
    PollTool,
    ReadLoopConfig,
    ResultPattern,
    ShellStagnationConfig,
    StrikesConfig,
    ToolStagnationConfig,
    UnknownToolConfig,
    check_config,
    load_config,
)
from actors.loop.detector import LoopDetector
from actors.loop.presets import (
    GEMINI,
    GEMINI_RECOVERY_TEXT,
    OPENCLAW,
    OPENCLAW_CURRENT,
    PRESETS,
    QWEN,
    STRICT,
    STRICT_NUDGE_TEXT,
)
from actors.loop.registry import DETECTORS
from actors.loop.verdicts import Decision, Detector, Level

__all__ = [
    "DETECTORS",
    "GEMINI",
    "GEMINI_RECOVERY_TEXT",
    "OPENCLAW",
    "OPENCLAW_CURRENT",
    "PRESETS",
    "QWEN",
    "STRICT",
    "STRICT_NUDGE_TEXT",
    "CallCapConfig",
    "ContentConfig",
    "CycleConfig",
    "Decision",
    "Detector",
    "GenericRepeatConfig",
    "GlobalBreakerConfig",
    "Level",
    "LlmCheckConfig",
    "LoopConfig",
    "LoopConfigError",
    "LoopDetector",
    "NoNewInformationConfig",
    "PingPongConfig",
    "PollConfig",
    "PollTool",
    "ReadLoopConfig",
    "ResultPattern",
    "ShellStagnationConfig",
    "StrikesConfig",
    "ToolStagnationConfig",
    "UnknownToolConfig",
    "check_config",
    "load_config",
]
