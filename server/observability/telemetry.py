"""NVML sampler: per-GPU utilization, memory, SM clock, throttle reasons and temperature.

Absent cleanly: without nvidia-ml-py, without a driver, or when NVML fails while the sampler is
built, ``NvmlSampler.open()`` returns None (NVML shut down again) and the server reports no
device telemetry. A GPU whose handle or UUID NVML cannot give is left out, logged as the
sampler lists the GPUs.

GPUs are named as the server names its devices, by CUDA ordinal (``cuda0`` is torch's device
0), matched to NVML's devices by UUID: NVML counts every GPU in PCI order, CUDA only those in
``CUDA_VISIBLE_DEVICES`` in that variable's order (and by default fastest first). A GPU CUDA
does not see is not sampled; a MIG instance CUDA sees is sampled through its own NVML handle.
Each field is read on its own: one a board does not support (clocks, throttle reasons,
utilization on MIG) stays 0, is listed in ``GpuSample.unsupported`` (the metrics leave it out),
and is logged once; one whose query fails otherwise (a GPU lost, a timeout) is left out too,
and makes that GPU's sample ``stale`` while it fails.

NVML calls can block for a long time on a GPU in a bad state (an Xid, fallen off the bus), so
the sampler makes them on its own thread, one sample at a time, never on the event loop. A
sample that has not returned within ``stale_after_s`` marks every GPU's last reading ``stale``
(the GPUs are read one after another, so none is read again meanwhile; the metrics leave their
values out, the stats RPC and the devices page say so), logged once per stuck sample with the
GPU it is stuck on, until a sample returns. ``close()`` waits for a sample in progress only
``close_timeout_s``, then leaves its thread to finish it and shut NVML down after it (never
while a call is in progress).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from evenflow.server.edge.event_loop import cancel_and_wait

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


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
    # The last reading, kept while the sample after it is stuck in NVML (a GPU in a bad state):
    # what it says may no longer hold.
    stale: bool = False


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


def _unread(name: str) -> GpuSample:
    """A GPU not read yet, while the first sample is stuck: no field, stale."""
    values: dict[str, Any] = dict(_ZERO)
    return GpuSample(name=name, unsupported=frozenset(_ZERO), stale=True, **values)


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


def _skip(device: str, exc: Exception) -> None:
    # Devices are listed once per sampler and once per memory query: logged each time.
    logger.warning("NVML: leaving out %s, which NVML cannot open (%s: %s)",
                   device, type(exc).__name__, exc)


def _nvml_devices(nvml: Any) -> list[tuple[Any, str]]:
    """Every NVML handle with its UUID: the GPUs, and the MIG instances of those in MIG mode.
    A device whose handle or UUID NVML cannot give is left out, logged."""
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            devices.append((handle, nvml.nvmlDeviceGetUUID(handle)))
        except Exception as exc:  # a GPU in a bad state: the others are still sampled
            _skip(f"device {index}", exc)
            continue
        try:
            current_mode, _ = nvml.nvmlDeviceGetMigMode(handle)
        except Exception:  # not MIG-capable
            continue
        if not current_mode:
            continue
        try:
            slots = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except Exception as exc:
            _skip(f"device {index}'s MIG instances", exc)
            continue
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except Exception:  # an empty slot
                continue
            try:
                devices.append((mig, nvml.nvmlDeviceGetUUID(mig)))
            except Exception as exc:
                _skip(f"device {index}'s MIG instance {slot}", exc)
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


class _NvmlThread:
    """One daemon thread that makes NVML calls one at a time, in the order given. Daemon, and
    not an executor's: a call stuck in the driver must hold up neither ``close()`` nor the
    interpreter's exit (executors' threads are joined at exit)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = \
            queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, call: Callable[[], _T]) -> Future[_T]:
        future: Future[_T] = Future()
        self._calls.put((call, future))
        return future

    def stop(self) -> None:
        """End the thread once the calls already submitted have run."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as exc:  # handed to the caller, as an executor does
                future.set_exception(exc)
            else:
                future.set_result(result)


class NvmlSampler:
    """Samples every GPU every ``interval_s``, on a thread of its own (NVML can block).
    ``cuda_uuids``: the UUIDs of CUDA's devices by ordinal (torch's, unless a test's)."""

    def __init__(self, nvml: Any, interval_s: float = 0.25,
                 cuda_uuids: Callable[[], Sequence[str]] = torch_cuda_uuids,
                 close_timeout_s: float = 2.0, stale_after_s: float = 1.0) -> None:
        self._nvml = nvml
        self._interval_s = interval_s
        self._stale_after_s = stale_after_s
        self._close_timeout_s = close_timeout_s
        self._devices = self._named_handles(nvml, cuda_uuids)
        self._unread_logged: set[tuple[str, str, bool]] = set()
        self._reading = ""  # the GPU the sampler's thread is reading (or read last)
        self.latest: list[GpuSample] = []
        self._task: asyncio.Task[None] | None = None
        self._thread: _NvmlThread | None = None

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
            named = []
            for i in range(nvml.nvmlDeviceGetCount()):
                try:
                    named.append((f"cuda{i}", nvml.nvmlDeviceGetHandleByIndex(i)))
                except Exception as exc:  # a GPU in a bad state: the others are still sampled
                    _skip(f"device {i}", exc)
            return named
        if unseen:
            logger.info("NVML: not sampling %d device(s) CUDA does not show this process "
                        "(UUIDs %s)", len(unseen), ", ".join(unseen))
        return [(f"cuda{ordinal}", handles[ordinal]) for ordinal in sorted(handles)]

    @classmethod
    def open(cls, interval_s: float = 0.25,
             cuda_uuids: Callable[[], Sequence[str]] = torch_cuda_uuids
             ) -> NvmlSampler | None:
        """A sampler of the GPUs CUDA shows this process, or None, logged, where NVML cannot
        give one: nvidia-ml-py or a driver missing, NVML failing while the sampler is built
        (NVML shut down again), none of the GPUs left."""
        try:
            import pynvml as module  # nvidia-ml-py

            module.nvmlInit()
        except Exception as exc:  # no package, no driver, no GPU: all mean "no telemetry"
            logger.info("NVML not available (%s); no GPU telemetry", exc)
            return None
        try:
            sampler = cls(module, interval_s, cuda_uuids)
        except Exception as exc:  # after the models loaded: telemetry off, not a failed start
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if sampler.names:
                return sampler
            reason = "NVML can open none of this process's GPUs"
        logger.warning("NVML: no GPU telemetry (%s)", reason)
        with contextlib.suppress(Exception):
            module.nvmlShutdown()
        return None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._devices]

    def sample(self) -> list[GpuSample]:
        samples = []
        for name, handle in self._devices:
            self._reading = name  # for the log line, should this GPU's calls not return
            samples.append(self._sample(name, handle))
        return samples

    def _sample(self, name: str, handle: Any) -> GpuSample:
        values: dict[str, Any] = dict(_ZERO)
        unsupported: set[str] = set()
        failed = False  # a query that failed now (a GPU lost, a timeout), not unsupported
        for reader_name, reader in _READERS:
            try:
                values.update(reader(self._nvml, handle))
            except Exception as exc:  # NVMLError and its kin
                unsupported.update(_FIELDS[reader_name])
                supported = not self._not_supported(exc)
                failed = failed or supported
                if (name, reader_name, supported) not in self._unread_logged:
                    self._unread_logged.add((name, reader_name, supported))
                    logger.warning("NVML: %s cannot read %s (%s: %s); %s, logged once", name,
                                   reader_name, type(exc).__name__, exc,
                                   "its readings are reported stale while it fails" if supported
                                   else "left out of the metrics")
        return GpuSample(name=name, unsupported=frozenset(unsupported), stale=failed, **values)

    def _not_supported(self, exc: Exception) -> bool:
        """NVML's answer for a field this board never reads (NVML_ERROR_NOT_SUPPORTED: a MIG
        instance's utilization, some boards' clocks), as against a query that failed now."""
        code = getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", None)
        return code is not None and getattr(exc, "value", None) == code

    def start(self) -> None:
        if self._task is None:
            self._thread = _NvmlThread("nvml-sampler")
            self._task = asyncio.create_task(self._run(self._thread), name="nvml-sampler")

    async def _run(self, thread: _NvmlThread) -> None:
        while True:
            # One sample at a time: the next is asked only once this one has returned.
            sample = asyncio.wrap_future(thread.submit(self.sample))
            try:
                done, _ = await asyncio.wait({sample}, timeout=self._stale_after_s)
                if not done:
                    # The GPUs are read one after another: none is read again until it returns.
                    self.latest = [dataclasses.replace(s, stale=True) for s in self.latest] \
                        or [_unread(name) for name in self.names]
                    logger.warning("NVML: a sample has not returned in %.1f s, stuck on %s (a "
                                   "GPU in a bad state?); every GPU's last reading is reported "
                                   "stale until it does", self._stale_after_s, self._reading)
                self.latest = await sample
            except Exception:
                logger.exception("NVML sample failed")
            await asyncio.sleep(self._interval_s)

    async def close(self) -> None:
        """Stop sampling and shut NVML down. A sample stuck in NVML is waited for only
        ``close_timeout_s``: its thread is then left to finish it and shut NVML down after."""
        await cancel_and_wait(self._task)
        self._task = None
        thread, self._thread = self._thread, None
        if thread is None:
            self._shutdown()
            return
        shutdown = thread.submit(self._shutdown)  # after the sample in progress, never during
        thread.stop()
        loop = asyncio.get_running_loop()
        shut: asyncio.Future[None] = loop.create_future()

        def done() -> None:
            if not shut.done():  # not already given up on
                shut.set_result(None)

        def tell(_: Future[None]) -> None:  # on the sampler's thread, perhaps long after
            with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                loop.call_soon_threadsafe(done)

        shutdown.add_done_callback(tell)  # not wrap_future: a timeout must not cancel it
        try:
            await asyncio.wait_for(shut, self._close_timeout_s)
        except TimeoutError:
            logger.warning("NVML: a sample has not returned in %.1f s (a GPU in a bad state?); "
                           "leaving its thread, which shuts NVML down once it returns",
                           self._close_timeout_s)

    def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
