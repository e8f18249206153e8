"""The runtime: shared actors, many concurrent runs, and the library API (``runtime.py``),
with what it keeps per process: the in-memory event log, the heap kept out of the cycle
collector's way, and which modules run compiled."""

from orchestrator.runtime.runtime import (
    FOLDER_SYSTEM_PROMPT,
    ModelActor,
    RunHandle,
    RunJournal,
    RunSpec,
    Runtime,
    StartPoint,
)

__all__ = [
    "FOLDER_SYSTEM_PROMPT",
    "ModelActor",
    "RunHandle",
    "RunJournal",
    "RunSpec",
    "Runtime",
    "StartPoint",
]
