"""The NVML sampler against a hand-written fake pynvml: GPUs named by CUDA ordinal through
their UUIDs (a permuted CUDA_VISIBLE_DEVICES, MIG instances), a field a board does not
support leaving the rest of the sample in place, logged once, and out of the metrics; a GPU
NVML cannot open left out (no telemetry at all, NVML shut down, when none is left); a call
stuck in NVML holding up neither the event loop nor close()."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from evenflow.server.observability.metrics import collect
from evenflow.server.observability.prometheus import render
from evenflow.server.observability.telemetry import (
    GpuSample,
    NvmlSampler,
    cuda_ordinals,
    normalized_uuid,
)

pytestmark = pytest.mark.timeout(20)

UUIDS = ("GPU-aaaaaaaa-0000-0000-0000-000000000000",
         "GPU-bbbbbbbb-1111-1111-1111-111111111111",
         "GPU-cccccccc-2222-2222-2222-222222222222")


class NotSupported(Exception):
    """What pynvml raises for a query the board does not answer (NVMLError_NotSupported)."""

    value = 3  # NVML_ERROR_NOT_SUPPORTED


class GpuIsLost(Exception):
    """What pynvml raises for any query to a GPU fallen off the bus (NVMLError_GpuIsLost)."""

    value = 15  # NVML_ERROR_GPU_IS_LOST


@dataclass
class FakeNvml:
    """GPUs in PCI order, each handle its NVML index; ``unsupported`` holds (handle, query)
    pairs that raise; ``mig`` maps a GPU's index to its MIG slots' UUIDs (None: empty);
    ``lost``: the indices whose handle NVML cannot give (a GPU fallen off the bus); ``failing``:
    the handles whose every query fails (one that fell off the bus after it was opened)."""

    uuids: tuple[str, ...] = UUIDS
    unsupported: set[tuple[object, str]] = field(default_factory=set)
    mig: dict[int, list[str | None]] = field(default_factory=dict)
    as_bytes: bool = False
    lost: set[int] = field(default_factory=set)
    failing: set[object] = field(default_factory=set)
    calls: int = 0
    inits: int = 0
    shutdowns: int = 0

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_NOT_SUPPORTED = 3

    def _query(self, handle: object, what: str) -> None:
        self.calls += 1
        if handle in self.failing:
            raise GpuIsLost("GPU is lost")
        if (handle, what) in self.unsupported:
            raise NotSupported("Not Supported")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if index in self.lost:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return index

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        if isinstance(handle, tuple):  # a MIG instance: (gpu, slot)
            uuid = self.mig[handle[0]][handle[1]]
            assert uuid is not None
        else:
            assert isinstance(handle, int)
            uuid = self.uuids[handle]
        return uuid.encode() if self.as_bytes else uuid

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        if handle not in self.mig:
            raise NotSupported("not MIG-capable")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return len(self.mig[handle])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> tuple[int, int]:
        if self.mig[handle][slot] is None:
            raise NotSupported("NVML_ERROR_NOT_FOUND")
        return (handle, slot)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:
        self._query(handle, "memory")
        if isinstance(handle, tuple):
            gpu, slot = handle
            handle = gpu * 10 + slot + 100  # MIG (1, 1): 111
        assert isinstance(handle, int)
        return SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:
        self._query(handle, "utilization")
        return SimpleNamespace(gpu=50)

    def nvmlDeviceGetClockInfo(self, handle: object, clock: int) -> int:
        self._query(handle, "clock")
        return 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
        self._query(handle, "throttle")
        return 4

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        self._query(handle, "temperature")
        return 61

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


def _bare(uuid: str) -> str:
    """As torch prints a device's UUID: no ``GPU-`` prefix."""
    return uuid.removeprefix("GPU-")


def test_uuids_compare_without_prefix_case_or_bytes() -> None:
    assert normalized_uuid("GPU-ABCD-1") == normalized_uuid(b"abcd-1\0") == "abcd-1"
    assert normalized_uuid("MIG-abcd-2") == normalized_uuid("abcd-2")
    assert cuda_ordinals(list(UUIDS), [_bare(UUIDS[2]), UUIDS[0]]) == [1, None, 0]


