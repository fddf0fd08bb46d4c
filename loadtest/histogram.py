"""Latency percentiles from an HDR histogram (the maintained ``hdrhistogram`` package)."""

from __future__ import annotations

from collections.abc import Iterable

from hdrh.histogram import HdrHistogram

_PERCENTILES = (50.0, 90.0, 99.0, 99.9)
_MAX_US = 600_000_000  # 10 minutes


class LatencyHistogram:
    """Microsecond resolution from 1 us to 10 min, 3 significant digits."""

    def __init__(self) -> None:
        self._hist = HdrHistogram(1, _MAX_US, 3)

    def record_s(self, latency_s: float) -> None:
        self._hist.record_value(min(_MAX_US, max(1, round(latency_s * 1e6))))

    def record_all_s(self, latencies_s: Iterable[float]) -> None:
        for latency in latencies_s:
            self.record_s(latency)

    @property
    def count(self) -> int:
        return int(self._hist.get_total_count())

    def percentile_ms(self, percentile: float) -> float:
        return self._hist.get_value_at_percentile(percentile) / 1000.0

    def summary_ms(self) -> dict[str, float]:
        if not self.count:
            return {}
        summary = {f"p{p:g}": self.percentile_ms(p) for p in _PERCENTILES}
        summary["max"] = self._hist.get_max_value() / 1000.0
        summary["mean"] = self._hist.get_mean_value() / 1000.0
        return summary
