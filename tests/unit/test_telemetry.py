"""The NVML sampler against a hand-written fake of the pynvml module."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evenflow.server.observability.telemetry import NvmlSampler


class FakeNvml:
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, count: int) -> None:
        self.count = count
        self.shut_down = False

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=50 + handle)

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return 4 if handle else 0

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 60

    def nvmlShutdown(self) -> None:
        self.shut_down = True


def test_sampler_reads_every_gpu() -> None:
    sampler = NvmlSampler(FakeNvml(2))
    first, second = sampler.sample()
    assert (first.name, first.utilization, first.memory_used_bytes) == ("cuda0", 0.5, 2**30)
    assert (second.name, second.throttle_reasons, second.sm_clock_mhz) == ("cuda1", 4, 1980)


async def test_sampler_task_is_owned_and_closed() -> None:
    nvml = FakeNvml(1)
    sampler = NvmlSampler(nvml, interval_s=0.001)
    sampler.start()
    await sampler.close()
    assert nvml.shut_down
    assert sampler._task is None


def test_absent_nvml_means_no_sampler(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "pynvml":
            raise ImportError("no nvidia-ml-py")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    assert NvmlSampler.open() is None


def test_the_busy_meter_forgets_old_intervals_even_when_nobody_reads_it() -> None:
    from evenflow.balancer.stats import BusyMeter

    meter = BusyMeter(window_s=1.0)
    for i in range(10_000):
        meter.record(i * 0.01, i * 0.01 + 0.005)
    assert len(meter._intervals) <= 101  # one window's worth, not 10,000
    assert meter.fraction(100.0) == pytest.approx(0.5)