@pytest.mark.parametrize("as_bytes", [False, True])
def test_gpus_are_named_by_cuda_ordinal_under_a_permuted_visible_devices(
        as_bytes: bool) -> None:
    """CUDA_VISIBLE_DEVICES=2,0: CUDA's device 0 is NVML's (PCI) device 2, its device 1 is
    NVML's 0, and NVML's 1 is not this process's GPU at all."""
    nvml = FakeNvml(as_bytes=as_bytes)
    sampler = NvmlSampler(nvml, cuda_uuids=lambda: [_bare(UUIDS[2]), _bare(UUIDS[0])])
    samples = sampler.sample()
    assert [s.name for s in samples] == ["cuda0", "cuda1"]
    used = {s.name: s.memory_used_bytes // 2**30 for s in samples}
    assert used == {"cuda0": 3, "cuda1": 1}  # NVML handle 2, then handle 0


def test_a_mig_instance_cuda_sees_is_sampled_through_its_own_handle() -> None:
    mig_uuid = "MIG-dddddddd-3333-3333-3333-333333333333"
    nvml = FakeNvml(mig={1: [None, mig_uuid]})
    sampler = NvmlSampler(nvml, cuda_uuids=lambda: [mig_uuid])
    (sample,) = sampler.sample()
    assert sample.name == "cuda0"
    assert sample.memory_used_bytes == (1 * 10 + 1 + 100 + 1) * 2**30  # MIG handle (1, 1)


def test_without_uuids_to_match_gpus_keep_nvml_order() -> None:
    sampler = NvmlSampler(FakeNvml(), cuda_uuids=lambda: [])
    assert sampler.names == ["cuda0", "cuda1", "cuda2"]


def test_an_unsupported_field_leaves_the_others_and_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(unsupported={(1, "clock"), (1, "throttle")})
    sampler = NvmlSampler(nvml, cuda_uuids=lambda: [_bare(u) for u in UUIDS])
    caplog.set_level(logging.WARNING, logger="evenflow.server.observability.telemetry")
    for _ in range(200):  # 50 s of samples at the default interval
        first, second, third = sampler.sample()
    assert (second.utilization, second.temperature_c, second.memory_total_bytes) == \
        (0.5, 61, 80 * 2**30)
    assert second.unsupported == {"sm_clock_mhz", "throttle_reasons"}
    assert (second.sm_clock_mhz, second.throttle_reasons) == (0, 0)
    assert not first.unsupported and first.sm_clock_mhz == 1980 and third.throttle_reasons == 4
    warnings = [r for r in caplog.records if r.name == "evenflow.server.observability.telemetry"]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]
    assert all("cuda1" in r.getMessage() and not r.exc_info for r in warnings)
    assert {r.getMessage().split(" cannot read ")[1].split(" ")[0] for r in warnings} == \
        {"sm_clock", "throttle_reasons"}


def test_a_gpu_whose_queries_fail_is_reported_stale_not_as_unsupported_fields() -> None:
    nvml = FakeNvml(failing={1})  # fell off the bus after the sampler opened it
    sampler = NvmlSampler(nvml, cuda_uuids=lambda: [_bare(u) for u in UUIDS[:2]])
    first, second = sampler.sample()
    assert not first.stale and second.stale
    text = render(collect([], [first, second], {})).decode()
    stale = {s.labels["gpu"]: s.value for family in text_string_to_metric_families(text)
             for s in family.samples if s.name == "evenflow_gpu_telemetry_stale"}
    assert stale == {"cuda0": 0.0, "cuda1": 1.0}
    nvml.failing.clear()  # back (an Xid a reset cleared): fresh again
    assert not sampler.sample()[1].stale


