"""Every metric of loopfuse, registered as one collector on a registry passed in (never the
global one).

Names follow Prometheus conventions (``loopfuse_`` prefix, base units, ``_total`` counters,
``_seconds``/``_tokens``/``_ratio`` histograms) and label values follow the OpenTelemetry
GenAI vocabulary where it fits (``model`` is the request model, ``token_type`` is
``input``/``output``). What each metric answers is in ``docs/metrics.md``. Only
:class:`~orchestrator.metrics.recorder.MetricsRecorder` changes them. The values are plain
Python numbers (:mod:`orchestrator.metrics.series`), turned into Prometheus samples only
when the registry is scraped.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib import metadata
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from orchestrator.metrics.labels import (
    CONTEXT_ACTIONS,
    EXIT_REASONS,
    LOOP_DETECTORS,
    LOOP_LEVELS,
    MESSAGE_TYPE_NAMES,
    MODEL_OUTCOMES,
    NUDGE_KINDS,
    OTHER,
    TOKEN_TYPES,
    TOOL_OUTCOMES,
    TRUNCATION_STEPS,
    expected_pairs,
)
from orchestrator.metrics.series import CounterFamily, GaugeFamily, HistogramFamily

__all__ = [
    "LLM_LATENCY_BUCKETS",
    "Metrics",
    "new_registry",
]

# Model latency: OpenTelemetry GenAI's operation-duration buckets (0.01 … 81.92 s),
# stretched to the 300 s call deadline.
LLM_LATENCY_BUCKETS: Final = (*(0.01 * 2**n for n in range(14)), 160.0, 300.0)
RUN_DURATION_BUCKETS: Final = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
TOOL_DURATION_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TURN_BUCKETS: Final = (1, 2, 3, 5, 8, 13, 20, 30, 50, 100, 200)
PROMPT_TOKEN_BUCKETS: Final = (256, 1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)
WINDOW_RATIO_BUCKETS: Final = (0.1, 0.25, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
STORE_WRITE_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
)


def new_registry(*, process: bool = True) -> CollectorRegistry:
    """A fresh registry, with the process, platform and GC collectors unless ``process`` is
    false (a custom registry has none of them by default)."""
    registry = CollectorRegistry()
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


class Metrics(Collector):
    """The metrics of one runtime: one collector, registered on ``registry``.

    Each attribute is a family (:mod:`orchestrator.metrics.series`) whose ``labels(...)``
    gives a series to add to. Series of closed label sets are created here, so every
    series exists (at zero) from the first scrape; :meth:`add_models` and
    :meth:`add_tools` do the same for the per-deployment sets.

    :raises ValueError: ``registry`` has these metrics already (``Duplicated timeseries``).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        counter = CounterFamily
        histogram = HistogramFamily

        # ------------------------------------------------------------ runs
        self.build_info = GaugeFamily(
            "loopfuse_build_info",
            "Always 1; the loopfuse and Python versions in labels.",
            ("version", "python_version"),
        )
        try:
            version = metadata.version("loopfuse")
        except metadata.PackageNotFoundError:
            version = "unknown"
        self.build_info.labels(version, platform.python_version()).value = 1
        self.runs_started = counter(
            "loopfuse_runs_started",
            "Runs started (each ends with one loopfuse_runs_finished_total).",
        )
        self.runs_finished = counter(
            "loopfuse_runs_finished",
            "Runs that ended, by exit reason, cause and outcome.",
            ("exit_reason", "cause", "outcome"),
        )
        self.run_duration = histogram(
            "loopfuse_run_duration_seconds",
            "Wall-clock time from a run's start to its end.",
            RUN_DURATION_BUCKETS,
            ("exit_reason",),
        )
        self.turns = counter("loopfuse_turns", "Turns (model round trips) started, all runs.")
        self.run_turns = histogram(
            "loopfuse_run_turns", "Turns per finished run.", TURN_BUCKETS, ("exit_reason",)
        )
        # ------------------------------------------------------------ fuses
        self.loop_detections = counter(
            "loopfuse_loop_detections",
            "Loop detector findings acted on, by detector and level (warning, critical, break).",
            ("detector", "level"),
        )
        self.nudges = counter("loopfuse_nudges", "Nudges issued to runs, by kind.", ("kind",))
        self.truncation_recoveries = counter(
            "loopfuse_truncation_recoveries",
            "Steps of truncation recovery taken: escalate, recover_N, gave_up.",
            ("step",),
        )
        # ------------------------------------------------------------ model
        self.model_requests = counter(
            "loopfuse_model_requests",
            "Model requests (HTTP attempts, retries included), by model and outcome.",
            ("model", "outcome"),
        )
        self.model_duration = histogram(
            "loopfuse_model_request_duration_seconds",
            "Time to a model reply, retries included.",
            LLM_LATENCY_BUCKETS,
            ("model",),
        )
        self.model_ttft = histogram(
            "loopfuse_model_time_to_first_token_seconds",
            "Time from sending a request to the first streamed output (last attempt).",
            LLM_LATENCY_BUCKETS,
            ("model",),
        )
        self.model_tokens = counter(
            "loopfuse_model_tokens",
            "Tokens used, by model and type (input, output).",
            ("model", "token_type"),
        )
        self.model_cost = counter(
            "loopfuse_model_cost",
            "Spend on model calls: tokens times the configured prices, in their currency.",
            ("model",),
        )
        # ------------------------------------------------------------ tools
        self.tool_calls = counter(
            "loopfuse_tool_calls", "Tool calls, by tool and outcome.", ("tool", "outcome")
        )
        self.tool_duration = histogram(
            "loopfuse_tool_duration_seconds",
            "Time a tool call ran (executed calls only).",
            TOOL_DURATION_BUCKETS,
            ("tool",),
        )
        # ------------------------------------------------------------ context
        self.prompt_tokens = histogram(
            "loopfuse_model_prompt_tokens",
            "Input tokens per model request.",
            PROMPT_TOKEN_BUCKETS,
            ("model",),
        )
        self.prompt_window_ratio = histogram(
            "loopfuse_model_prompt_window_ratio",
            "Input tokens per request as a fraction of the model's context window.",
            WINDOW_RATIO_BUCKETS,
            ("model",),
        )
        self.context_actions = counter(
            "loopfuse_context_actions",
            "Transcript collapses and compactions (and silent truncations seen), by action.",
            ("action",),
        )
        self.blocked_requests = counter(
            "loopfuse_context_blocked_requests",
            "Model requests not sent because the prompt would not fit (blocking_limit).",
            ("model",),
        )
        # ------------------------------------------------------------ the daemon itself
        self.bus_messages = counter(
            "loopfuse_bus_messages",
            "Bus messages seen by the metrics recorder, by type.",
            ("type",),
        )
        self.store_write_duration = histogram(
            "loopfuse_store_write_duration_seconds",
            "Time of one write (commit) to the durable store.",
            STORE_WRITE_BUCKETS,
        )
        self.recorder_errors = counter(
            "loopfuse_metrics_recorder_errors",
            "Messages the metrics recorder failed to record (a loopfuse bug; runs go on).",
        )
        self._families = tuple(
            family
            for family in vars(self).values()
            if isinstance(family, CounterFamily | GaugeFamily | HistogramFamily)
        )
        for reason, cause in (*expected_pairs(), *((reason, OTHER) for reason in EXIT_REASONS)):
            self.runs_finished.labels(reason, cause, "done" if reason == "completed" else "failed")
        for reason in EXIT_REASONS:
            self.run_duration.labels(reason)
            self.run_turns.labels(reason)
        for detector in (*LOOP_DETECTORS, OTHER):
            for level in LOOP_LEVELS:
                self.loop_detections.labels(detector, level)
        for kind in (*NUDGE_KINDS, OTHER):
            self.nudges.labels(kind)
        for step in TRUNCATION_STEPS:
            self.truncation_recoveries.labels(step)
        for action in CONTEXT_ACTIONS:
            self.context_actions.labels(action)
        for name in MESSAGE_TYPE_NAMES:
            self.bus_messages.labels(name)
        self.add_models((OTHER,))
        self.add_tools((OTHER,))
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        """Every family's names, without samples (the registry refuses duplicates)."""
        return (family.describe() for family in self._families)

    def collect(self) -> Iterator[Metric]:
        """Every family with its current samples (safe from another thread)."""
        return (family.collect() for family in self._families)

    def add_models(self, models: tuple[str, ...] | list[str]) -> None:
        """Create the zero series of each model in ``models``."""
        for model in models:
            for outcome in MODEL_OUTCOMES:
                self.model_requests.labels(model, outcome)
            for token_type in TOKEN_TYPES:
                self.model_tokens.labels(model, token_type)
            for histogram in (
                self.model_duration,
                self.model_ttft,
                self.prompt_tokens,
                self.prompt_window_ratio,
            ):
                histogram.labels(model)
            self.model_cost.labels(model)
            self.blocked_requests.labels(model)

    def add_tools(self, tools: tuple[str, ...] | list[str]) -> None:
        """Create the zero series of each tool in ``tools``."""
        for tool in tools:
            for outcome in TOOL_OUTCOMES:
                self.tool_calls.labels(tool, outcome)
            self.tool_duration.labels(tool)
