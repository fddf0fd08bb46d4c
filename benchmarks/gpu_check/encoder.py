"""Step (f): the bare bert-base encoder at its best batch against evenflow serving it
(``benchmarks.gpu_encoder``), with GPU utilization sampled in each phase."""

from __future__ import annotations

import time
from typing import Any

from benchmarks import gpu_encoder
from benchmarks.gpu_check.context import StepContext
from benchmarks.gpu_check.utilization import UtilizationSampler

SERVED_SECONDS = 10.0
CONCURRENCY = 64


def encoder(ctx: StepContext) -> dict[str, Any]:
    marks: dict[str, float] = {}

    def mark(phase: str) -> None:
        marks[phase] = time.monotonic()

    with UtilizationSampler() as sampler:
        result = gpu_encoder.measure(SERVED_SECONDS, CONCURRENCY, ctx.out, on_phase=mark)
    utilization = {phase: sampler.mean_between(marks[phase], marks[after])
                   for phase, after in (("bare", "served"), ("served", "done"))}
    return {**result, "utilization_source": sampler.source,
            "mean_gpu_utilization": utilization if sampler.source != "not sampled"
            else "not sampled"}
