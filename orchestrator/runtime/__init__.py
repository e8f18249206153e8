"""The runtime: shared actors, many concurrent runs, and the library API (``runtime.py``;
what a run is given in ``spec.py``, a started run's handle in ``handle.py``),
with what it keeps per process: the in-memory event log, the heap kept out of the cycle
collector's way, and which modules run compiled."""

from orchestrator.runtime.handle import RunHandle
from orchestrator.runtime.runtime import FOLDER_SYSTEM_PROMPT, Runtime
from orchestrator.runtime.spec import ModelActor, RunJournal, RunSpec, StartPoint

__all__ = [
    "FOLDER_SYSTEM_PROMPT",
    "ModelActor",
    "RunHandle",
    "RunJournal",
    "RunSpec",
    "Runtime",
    "StartPoint",
]
