"""Exact percentiles over a list of values: one definition for every report.

Nearest rank: the q-quantile is the smallest value with at least a fraction q of the values at or
below it (the ``ceil(q * n)``-th smallest). It is always one of the measured values, and it is
the definition HDR histograms (``loadtest.histogram``) approximate, so the exact and the
histogram figures agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def ordered_percentile(ordered: Sequence[float] | Any, q: float) -> float:
    """The q-quantile (0 <= q <= 1) of values already sorted ascending."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    count = len(ordered)
    if count == 0:
        raise ValueError("no values")
    return float(ordered[min(count - 1, max(0, math.ceil(q * count) - 1))])


def percentile(values: Iterable[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of ``values`` in any order."""
    return ordered_percentile(sorted(values), q)
