"""Metric families kept as plain Python numbers, exposed through prometheus_client at scrape.

A series is a small object the recorder adds to directly (``series.value += 1``); a
histogram finds its bucket with :func:`bisect` in precomputed bounds and keeps each
bucket's last exemplar as a tuple. At scrape, the families produce the same
:class:`~prometheus_client.Metric` objects prometheus_client's own metrics do (names,
types, help, label order, ``le`` strings, ``_created`` samples, exemplars), so the
exposition is theirs. Why not prometheus_client's own: ``docs/performance.md``.

Threads: series change on the event loop's thread. A scrape on another thread copies each
family's series dict, and each histogram's counts and exemplars, before reading them, so it
never sees a dict change size under it; a histogram's ``_sum`` may lag its buckets by the
observation in flight, as with prometheus_client's per-value locks.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Final, Generic, TypeVar

import prometheus_client.metrics
from prometheus_client.core import Metric
from prometheus_client.samples import Exemplar
from prometheus_client.utils import INF, floatToGoString

__all__ = [
    "CounterFamily",
    "CounterSeries",
    "ExemplarLabels",
    "Family",
    "GaugeFamily",
    "GaugeSeries",
    "HistogramFamily",
    "HistogramSeries",
]

ExemplarLabels = dict[str, str]
"""An exemplar's labels (``run_id``, ``trace_id``), within OpenMetrics' 128 characters:
:func:`~orchestrator.metrics.labels.exemplar` makes them; they are not checked again."""

_Kept = tuple[ExemplarLabels, float, float]  # labels, value, unix time


class CounterSeries:
    """One counter series: add to :attr:`value` (never a negative amount)."""

    __slots__ = ("created", "exemplar", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()
        self.exemplar: _Kept | None = None

    def inc(self, amount: int | float = 1, exemplar: ExemplarLabels | None = None) -> None:
        """Add ``amount``; keep ``exemplar`` as this series' exemplar.

        :raises ValueError: ``amount`` is negative.
        """
        # ``int | float``, not ``float``: compiled, a ``float`` parameter turns an int into
        # a float, and the error below would say ``-1.0`` where Python says ``-1``.
        if amount < 0:
            raise ValueError(f"a counter only goes up: {amount} is negative")
        self.value += amount
        if exemplar:
            self.exemplar = (exemplar, amount, time.time())


class GaugeSeries:
    """One gauge series: set :attr:`value`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class HistogramSeries:
    """One histogram series over ``bounds`` (ascending, ending with ``+Inf``)."""

    __slots__ = ("bounds", "counts", "created", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()
        self.exemplars: list[_Kept | None] = [None] * len(bounds)

    def observe(self, amount: float, exemplar: ExemplarLabels | None = None) -> None:
        """Count ``amount`` in the first bucket whose bound is at least ``amount``; keep
        ``exemplar`` as that bucket's exemplar."""
        self.sum += amount
        if amount != amount:  # NaN: in no bucket, as with prometheus_client
            return
        index = bisect_left(self.bounds, amount)
        self.counts[index] += 1
        if exemplar:
            self.exemplars[index] = (exemplar, amount, time.time())


_Series = TypeVar("_Series", CounterSeries, GaugeSeries, HistogramSeries)


class Family(Generic[_Series]):
    """The series of one metric, by label values, in the order they were created."""

    kind: str = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.series: dict[tuple[str, ...], _Series] = {}
        if not self.labelnames:
            self.labels()

    def _new(self) -> _Series:
        raise NotImplementedError

    def labels(self, *values: str) -> _Series:
        """The series of ``values`` (one per label name), created at zero if new.

        :raises ValueError: not one value per label name.
        """
        series = self.series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(
                    f"{self.name}: {len(values)} label values for labels {self.labelnames}"
                )
            series = self.series[values] = self._new()
        return series

    def describe(self) -> Metric:
        """The family without samples (its names, for the registry's duplicate check)."""
        return Metric(self.name, self.documentation, self.kind)

    def collect(self) -> Metric:
        """The family with a sample per series, as prometheus_client would expose it."""
        metric = self.describe()
        names = self.labelnames
        # Whether ``_created`` samples are exposed (prometheus_client's own switch:
        # ``PROMETHEUS_DISABLE_CREATED_SERIES``, ``disable_created_metrics()``).
        created = bool(getattr(prometheus_client.metrics, "_use_created", True))
        # dict.copy() runs no Python code midway; list(d.items()) could, through a garbage
        # collection its tuples trigger, while the loop's thread adds a series.
        for values, series in self.series.copy().items():
            self._samples(metric, dict(zip(names, values, strict=True)), series, created)
        return metric

    def _samples(
        self, metric: Metric, labels: dict[str, str], series: _Series, created: bool
    ) -> None:
        raise NotImplementedError


class CounterFamily(Family[CounterSeries]):
    """A counter; ``name`` without ``_total`` (its sample carries the suffix)."""

    kind = "counter"

    def _new(self) -> CounterSeries:
        return CounterSeries()

    def _samples(
        self, metric: Metric, labels: dict[str, str], series: CounterSeries, created: bool
    ) -> None:
        kept = series.exemplar
        exemplar = Exemplar(*kept) if kept is not None else None
        metric.add_sample(f"{self.name}_total", labels, series.value, None, exemplar)
        if created:
            metric.add_sample(f"{self.name}_created", labels, series.created)


class GaugeFamily(Family[GaugeSeries]):
    """A gauge."""

    kind = "gauge"

    def _new(self) -> GaugeSeries:
        return GaugeSeries()

    def _samples(
        self, metric: Metric, labels: dict[str, str], series: GaugeSeries, created: bool
    ) -> None:
        metric.add_sample(self.name, labels, series.value)


class HistogramFamily(Family[HistogramSeries]):
    """A histogram with ``buckets`` (upper bounds; ``+Inf`` is added)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        labelnames: Sequence[str] = (),
    ) -> None:
        bounds = [float(bound) for bound in buckets]
        if bounds != sorted(bounds) or not bounds:
            raise ValueError(f"{name}: buckets must be ascending: {buckets}")
        if bounds[-1] != INF:
            bounds.append(INF)
        self.bounds: Final = tuple(bounds)
        self._le: Final = tuple(floatToGoString(bound) for bound in bounds)  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames)

    def _new(self) -> HistogramSeries:
        return HistogramSeries(self.bounds)

    def _samples(
        self, metric: Metric, labels: dict[str, str], series: HistogramSeries, created: bool
    ) -> None:
        counts = list(series.counts)
        exemplars = list(series.exemplars)
        name = self.name
        total = 0.0
        for index, le in enumerate(self._le):
            total += counts[index]
            kept = exemplars[index]
            exemplar = Exemplar(*kept) if kept is not None else None
            metric.add_sample(f"{name}_bucket", {**labels, "le": le}, total, None, exemplar)
        metric.add_sample(f"{name}_count", labels, total)
        if self.bounds[0] >= 0:  # a sum of negative amounts is no counter
            metric.add_sample(f"{name}_sum", labels, series.sum)
        if created:
            metric.add_sample(f"{name}_created", labels, series.created)
