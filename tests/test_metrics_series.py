"""The plain-Python series behind the recorder: the same samples as prometheus_client's own
metrics, exemplars within OpenMetrics' limit, every message type dispatched, and a scrape
from another thread while the event loop records."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from bus import MESSAGE_TYPES, Bus, ModelReply, ToolResult, TurnStarted, Usage
from orchestrator.metrics import MetricsRecorder, new_registry
from orchestrator.metrics.labels import EXEMPLAR_MAX_CHARS, exemplar
from orchestrator.metrics.recorder import COUNTED_ONLY
from orchestrator.metrics.series import CounterFamily, Family, HistogramFamily
from tests.messages_examples import examples
from tests.started import run_started

BUCKETS = (0.01, 0.5, 1, 2.5, 300)
FROZEN = 1_700_000_000.25


@pytest.fixture
def frozen_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: FROZEN)


class _One(Collector):
    def __init__(self, family: Family[Any]) -> None:
        self._family = family

    def collect(self) -> Iterator[prometheus_client.Metric]:
        yield self._family.collect()


def _scrapes(registry: CollectorRegistry) -> tuple[str, str]:
    openmetrics: bytes = generate_openmetrics(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry).decode(), openmetrics.decode()


# --------------------------------------------------------------------------- series


@pytest.mark.usefixtures("frozen_time")
def test_a_histogram_exposes_what_prometheus_client_does() -> None:
    ours = HistogramFamily("h_seconds", "Help.", BUCKETS, ("model",))
    theirs_registry = CollectorRegistry()
    theirs = Histogram("h_seconds", "Help.", ("model",), buckets=BUCKETS, registry=theirs_registry)
    ex = {"run_id": "r1"}
    # bounds are inclusive; below the first, beyond the last, negative, infinite, NaN
    amounts = (0.01, 0.010001, 0.0, -3.0, 1, 2.5, 299.99, 300.0, 301.0, math.inf, math.nan)
    for index, amount in enumerate(amounts):
        labels = ("a",) if index % 2 else ("b",)
        ours.labels(*labels).observe(amount, ex if index % 3 else None)
        theirs.labels(*labels).observe(amount, ex if index % 3 else None)
    ours_registry = CollectorRegistry()
    ours_registry.register(_One(ours))
    assert _scrapes(ours_registry) == _scrapes(theirs_registry)


@pytest.mark.usefixtures("frozen_time")
def test_a_counter_exposes_what_prometheus_client_does() -> None:
    ours = CounterFamily("c", "Help.", ("kind",))
    theirs_registry = CollectorRegistry()
    theirs = Counter("c", "Help.", ("kind",), registry=theirs_registry)
    for kind, amount in (("x", 1), ("y", 2.5), ("x", 0), ("z", 3)):
        ours.labels(kind).inc(amount, {"run_id": kind})
        theirs.labels(kind).inc(amount, {"run_id": kind})
    ours.labels("w").value += 4  # the recorder's hot path adds directly
    theirs.labels("w").inc(4)
    ours_registry = CollectorRegistry()
    ours_registry.register(_One(ours))
    assert _scrapes(ours_registry) == _scrapes(theirs_registry)
    with pytest.raises(ValueError, match="-1 is negative"):
        ours.labels("x").inc(-1)


def test_label_values_must_match_the_label_names() -> None:
    family = CounterFamily("loopfuse_things", "Help.", ("a", "b"))
    with pytest.raises(
        ValueError, match=r"loopfuse_things: 1 label values for labels \('a', 'b'\)"
    ):
        family.labels("only-one")
    with pytest.raises(ValueError, match="ascending"):
        HistogramFamily("h", "Help.", (2, 1))


def test_created_samples_follow_prometheus_clients_switch() -> None:
    rec_registry = new_registry(process=False)
    MetricsRecorder(Bus(), rec_registry)
    assert "loopfuse_runs_started_created" in generate_latest(rec_registry).decode()
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        text = generate_latest(rec_registry).decode()
    finally:
        prometheus_client.enable_created_metrics()  # type: ignore[no-untyped-call]
    assert "_created" not in text
    assert "loopfuse_runs_started_total 0.0" in text


# --------------------------------------------------------------------------- exemplars


@pytest.mark.parametrize(
    ("run_id", "trace_id"),
    [("r", "t" * 32), ("r" * 90, "t" * 32), ("r" * 122, None), ("r" * 500, "t" * 500)],
)
def test_exemplars_stay_within_the_openmetrics_limit(run_id: str, trace_id: str | None) -> None:
    labels = exemplar(run_id, trace_id)
    assert sum(len(k) + len(v) for k, v in labels.items()) <= EXEMPLAR_MAX_CHARS
    registry = new_registry(process=False)
    rec = MetricsRecorder(Bus(), registry)
    rec.handle(run_started(run_id=run_id, trace_id=trace_id or "", task="x", model="m"))
    rec.handle(ModelReply(run_id=run_id, turn=1, text="", latency_seconds=0.3))
    _, openmetrics = _scrapes(registry)
    # The parser refuses exemplars over 128 characters; each sample keeps the last one.
    parsed = {
        sample.name: sample.exemplar
        for family in text_string_to_metric_families(openmetrics)  # type: ignore[no-untyped-call]
        for sample in family.samples
        if sample.exemplar is not None
    }
    assert parsed["loopfuse_model_request_duration_seconds_bucket"].labels == labels


# --------------------------------------------------------------------------- dispatch


def test_every_message_type_is_handled_or_only_counted() -> None:
    registry = new_registry(process=False)
    rec = MetricsRecorder(Bus(), registry)
    handled = set(rec.handlers())  # COUNTED_ONLY are the others
    assert handled.isdisjoint(COUNTED_ONLY)
    assert handled | set(COUNTED_ONLY) == set(MESSAGE_TYPES)
    for msg in examples():
        rec.handle(msg)  # type: ignore[arg-type]
        name = type(msg).__name__
        assert registry.get_sample_value("loopfuse_bus_messages_total", {"type": name}), name


# --------------------------------------------------------------------------- threads


class _Finalised:
    """Cyclic garbage with a finalizer: the collector then runs Python code (a chance for
    the other thread to run) in the middle of whatever allocation triggered it."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(50))


