"""What an operator's server says about a model, asked once per model: its context window
and its tokenizer's count of a sample of the run's own text (:func:`~.server.probe`). The
count calibrates the model's estimates (:class:`~actors.context.Calibration`); the window
goes to whoever is told of it (the gatekeeper, for the model's runs)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

import anyio
from anyio.abc import TaskGroup

from actors.context.calibration import Calibration
from actors.context.server import ServerEndpoint, ServerReport, probe
from actors.context.tokens import Estimate, Estimator
from bus import ToolSpec

__all__ = ["CALIBRATION_SAMPLE", "MAX_PROBED", "SAMPLE_TASK_CHARS", "ServerProbes"]

logger = logging.getLogger("loopfuse.context")

MAX_PROBED: Final = 256
"""Models the server is asked about (once each); more are not asked."""
SAMPLE_TASK_CHARS: Final = 8_192
"""Characters of a run's task in the tokenizer sample."""
CALIBRATION_SAMPLE: Final = (
    "The build finished in 3 min 12 s; 1,284 tests passed and 3 failed (see log 20240517).\n"
    "def parse(line: str) -> dict[str, int]:\n    return {k: int(v) for k, v in pairs(line)}\n"
    '{"id": 48213, "status": "ok", "items": [{"sku": "A-17", "qty": 2, "price": 19.99}]}\n'
    "name,region,revenue\nAcme,EU,1203344.50\nGlobex,US,998001.00\n"
    "Der Bericht fasst die Ergebnisse zusammen. Отчёт подводит итоги. 报告总结了结果。\n"
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n"
)
"""Mixed text (prose, code, JSON, CSV, numbers, three scripts, hex) sent to a server's
tokenizer with the run's own text, so one ratio covers more than one kind of content."""


class ServerProbes:
    """The server's answers about each model (``server`` ``None``: nobody is asked).

    :param on_window: told ``(model, window)`` when the server reports a model's window.
    """

    def __init__(
        self,
        server: ServerEndpoint | None,
        calibration: Calibration,
        on_window: Callable[[str, int], None],
    ) -> None:
        self.server = server
        self._calibration = calibration
        self._on_window = on_window
        self._reports: dict[str, ServerReport] = {}
        self._asked: dict[str, anyio.Event] = {}  # set once the server has answered (or not)
        self.task_group: TaskGroup | None = None
        """Where :meth:`start` asks (set while the gatekeeper serves)."""

    def known(self, model: str) -> ServerReport | None:
        """What the server has said about ``model`` so far (``None``: nothing yet)."""
        return self._reports.get(model)

    async def report(self, model: str) -> ServerReport | None:
        """See :meth:`ContextGatekeeper.server_report`."""
        done = self._asked.get(model)
        if done is None:
            return None
        await done.wait()
        return self._reports.get(model)

    def start(
        self, model: str, task: str, tool_specs: Sequence[ToolSpec], estimator: Estimator
    ) -> None:
        """Ask about ``model`` in :attr:`task_group` if nobody has yet (returns at once)."""
        if self.task_group is not None and self._claim(model):
            self.task_group.start_soon(self._probe, model, _sample(task, tool_specs), estimator)

    async def prepare(
        self, model: str, task: str, tool_specs: Sequence[ToolSpec], estimator: Estimator
    ) -> None:
        """See :meth:`ContextGatekeeper.prepare`."""
        if self.server is None:
            return
        done = self._asked.get(model)
        if done is not None:
            if not done.is_set():
                await done.wait()
            return
        if self._claim(model):
            await self._probe(model, _sample(task, tool_specs), estimator)

    def _claim(self, model: str) -> bool:
        if model in self._asked or len(self._asked) >= MAX_PROBED:
            return False
        self._asked[model] = anyio.Event()
        return True

    async def _probe(self, model: str, sample: str, estimator: Estimator) -> None:
        """Ask the server about ``model`` once; what it says applies to the model's runs."""
        assert self.server is not None
        try:
            report = await probe(self.server, model, sample)
            self._learn(model, report, estimator.text(sample))
        finally:
            self._asked[model].set()  # even when cancelled: nobody waits forever

    def _learn(self, model: str, report: ServerReport, sample: Estimate) -> None:
        self._reports[model] = report
        estimated = sample.tokens
        if report.sample_tokens is not None:
            count = report.sample_tokens
            self._calibration.observe(model, estimated, count, "tokenizer", sample.bound)
            logger.info(
                "model %r: the server's tokenizer (%s) counts %d tokens where %d were "
                "estimated (bound %d)",
                model,
                report.tokenizer,
                count,
                estimated,
                sample.bound,
            )
        if report.window is not None:
            logger.info("model %r: the server reports a window of %d tokens", model, report.window)
            self._on_window(model, report.window)


def _sample(task: str, tool_specs: Sequence[ToolSpec]) -> str:
    """The text a server's tokenizer is asked to count: a mixed sample, the run's task and
    its tool schemas (no chat framing: a tokenizer endpoint counts text only)."""
    parts = [CALIBRATION_SAMPLE, task[:SAMPLE_TASK_CHARS]]
    for spec in tool_specs:
        parts += (spec.name, spec.description, spec.parameters)
    return "\n".join(part for part in parts if part)
