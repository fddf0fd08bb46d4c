"""Metric families built at scrape time, exposed in Prometheus' text format by
``prometheus_client``.

``MetricFamily`` is what ``server.metrics`` fills from the balancers' counters; ``render`` hands
the families to prometheus_client as a custom collector and returns its exposition. Nothing here
runs per request.

Triton's counters are named without the ``_total`` suffix (``nv_inference_count``) and
Triton's dashboards query them by those names; prometheus_client's text format appends
``_total`` to every counter family, so counters named without it are exposed as ``untyped``,
which keeps the sample names exactly as Triton's (``rate()`` works on them the same).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import exposition
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

CONTENT_TYPE = exposition.CONTENT_TYPE_PLAIN_0_0_4

Labels = tuple[tuple[str, str], ...]
_TOTAL = "_total"


@dataclass(slots=True)
class MetricFamily:
    """One metric name, its help and kind ("counter" or "gauge"), and its samples."""

    name: str
    kind: str
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((tuple(labels.items()), value))


def to_metric(family: MetricFamily) -> Metric:
    """The family as a prometheus_client metric (label names in first-seen order)."""
    label_names = list(dict.fromkeys(key for labels, _ in family.samples for key, _ in labels))
    metric: Metric
    if family.kind == "gauge":
        metric = GaugeMetricFamily(family.name, family.help, labels=label_names)
    elif family.kind == "counter" and family.name.endswith(_TOTAL):
        metric = CounterMetricFamily(family.name.removesuffix(_TOTAL), family.help,
                                     labels=label_names)
    elif family.kind == "counter":  # a Triton name: keep it exactly
        metric = Metric(family.name, family.help, "unknown")
        for labels, value in family.samples:
            metric.add_sample(family.name, dict(labels), value)
        return metric
    else:
        raise ValueError(f"metric {family.name}: unknown kind {family.kind!r}")
    for labels, value in family.samples:
        metric.add_metric([dict(labels).get(name, "") for name in label_names], value)
    return metric


def histogram(name: str, help_text: str, label_names: list[str],
              series: Iterable[tuple[list[str], list[tuple[float, int]], float]]) -> Metric:
    """A histogram family: per label set, cumulative ``(upper bound, count)`` buckets (+Inf
    last) and the sum of the observed values."""
    metric = HistogramMetricFamily(name, help_text, labels=label_names)
    for labels, buckets, total in series:
        metric.add_metric(labels, [(_bound(b), count) for b, count in buckets], total)
    return metric


def _bound(upper: float) -> str:
    return "+Inf" if upper == float("inf") else repr(upper)


class _Collector:
    """prometheus_client's collector protocol over families already read."""

    def __init__(self, families: Iterable[MetricFamily | Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            if family.samples:  # a family without samples is left out
                yield to_metric(family) if isinstance(family, MetricFamily) else family


def render(families: Iterable[MetricFamily | Metric]) -> bytes:
    """The exposition page of ``families`` (Prometheus text format 0.0.4)."""
    return exposition.generate_latest(_Collector(families))  # type: ignore[arg-type]
