"""How much memory each device offers replicas under ``--placement auto``: the declared figure,
else for a GPU its free memory (where it can be known, else its total) less the reserve
``1 - GPU_USABLE`` of its total, the machine's RAM for a CPU, no limit for a sim device.

Where a GPU's free memory comes from depends on who holds the CUDA contexts:

- ``--workers thread``: this process runs the replicas, so it makes a CUDA context on each GPU
  anyway, and ``torch.cuda.mem_get_info`` asks for free.
- ``--workers process``: each worker process holds its own context, and one made here only to
  ask would keep a few hundred MiB of each GPU for good; NVML tells free and total without a
  context. Without NVML (no ``gpu`` extra, no driver) only the total is known, logged once per
  question.
- ``--workers ray``: a device's replicas run in Ray actors on whichever GPU, on whichever node,
  Ray gives the device's placement group, and Ray chooses that only when the device's first
  replica starts, after the placer was built from these figures; see ``cuda_memory_query``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from evenflow.balancer.placement.inventory import UNLIMITED_BYTES, DeviceInfo
from evenflow.server.config.server_config import ServerConfig
from evenflow.server.observability.telemetry import handles_by_cuda_ordinal, torch_cuda_uuids
from evenflow.server.workers.devices import DeviceSpec

logger = logging.getLogger(__name__)

# What a GPU's replicas may use of its total memory. The rest is kept back from its free memory
# too (another tenant's use leaves the need as it was), for what no replica's footprint counts:
# each process's CUDA context (a few hundred MiB per process and GPU, and worker processes each
# have their own), the caching allocator's fragmentation and the blocks it keeps cached between
# batches, and the library workspaces (cuBLAS, cuDNN) allocated outside the allocator's
# statistics.
GPU_USABLE = 0.9

# A GPU's (free, total) bytes, by CUDA ordinal.
CudaMemoryQuery = Callable[[int], tuple[int, int]]


class DeviceMemoryUnknown(ValueError):
    """A GPU's memory cannot be asked from this process and none is declared for it."""


def usable_bytes(free_bytes: int, total_bytes: int) -> int:
    """What a GPU offers replicas: its free memory less the reserve of ``1 - GPU_USABLE`` of
    its total (so at most ``GPU_USABLE`` of the total), never below 0."""
    reserve_bytes = total_bytes - int(total_bytes * GPU_USABLE)
    return max(0, min(free_bytes, total_bytes) - reserve_bytes)


def cuda_free_and_total(index: int) -> tuple[int, int]:
    """The GPU's free memory now, as the driver counts it (every process's allocations, this
    one's included), and its total. Asking creates this process's CUDA context on the GPU."""
    free, total = torch.cuda.mem_get_info(index)
    return int(free), int(total)


def cuda_total(index: int) -> tuple[int, int]:
    """The GPU's total memory, as free and total: asked without creating a CUDA context, so
    other processes' use of the GPU is not seen."""
    total = int(torch.cuda.get_device_properties(index).total_memory)
    return total, total


def open_nvml() -> Any:
    """pynvml, initialised; raises where it is not installed or finds no driver."""
    import pynvml  # nvidia-ml-py, the gpu extra

    pynvml.nvmlInit()
    return pynvml


def _free_unknown(reason: str) -> None:
    logger.warning("placement: free GPU memory is unknown (%s); each GPU offers replicas "
                   "%.0f%% of its total, memory other processes hold on it included; "
                   "[devices] memory (--device-memory) declares it", reason, GPU_USABLE * 100)


def nvml_free_and_total(nvml_open: Callable[[], Any] = open_nvml,
                        cuda_uuids: Callable[[], Sequence[str]] = torch_cuda_uuids
                        ) -> CudaMemoryQuery | None:
    """Each GPU's free and total memory as NVML counts them now (every process's allocations),
    by CUDA ordinal, without a CUDA context. NVML numbers GPUs its own way (every GPU, in PCI
    order), so they are matched to CUDA's ordinals by UUID as the telemetry matches them
    (``CUDA_VISIBLE_DEVICES`` and its order respected, a MIG instance through its own
    handle). None, logged, where NVML cannot tell: not installed, no driver, UUIDs not
    matched. A GPU NVML did not match falls back to ``cuda_total``, logged."""
    try:
        nvml = nvml_open()
    except Exception as exc:  # no package, no driver: both mean "no NVML"
        _free_unknown(f"NVML not available: {type(exc).__name__}: {exc}")
        return None
    try:
        handles, _ = handles_by_cuda_ordinal(nvml, list(cuda_uuids()))
        memory = {}
        for ordinal, handle in handles.items():
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            memory[ordinal] = (int(info.free), int(info.total))
    except Exception as exc:
        _free_unknown(f"NVML could not tell: {type(exc).__name__}: {exc}")
        return None
    finally:
        # One snapshot per question: nothing is held between placements (init is counted,
        # so the telemetry sampler's own session is left open).
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()

    def ask(index: int) -> tuple[int, int]:
        if index in memory:
            return memory[index]
        _free_unknown(f"NVML shows no GPU with cuda{index}'s UUID")
        return cuda_total(index)
    return ask


