"""Loop detection: a pure engine (usable without a bus) and its presets.

:class:`LoopDetector` judges proposed tool calls (``propose``), learns their results
(``record_result``) and watches streamed text (``feed_text``); each answer is a
:class:`Decision` at one of three levels. The detectors are listed once, in
``actors.loop.registry``. The bus actor is ``actors.loop.monitor``.
"""

from __future__ import annotations

# ruff: noqa: F405 (the names of ``__all__`` come from the star imports)
from actors.loop.config import *  # noqa: F403
from actors.loop.detector import *  # noqa: F403
from actors.loop.presets import *  # noqa: F403
from actors.loop.registry import *  # noqa: F403
from actors.loop.verdicts import *  # noqa: F403

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
