"""The memory each device offers replicas (``engine.device_memory``), with hand-written fakes for
NVML and the CUDA queries (no GPU): free memory against the usable tenth, NVML's GPUs matched to
CUDA's ordinals under a permuted CUDA_VISIBLE_DEVICES, the fall-back to the total without NVML,
declared memory asking nothing, and what Ray workers are given."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from evenflow.balancer.placement.inventory import UNLIMITED_BYTES
from evenflow.server.config.server_config import ServerConfig
from evenflow.server.engine import device_memory
from evenflow.server.engine.device_memory import (
    DeviceMemoryUnknown,
    cuda_free_and_total,
    cuda_memory_query,
    cuda_total,
    device_infos,
    device_memory_bytes,
    nvml_free_and_total,
    ray_head_total,
    smallest_gpu,
)
from evenflow.server.workers.devices import DeviceSpec, parse_devices

GIB = 2**30
LOGGER = "evenflow.server.engine.device_memory"
# NVML's GPUs in PCI order: UUID, free GiB, total GiB.
GPUS = (("GPU-aaaaaaaa-0000", 80, 80), ("GPU-bbbbbbbb-1111", 10, 80), ("GPU-cccccccc-2222", 40, 48))


def bare(uuid: str) -> str:
    """As torch writes a device's UUID: no ``GPU-`` prefix."""
    return uuid.removeprefix("GPU-")


@dataclass
class FakeNvml:
    """pynvml's calls the memory question makes; each handle is the GPU's NVML index.
    ``broken``: nvmlDeviceGetMemoryInfo raises."""

    gpus: tuple[tuple[str, int, int], ...] = GPUS
    broken: bool = False
    shut_down: int = 0
    asked: list[int] = field(default_factory=list)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle][0]

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        raise RuntimeError("not MIG-capable")  # as NVMLError_NotSupported

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        if self.broken:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        self.asked.append(handle)
        _, free_gib, total_gib = self.gpus[handle]
        return SimpleNamespace(free=free_gib * GIB, total=total_gib * GIB,
                               used=(total_gib - free_gib) * GIB)

    def nvmlShutdown(self) -> None:
        self.shut_down += 1


def nvml_query(nvml: FakeNvml, cuda_uuids: list[str]
               ) -> Callable[[], device_memory.CudaMemoryQuery | None]:
    return lambda: nvml_free_and_total(lambda: nvml, lambda: cuda_uuids)


def no_nvml() -> Any:
    raise ModuleNotFoundError("No module named 'pynvml'")


def fixed(pairs: dict[int, tuple[int, int]]) -> device_memory.CudaMemoryQuery:
    return lambda index: pairs[index]


def unknown_free(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and "free GPU memory is unknown" in r.getMessage()]


def tenth_kept(free: float, total: float) -> int:
    """``free`` GiB less a tenth of ``total`` GiB, in bytes, as the server rounds it."""
    return int(free * GIB) - (int(total * GIB) - int(total * GIB * 0.9))


def test_a_gpu_offers_its_free_memory_less_a_tenth_of_its_total() -> None:
    gpu = DeviceSpec("cuda", 1, "cuda1")
    asked: list[int] = []

    def query(free: int, total: int) -> device_memory.CudaMemoryQuery:
        def ask(index: int) -> tuple[int, int]:
            asked.append(index)
            return free, total
        return ask

    assert device_memory_bytes(gpu, {}, query(80 * GIB, 80 * GIB)) == int(72 * GIB)
    # Another process holds 30 GiB of it: what no footprint counts still needs its tenth.
    assert device_memory_bytes(gpu, {}, query(50 * GIB, 80 * GIB)) == tenth_kept(50, 80)
    # Another process holds nearly all of it: nothing, never less.
    assert device_memory_bytes(gpu, {}, query(5 * GIB, 80 * GIB)) == 0
    assert asked == [1, 1, 1]


def test_declared_memory_wins_and_asks_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_: object) -> Any:
        raise AssertionError("asked a GPU whose memory is declared")

    gpu = DeviceSpec("cuda", 1, "cuda1")
    assert device_memory_bytes(gpu, {"cuda1": 7 * GIB}, never) == 7 * GIB
    # Every GPU declared: no NVML session, no CUDA context, no warning.
    monkeypatch.setattr(device_memory, "cuda_memory_query", never)
    config = ServerConfig(workers="process", device_memory_bytes={"cuda0": 5 * GIB,
                                                                  "cuda1": 6 * GIB})
    infos = device_infos(parse_devices("cuda:0,cuda:1,sim:1"), config)
    assert [(i.name, i.memory_bytes) for i in infos] == \
        [("cuda0", 5 * GIB), ("cuda1", 6 * GIB), ("sim0", UNLIMITED_BYTES)]


