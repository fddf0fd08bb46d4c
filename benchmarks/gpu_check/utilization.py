"""GPU utilization sampled in the background: NVML (nvidia-ml-py) where it imports, else
``nvidia-smi -lms 200`` where it is on PATH, else not sampled. Samples carry the time they were
taken, so a caller splits them by phase."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from evenflow.server.observability.telemetry import NvmlSampler

INTERVAL_S = 0.2


@dataclass
class UtilizationSampler:
    """``with UtilizationSampler() as s: ...`` then ``s.mean_between(t0, t1)`` (0..1, cuda:0)."""

    source: str = "not sampled"
    samples: list[tuple[float, float]] = field(default_factory=list)  # (monotonic s, 0..1)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _smi: subprocess.Popen[str] | None = None

    def __enter__(self) -> UtilizationSampler:
        nvml = NvmlSampler.open()
        if nvml is not None:
            self.source = "nvml"
            self._thread = threading.Thread(target=self._nvml_loop, args=(nvml,), daemon=True)
        elif (smi := shutil.which("nvidia-smi")) is not None:
            self.source = "nvidia-smi"
            self._smi = subprocess.Popen(
                [smi, "--id=0", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 f"-lms={int(INTERVAL_S * 1000)}"], stdout=subprocess.PIPE, text=True)
            self._thread = threading.Thread(target=self._smi_loop, daemon=True)
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
            self._smi.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _nvml_loop(self, nvml: Any) -> None:
        while not self._stop.wait(INTERVAL_S):
            sample = next((s for s in nvml.sample() if s.name == "cuda0"), None)
            # Where NVML cannot read utilization (MIG) it reports 0: no sample, not an idle GPU.
            if sample is not None and "utilization" not in sample.unsupported:
                self.samples.append((time.monotonic(), sample.utilization))

    def _smi_loop(self) -> None:
        assert self._smi is not None and self._smi.stdout is not None
        for line in self._smi.stdout:
            text = line.strip()
            if text.isdigit():
                self.samples.append((time.monotonic(), int(text) / 100.0))

    def mean_between(self, start_s: float, end_s: float) -> float | None:
        inside = [u for t, u in self.samples if start_s <= t <= end_s]
        return sum(inside) / len(inside) if inside else None
