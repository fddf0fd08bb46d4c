"""NVML sampler: per-GPU utilization, memory, SM clock, throttle reasons and temperature.

Absent cleanly: without nvidia-ml-py or without a driver, ``NvmlSampler.open()`` returns None and
the server reports no device telemetry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuSample:
    name: str
    utilization: float  # 0..1
    memory_used_bytes: int
    memory_total_bytes: int
    sm_clock_mhz: int
    throttle_reasons: int
    temperature_c: int


class NvmlSampler:
    """Samples every GPU every ``interval_s`` on the event loop (an NVML query costs ~2 us)."""

    def __init__(self, nvml: Any, interval_s: float = 0.25) -> None:
        self._nvml = nvml
        self._interval_s = interval_s
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.latest: list[GpuSample] = []
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def open(cls, interval_s: float = 0.25) -> NvmlSampler | None:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
        except Exception as exc:  # no package, no driver, no GPU: all mean "no telemetry"
            logger.info("NVML not available (%s); no GPU telemetry", exc)
            return None
        return cls(pynvml, interval_s)

    def sample(self) -> list[GpuSample]:
        nvml = self._nvml
        samples = []
        for index, handle in enumerate(self._handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            samples.append(GpuSample(
                name=f"cuda{index}",
                utilization=nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total),
                sm_clock_mhz=int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                throttle_reasons=int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
                temperature_c=int(nvml.nvmlDeviceGetTemperature(handle,
                                                                nvml.NVML_TEMPERATURE_GPU))))
        return samples

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="nvml-sampler")

    async def _run(self) -> None:
        while True:
            try:
                self.latest = self.sample()
            except Exception:
                logger.exception("NVML sample failed")
            await asyncio.sleep(self._interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
