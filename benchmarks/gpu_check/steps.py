"""The steps, in the order they run: what each needs and how long it may take.

A step is a function of a ``StepContext`` returning its figures (JSON-able); it raises to fail.
Each runs in its own process (``run_step``), so a hang or a crash ends only that step.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.gpu_check.context import StepContext


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    title: str
    function: str  # "module:function" in this package, imported only in the step's process
    timeout_s: float
    dry_run: bool  # runs without CUDA (on cpu) in a dry run; else "needs CUDA" there
    min_gpus: int = 1

    def load(self) -> Callable[[StepContext], dict[str, Any]]:
        module, _, name = self.function.partition(":")
        return getattr(importlib.import_module(f"benchmarks.gpu_check.{module}"), name)  # type: ignore[no-any-return]


STEPS = (
    Step("gpu_tests", "GPU tests (pytest tests/gpu -m gpu)", "gpu_tests:gpu_tests", 270.0, True),
    Step("serve", "server on the device, thread and process workers, answers bit-exact",
         "server_steps:serve", 240.0, True),
    Step("pipeline", "pipelines cpu,cuda:0 and cuda:0,cpu", "server_steps:pipeline", 150.0,
         True),
    Step("warmup", "warm-up per model (load to READY, first answer)", "server_steps:warmup",
         150.0, True),
    Step("bandwidth", "host<->device copy bandwidth, pageable and pinned",
         "bandwidth:bandwidth", 60.0, False),
    Step("encoder", "bare encoder at its best batch vs evenflow, GPU utilization",
         "encoder:encoder", 180.0, False),
    Step("uneven", "least-work vs round-robin, one GPU loaded by another process",
         "uneven:uneven", 180.0, False, min_gpus=2),
)