def smallest_gpu(query: CudaMemoryQuery, count: int) -> CudaMemoryQuery:
    """For every ordinal, the (free, total) of the GPU among this machine's ``count`` that
    offers the least: for a device that may land on any of them."""
    if count == 0:
        raise DeviceMemoryUnknown(
            "a cuda device's memory is unknown: this process sees no GPU, and its replicas "
            "run where Ray places them; [devices] memory (--device-memory) declares it")
    worst = min((query(i) for i in range(count)), key=lambda pair: usable_bytes(*pair))
    return lambda index: worst


def ray_head_total(index: int) -> tuple[int, int]:
    """``cuda_total`` of this process's GPU ``index``: a guess for a GPU Ray places anywhere."""
    if index >= torch.cuda.device_count():
        raise DeviceMemoryUnknown(
            f"cuda{index}'s memory is unknown: its replicas run where Ray places them, and this "
            f"process sees {torch.cuda.device_count()} GPU(s); [devices] memory "
            f"(--device-memory cuda{index}=...) declares it")
    return cuda_total(index)


def cuda_memory_query(config: ServerConfig,
                      nvml_query: Callable[[], CudaMemoryQuery | None] = nvml_free_and_total,
                      gpu_count: Callable[[], int] = torch.cuda.device_count
                      ) -> CudaMemoryQuery:
    """How a GPU's free and total memory are asked, by who runs the replicas:

    - thread workers: ``torch.cuda.mem_get_info``, in this process's own CUDA context, which
      its replicas use anyway.
    - process workers: NVML (no context made here only to ask), else the total.
    - Ray, ``--ray-address local``: the Ray instance is this machine, but which of its GPUs a
      device gets is Ray's choice when the device's first replica starts (its placement group,
      ``ray_host._GpuPins``), after the placer was built; so every device offers what the
      machine's least free GPU offers (NVML, else the totals).
    - Ray on a cluster: the GPU may be on another node, and no actor exists yet to ask (actors
      are per replica, built once the placer has chosen where they go), so the figure is this
      process's GPU of that ordinal's total, with a warning; ``DeviceMemoryUnknown`` where
      this process has no such GPU. Declared memory avoids both.

    The memory other processes hold when asked is left out, where it is seen."""
    if config.workers == "thread":
        return cuda_free_and_total
    if config.workers == "ray" and config.ray_address != "local":
        logger.warning("placement: with --workers ray on a cluster (--ray-address %s) a GPU's "
                       "memory is taken as the total of this process's GPU of the same ordinal, "
                       "less a tenth: Ray may place a device on any node's GPU, and memory other "
                       "processes hold there is not seen; [devices] memory (--device-memory) "
                       "declares it", config.ray_address)
        return ray_head_total
    query = nvml_query() or cuda_total
    return smallest_gpu(query, gpu_count()) if config.workers == "ray" else query


def kept_cuda_memory_query(config: ServerConfig) -> CudaMemoryQuery:
    """``cuda_memory_query(config)``, built when a GPU's memory is first asked and kept: a GPU
    that joins later (a cluster node) is asked the same way, and the way's caveat is logged
    once, not once per GPU that joins."""
    built: list[CudaMemoryQuery] = []

    def ask(index: int) -> tuple[int, int]:
        if not built:
            built.append(cuda_memory_query(config))
        return built[0](index)
    return ask


def device_memory_bytes(device: DeviceSpec, declared: Mapping[str, int],
                        cuda_memory: CudaMemoryQuery = cuda_total) -> int:
    """The memory replicas may use on ``device``: the declared figure; for a GPU, its free
    memory (where ``cuda_memory`` knows it, else its total) less a reserve for what no
    footprint counts (``usable_bytes``); the machine's RAM for a CPU; no limit for a sim
    device."""
    if device.name in declared:
        return declared[device.name]
    if device.kind == "cuda":
        return usable_bytes(*cuda_memory(device.index))
    if device.kind == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return UNLIMITED_BYTES


def device_infos(devices: Sequence[DeviceSpec], config: ServerConfig,
                 cuda_memory: CudaMemoryQuery | None = None) -> list[DeviceInfo]:
    """Each device's memory for the placer; ``cuda_memory`` (the server's kept one, or a
    test's) replaces a ``cuda_memory_query`` made for this question."""
    declared = config.device_memory_bytes
    if cuda_memory is None and any(d.kind == "cuda" and d.name not in declared
                                   for d in devices):
        # Asked only for a GPU without a declared figure: NVML's start, a CUDA context and
        # the warnings cost nothing where every GPU's memory is declared.
        cuda_memory = cuda_memory_query(config)
    return [DeviceInfo(d.name, device_memory_bytes(d, declared, cuda_memory or cuda_total))
            for d in devices]