def test_nvml_matches_gpus_to_cuda_ordinals_under_a_permuted_visible_devices() -> None:
    """CUDA_VISIBLE_DEVICES=2,0: CUDA's device 0 is NVML's (PCI) device 2, its device 1 is
    NVML's 0; NVML's 1 is not this process's GPU and is not asked."""
    nvml = FakeNvml()
    query = nvml_query(nvml, [bare(GPUS[2][0]), bare(GPUS[0][0])])()
    assert query is not None
    assert query(0) == (40 * GIB, 48 * GIB)
    assert query(1) == (80 * GIB, 80 * GIB)
    assert sorted(nvml.asked) == [0, 2]  # one snapshot, taken when the query was made
    assert nvml.shut_down == 1  # nothing held open between placements


def test_process_workers_offer_the_free_memory_nvml_sees() -> None:
    nvml = FakeNvml()
    config = ServerConfig(workers="process")
    query = cuda_memory_query(config, nvml_query(nvml, [bare(u) for u, _, _ in GPUS]))
    infos = device_infos(parse_devices("cuda:0,cuda:1,cuda:2"), config, query)
    # Free memory less a tenth of the total, whether or not another process holds some.
    assert [i.memory_bytes for i in infos] == [int(72 * GIB), tenth_kept(10, 80),
                                               tenth_kept(40, 48)]


def test_without_nvml_a_gpu_offers_its_total_less_a_tenth_logged_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the gpu extra not installed
    assert cuda_memory_query(ServerConfig(workers="process")) is cuda_total
    (line,) = unknown_free(caplog)
    assert "NVML not available" in line and "--device-memory" in line


def test_a_failing_nvml_falls_back_to_the_total_and_shuts_down(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    nvml = FakeNvml(broken=True)
    config = ServerConfig(workers="process")
    assert cuda_memory_query(config, nvml_query(nvml, [bare(GPUS[0][0])])) is cuda_total
    assert nvml.shut_down == 1
    (line,) = unknown_free(caplog)
    assert "NVML could not tell" in line and "GPU_IS_LOST" in line


def test_a_gpu_nvml_does_not_match_offers_its_total(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setattr(device_memory, "cuda_total", lambda index: (24 * GIB, 24 * GIB))
    query = nvml_query(FakeNvml(), [bare(GPUS[1][0]), "dddddddd-3333"])()
    assert query is not None
    assert query(0) == (10 * GIB, 80 * GIB)
    assert query(1) == (24 * GIB, 24 * GIB)
    (line,) = unknown_free(caplog)
    assert "cuda1" in line


def test_thread_workers_ask_cuda_in_their_own_context() -> None:
    # Thread workers share this process's CUDA context, so asking torch for the free memory
    # costs nothing, and counts the context the replicas will use.
    assert cuda_memory_query(ServerConfig(workers="thread"), no_nvml) is cuda_free_and_total


def test_local_ray_gives_every_gpu_what_the_least_free_offers() -> None:
    """Ray picks a device's GPU when its first replica starts: cuda0 may land on the GPU that
    another process fills, so no device is promised more than the worst GPU offers."""
    nvml = FakeNvml()
    config = ServerConfig(workers="ray", ray_address="local")
    query = cuda_memory_query(config, nvml_query(nvml, [bare(u) for u, _, _ in GPUS]),
                              gpu_count=lambda: 3)
    assert [query(i) for i in range(3)] == [(10 * GIB, 80 * GIB)] * 3
    # Without NVML, the smallest total.
    totals = fixed({0: (80 * GIB, 80 * GIB), 1: (48 * GIB, 48 * GIB)})
    assert smallest_gpu(totals, 2)(0) == (48 * GIB, 48 * GIB)
    with pytest.raises(DeviceMemoryUnknown, match="sees no GPU"):
        smallest_gpu(totals, 0)


def test_ray_on_a_cluster_takes_this_process_totals_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    config = ServerConfig(workers="ray", ray_address="auto")
    assert cuda_memory_query(config, no_nvml) is ray_head_total
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "--ray-address auto" in line and "--device-memory" in line
    # This process sees no GPU: the head of a cluster of GPU nodes.
    monkeypatch.setattr(device_memory.torch.cuda, "device_count", lambda: 0)
    with pytest.raises(DeviceMemoryUnknown, match=r"cuda0's memory is unknown"):
        ray_head_total(0)


def test_gpus_joining_a_cluster_one_by_one_are_asked_the_same_way_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setattr(device_memory.torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(device_memory, "cuda_total", lambda index: (80 * GIB, 80 * GIB))
    config = ServerConfig(workers="ray", ray_address="auto")
    query = device_memory.kept_cuda_memory_query(config)
    assert caplog.records == []  # nothing asked yet
    infos = [info for device in parse_devices("cuda:0,cuda:1,cuda:2")
             for info in device_infos([device], config, query)]
    assert [i.memory_bytes for i in infos] == [72 * GIB] * 3
    assert len([r for r in caplog.records if r.name == LOGGER]) == 1
