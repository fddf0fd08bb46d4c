"""Prometheus text exposition format (version 0.0.4): metric families rendered to text.

Hand-written rather than a client library so metric names stay exactly as chosen (Triton's
counters have no ``_total`` suffix, which prometheus_client would add) and the server needs no
extra dependency. Families are built at scrape time; nothing here runs per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class MetricFamily:
    """One metric name, its help and type, and its samples (one per label set)."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((tuple(labels.items()), value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def render(families: list[MetricFamily]) -> str:
    """The families as exposition text; a family without samples is left out."""
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            label_text = ",".join(f'{key}="{_escape_label(val)}"' for key, val in labels)
            name = f"{family.name}{{{label_text}}}" if label_text else family.name
            lines.append(f"{name} {format_value(value)}")
    return "\n".join(lines) + "\n" if lines else ""
