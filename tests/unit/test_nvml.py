"""The NVML sampler against a hand-written fake pynvml: GPUs named by CUDA ordinal through
their UUIDs (a permuted CUDA_VISIBLE_DEVICES, MIG instances), and a field a board does not
support leaving the rest of the sample in place, logged once."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from evenflow.server.observability.telemetry import NvmlSampler, cuda_ordinals, normalized_uuid

UUIDS = ("GPU-aaaaaaaa-0000-0000-0000-000000000000",
         "GPU-bbbbbbbb-1111-1111-1111-111111111111",
         "GPU-cccccccc-2222-2222-2222-222222222222")


class NotSupported(Exception):
    """What pynvml raises for a query the board does not answer (NVMLError_NotSupported)."""


@dataclass
class FakeNvml:
    """GPUs in PCI order, each handle its NVML index; ``unsupported`` holds (handle, query)
    pairs that raise; ``mig`` maps a GPU's index to its MIG slots' UUIDs (None: empty)."""

    uuids: tuple[str, ...] = UUIDS
    unsupported: set[tuple[object, str]] = field(default_factory=set)
    mig: dict[int, list[str | None]] = field(default_factory=dict)
    as_bytes: bool = False
    calls: int = 0

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def _query(self, handle: object, what: str) -> None:
        self.calls += 1
        if (handle, what) in self.unsupported:
            raise NotSupported("Not Supported")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
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

    def nvmlShutdown(self) -> None:
        pass


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