@pytest.fixture
def switch_often() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.usefixtures("switch_often")
def test_a_scrape_from_another_thread_while_recording() -> None:
    registry = new_registry(process=False)
    rec = MetricsRecorder(Bus(), registry, models=("m",), tools=("echo",))
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[float] = []

    def scrape() -> None:
        try:
            while not stop.is_set():
                for family in registry.collect():
                    if family.name == "loopfuse_turns":
                        seen.append(family.samples[0].value)
                generate_latest(registry)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for index in range(4000):
            run_id = f"r{index}"
            rec.handle(run_started(run_id=run_id, trace_id="t", task="x", model="m"))
            rec.handle(TurnStarted(run_id=run_id, turn=1, stage="agent", prompt_messages=1))
            rec.handle(
                ModelReply(
                    run_id=run_id, turn=1, text="", usage=Usage(prompt_tokens=9), latency_seconds=1
                )
            )
            rec.handle(ToolResult(run_id=run_id, turn=1, call_id="c", tool="echo", content=""))
            if index % 4 == 0:  # new series appear while the other thread reads them
                rec.add_tools((f"tool{index}",))
            for _ in range(20):
                _Finalised()
    finally:
        stop.set()
        scraper.join(timeout=30)
    assert not scraper.is_alive()
    assert errors == []
    assert seen, "the other thread scraped nothing"
    assert seen == sorted(seen)  # a counter never goes back
    assert registry.get_sample_value("loopfuse_turns_total") == 4000
    assert (
        registry.get_sample_value(
            "loopfuse_tool_calls_total", {"tool": "tool3996", "outcome": "ok"}
        )
        == 0
    )
    durations = "loopfuse_model_request_duration_seconds_count"
    assert registry.get_sample_value(durations, {"model": "m"}) == 4000