def test_a_field_nvml_cannot_read_is_left_out_of_the_metrics_not_exported_as_0() -> None:
    """Utilization on a MIG instance: the GPU has no nv_gpu_utilization sample (0 would read
    as an idle GPU); its other fields, and the other GPUs' utilization, are there."""
    nvml = FakeNvml(unsupported={(0, "utilization")})
    sampler = NvmlSampler(nvml, cuda_uuids=lambda: [_bare(u) for u in UUIDS[:2]])
    text = render(collect([], sampler.sample(), {})).decode()
    gpus = {(s.name, s.labels["gpu"]) for family in text_string_to_metric_families(text)
            for s in family.samples if "gpu" in s.labels}
    assert ("nv_gpu_utilization", "cuda0") not in gpus
    assert ("nv_gpu_utilization", "cuda1") in gpus
    assert {("nv_gpu_memory_used_bytes", "cuda0"), ("evenflow_gpu_temperature_celsius", "cuda0"),
            ("evenflow_gpu_sm_clock_hertz", "cuda0")} <= gpus


def _open(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch,
          cuda_uuids: Callable[[], list[str]]) -> NvmlSampler | None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return NvmlSampler.open(cuda_uuids=cuda_uuids)


@pytest.mark.parametrize("by_uuid", [True, False])
def test_open_leaves_out_a_gpu_nvml_cannot_open(
        by_uuid: bool, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """NVML's device 1 is lost: the sampler samples the others, under their own names,
    whether they are matched to CUDA by UUID or named by NVML index."""
    nvml = FakeNvml(lost={1})
    caplog.set_level(logging.WARNING, logger="evenflow.server.observability.telemetry")
    sampler = _open(nvml, monkeypatch, (lambda: [_bare(u) for u in UUIDS]) if by_uuid
                    else list)
    assert sampler is not None
    assert sampler.names == ["cuda0", "cuda2"]
    assert [s.name for s in sampler.sample()] == ["cuda0", "cuda2"]
    assert (nvml.inits, nvml.shutdowns) == (1, 0)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "device 1" in warning and "GPU_IS_LOST" in warning


@pytest.mark.parametrize("by_uuid", [True, False])
def test_open_without_a_gpu_left_is_no_telemetry_and_shuts_nvml_down(
        by_uuid: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(lost={0, 1, 2})
    assert _open(nvml, monkeypatch, (lambda: [_bare(u) for u in UUIDS]) if by_uuid
                 else list) is None
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_open_when_nvml_fails_building_the_sampler_is_no_telemetry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()

    def no_count() -> int:
        raise RuntimeError("NVML_ERROR_UNKNOWN")

    monkeypatch.setattr(nvml, "nvmlDeviceGetCount", no_count)
    assert _open(nvml, monkeypatch, list) is None
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


@dataclass
class StuckNvml(FakeNvml):
    """Its temperature query number ``stuck_at`` (1: the first) blocks (a GPU in a bad state)
    until ``release`` is set; ``on_stuck`` is called as it blocks, ``stuck`` holds while it
    does."""

    release: threading.Event = field(default_factory=threading.Event)
    on_stuck: Callable[[], None] = lambda: None
    stuck_at: int = 1
    stuck: bool = False
    blocked_once: bool = False
    temperatures: int = 0

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        self.temperatures += 1
        if not self.blocked_once and self.temperatures == self.stuck_at:
            self.blocked_once = self.stuck = True
            self.on_stuck()
            self.release.wait(timeout=5)  # bounded: the test fails, not hangs, on the loop
            self.stuck = False
        return super().nvmlDeviceGetTemperature(handle, sensor)


async def test_a_stuck_nvml_call_holds_up_neither_the_loop_nor_close(
        caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    stuck = asyncio.Event()
    nvml = StuckNvml(on_stuck=lambda: loop.call_soon_threadsafe(stuck.set))
    sampler = NvmlSampler(nvml, interval_s=0.001, cuda_uuids=lambda: [_bare(UUIDS[0])],
                          close_timeout_s=0.05)
    caplog.set_level(logging.WARNING, logger="evenflow.server.observability.telemetry")
    sampler.start()
    worker = sampler._thread
    assert worker is not None
    try:
        async with asyncio.timeout(10):
            await stuck.wait()
        seen = asyncio.Event()
        loop.call_soon(seen.set)
        async with asyncio.timeout(10):
            await seen.wait()
        assert nvml.stuck  # the loop ran on while the NVML call was stuck
        async with asyncio.timeout(10):
            await sampler.close()
        assert nvml.stuck and nvml.shutdowns == 0  # close returned; no shutdown under a call
        assert any("has not returned" in r.getMessage() for r in caplog.records)
    finally:
        nvml.release.set()
        worker.thread.join(timeout=10)
    assert not worker.thread.is_alive()
    assert nvml.shutdowns == 1  # once the stuck call returned, on the sampler's thread


async def test_close_shuts_nvml_down_after_the_last_sample() -> None:
    nvml = FakeNvml()
    sampler = NvmlSampler(nvml, interval_s=0.001, cuda_uuids=lambda: [_bare(UUIDS[0])])
    sampler.start()
    worker = sampler._thread
    assert worker is not None
    await sampler.close()
    assert nvml.shutdowns == 1
    worker.thread.join(timeout=10)
    assert not worker.thread.is_alive()


class WatchedSampler(NvmlSampler):
    """Wakes ``changed`` at each new reading (``latest`` is set on the event loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.changed = asyncio.Event()
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def latest(self) -> list[GpuSample]:
        return self._latest

    @latest.setter
    def latest(self, samples: list[GpuSample]) -> None:
        self._latest = samples
        self.changed.set()

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def gpu_series(samples: list[GpuSample]) -> dict[str, float]:
    text = render(collect([], samples, {})).decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.labels.get("gpu") == "cuda0"}


async def test_a_reading_is_reported_stale_while_the_sample_after_it_is_stuck() -> None:
    loop = asyncio.get_running_loop()
    stuck = asyncio.Event()
    nvml = StuckNvml(stuck_at=2, on_stuck=lambda: loop.call_soon_threadsafe(stuck.set))
    sampler = WatchedSampler(nvml, interval_s=0.001, cuda_uuids=lambda: [_bare(UUIDS[0])],
                             close_timeout_s=0.05, stale_after_s=0.3)
    sampler.start()
    worker = sampler._thread
    assert worker is not None
    try:
        await sampler.until(lambda: bool(sampler.latest))  # the first sample, read
        (reading,) = sampler.latest
        assert not reading.stale and reading.temperature_c == 61
        assert gpu_series(sampler.latest)["evenflow_gpu_telemetry_stale"] == 0.0
        async with asyncio.timeout(10):  # the second, stuck
            await stuck.wait()
        await sampler.until(lambda: sampler.latest[0].stale)
        # Its values are left out, not exported as if current: a gap, and the flag says why.
        assert gpu_series(sampler.latest) == {"evenflow_gpu_telemetry_stale": 1.0}
        nvml.release.set()
        await sampler.until(lambda: not sampler.latest[0].stale)
        assert "nv_gpu_utilization" in gpu_series(sampler.latest)
    finally:
        nvml.release.set()
        await sampler.close()
        worker.thread.join(timeout=10)


async def test_gpus_stuck_on_their_first_sample_are_reported_stale_not_absent() -> None:
    nvml = StuckNvml()  # the very first sample sticks
    sampler = WatchedSampler(nvml, interval_s=0.001,
                             cuda_uuids=lambda: [_bare(u) for u in UUIDS[:2]],
                             close_timeout_s=0.05, stale_after_s=0.05)
    sampler.start()
    worker = sampler._thread
    assert worker is not None
    try:
        await sampler.until(lambda: bool(sampler.latest))
        assert [(s.name, s.stale) for s in sampler.latest] == [("cuda0", True), ("cuda1", True)]
        assert gpu_series(sampler.latest) == {"evenflow_gpu_telemetry_stale": 1.0}
    finally:
        nvml.release.set()
        await sampler.close()
        worker.thread.join(timeout=10)
