"""NVML sampler: per-GPU utilization, memory, SM clock, throttle reasons and temperature.

Absent cleanly: without nvidia-ml-py or without a driver, ``NvmlSampler.open()`` returns None and
the server reports no device telemetry.

GPUs are named as the server names its devices, by CUDA ordinal (``cuda0`` is torch's device
0), matched to NVML's devices by UUID: NVML counts every GPU in PCI order, CUDA only those in
``CUDA_VISIBLE_DEVICES`` in that variable's order (and by default fastest first). A GPU CUDA
does not see is not sampled; a MIG instance CUDA sees is sampled through its own NVML handle.
Each field is read on its own: one a board does not support (clocks, throttle reasons,
utilization on MIG) stays 0, is listed in ``GpuSample.unsupported``, and is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evenflow.server.edge.event_loop import cancel_and_wait

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
    unsupported: frozenset[str] = frozenset()  # fields NVML did not report (left 0)


# Each reader fills some of GpuSample's fields from one NVML query.
_Reader = Callable[[Any, Any], dict[str, float]]
_READERS: tuple[tuple[str, _Reader], ...] = (
    ("utilization", lambda nvml, h: {
        "utilization": nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0}),
    ("memory", lambda nvml, h: _memory(nvml.nvmlDeviceGetMemoryInfo(h))),
    ("sm_clock", lambda nvml, h: {
        "sm_clock_mhz": int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))}),
    ("throttle_reasons", lambda nvml, h: {
        "throttle_reasons": int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))}),
    ("temperature", lambda nvml, h: {
        "temperature_c": int(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))}),
)
_FIELDS = {"utilization": ("utilization",),
           "memory": ("memory_used_bytes", "memory_total_bytes"),
           "sm_clock": ("sm_clock_mhz",), "throttle_reasons": ("throttle_reasons",),
           "temperature": ("temperature_c",)}
_ZERO = {"utilization": 0.0, "memory_used_bytes": 0, "memory_total_bytes": 0,
         "sm_clock_mhz": 0, "throttle_reasons": 0, "temperature_c": 0}


def _memory(info: Any) -> dict[str, float]:
    return {"memory_used_bytes": int(info.used), "memory_total_bytes": int(info.total)}


def normalized_uuid(uuid: str | bytes) -> str:
    """A UUID as NVML (``GPU-…`` / ``MIG-…``, str or bytes) or torch (bare) writes it, in one
    form: lower case, without the prefix."""
    text = uuid.decode("ascii", "replace") if isinstance(uuid, bytes) else str(uuid)
    text = text.strip("\0 ").lower()
    for prefix in ("gpu-", "mig-"):
        text = text.removeprefix(prefix)
    return text


def cuda_ordinals(nvml_uuids: Sequence[str | bytes],
                  cuda_uuids: Sequence[str | bytes]) -> list[int | None]:
    """For each NVML device, the CUDA ordinal with the same UUID (None: CUDA does not see it)."""
    ordinal = {normalized_uuid(u): i for i, u in enumerate(cuda_uuids)}
    return [ordinal.get(normalized_uuid(u)) for u in nvml_uuids]


def torch_cuda_uuids() -> list[str]:
    """The UUID of each device CUDA shows this process, by ordinal (none without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [str(torch.cuda.get_device_properties(i).uuid)
            for i in range(torch.cuda.device_count())]


def _nvml_devices(nvml: Any) -> list[tuple[Any, str]]:
    """Every NVML handle with its UUID: the GPUs, and the MIG instances of those in MIG mode."""
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        devices.append((handle, nvml.nvmlDeviceGetUUID(handle)))
        try:
            current_mode, _ = nvml.nvmlDeviceGetMigMode(handle)
        except Exception:  # not MIG-capable
            continue
        if not current_mode:
            continue
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except Exception:  # an empty slot
                continue
            devices.append((mig, nvml.nvmlDeviceGetUUID(mig)))
    return devices


def handles_by_cuda_ordinal(nvml: Any, cuda_uuids: Sequence[str | bytes]
                            ) -> tuple[dict[int, Any], list[str]]:
    """NVML's handle for each device CUDA shows this process, by CUDA ordinal, matched by UUID
    (a MIG instance through its own handle); and the UUIDs (normalized) of NVML's devices CUDA
    does not show. Also what ``engine.device_memory`` asks a GPU's free memory through."""
    devices = _nvml_devices(nvml)
    ordinals = cuda_ordinals([uuid for _, uuid in devices], cuda_uuids)
    handles = {ordinal: handle for (handle, _), ordinal in zip(devices, ordinals, strict=True)
               if ordinal is not None}
    unseen = [normalized_uuid(uuid) for (_, uuid), ordinal in zip(devices, ordinals, strict=True)
              if ordinal is None]
    return handles, unseen


class NvmlSampler:
    """Samples every GPU every ``interval_s`` on the event loop (an NVML query costs ~2 us).
    ``cuda_uuids``: the UUIDs of CUDA's devices by ordinal (torch's, unless a test's)."""

    def __init__(self, nvml: Any, interval_s: float = 0.25,
                 cuda_uuids: Callable[[], Sequence[str]] = torch_cuda_uuids) -> None:
        self._nvml = nvml
        self._interval_s = interval_s
        self._devices = self._named_handles(nvml, cuda_uuids)
        self._unsupported_logged: set[tuple[str, str]] = set()
        self.latest: list[GpuSample] = []
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def _named_handles(nvml: Any, cuda_uuids: Callable[[], Sequence[str]]
                       ) -> list[tuple[str, Any]]:
        try:
            cuda = list(cuda_uuids())
            handles, unseen = handles_by_cuda_ordinal(nvml, cuda) if cuda else ({}, [])
        except Exception as exc:  # no UUIDs to match: NVML's own order is all there is
            logger.info("NVML: cannot match GPUs to CUDA ordinals by UUID (%s); named by NVML "
                        "index", exc)
            cuda = []
        if not cuda:
            count = nvml.nvmlDeviceGetCount()
            return [(f"cuda{i}", nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        if unseen:
            logger.info("NVML: not sampling %d device(s) CUDA does not show this process "
                        "(UUIDs %s)", len(unseen), ", ".join(unseen))
        return [(f"cuda{ordinal}", handles[ordinal]) for ordinal in sorted(handles)]

    @classmethod
    def open(cls, interval_s: float = 0.25) -> NvmlSampler | None:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
        except Exception as exc:  # no package, no driver, no GPU: all mean "no telemetry"
            logger.info("NVML not available (%s); no GPU telemetry", exc)
            return None
        return cls(pynvml, interval_s)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._devices]

    def sample(self) -> list[GpuSample]:
        return [self._sample(name, handle) for name, handle in self._devices]

    def _sample(self, name: str, handle: Any) -> GpuSample:
        values: dict[str, Any] = dict(_ZERO)
        unsupported: set[str] = set()
        for reader_name, reader in _READERS:
            try:
                values.update(reader(self._nvml, handle))
            except Exception as exc:  # NVMLError_NotSupported and its kin
                unsupported.update(_FIELDS[reader_name])
                if (name, reader_name) not in self._unsupported_logged:
                    self._unsupported_logged.add((name, reader_name))
                    logger.warning("NVML: %s cannot read %s (%s: %s); reported as 0, logged "
                                   "once", name, reader_name, type(exc).__name__, exc)
        return GpuSample(name=name, unsupported=frozenset(unsupported), **values)

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
        await cancel_and_wait(self._task)
        self._task = None
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
