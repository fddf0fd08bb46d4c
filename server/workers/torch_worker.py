"""Device workers that run a torch module: ``cpu``, ``cuda`` and simulated (``sim``) devices."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from evenflow.balancer.errors import BatchFailed, EvenflowError, OutOfMemory
from evenflow.balancer.job import BatchResult, BatchTiming, Job, WorkerStatus
from evenflow.server.models.sim import set_thread_speed
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.observability import cpu_accounting
from evenflow.server.workers.activation_peak import (
    ActivationPeak,
    CudaAllocatorStats,
    measurement_lock,
)
from evenflow.server.workers.cuda_sync import blocking_event, wait_for_stream
from evenflow.server.workers.device_errors import classify_device_error
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.replica_module import module_for
from evenflow.server.workers.tensors import batch_inputs, outputs_per_job
from evenflow.server.workers.thread_worker import ThreadExit, ThreadWorker
from evenflow.server.workers.tracing import trace_or_keep

logger = logging.getLogger(__name__)


class TorchWorker(ThreadWorker):
    """Runs a module on one CPU or CUDA device.

    A batch's inputs are concatenated along the batch dimension, copied to the device (on CUDA,
    on the worker's own stream), run, copied back and split per job. Floating-point inputs are
    cast to ``dtype`` (``--dtype``) and outputs cast back to their wire datatype. The module is
    this replica's own unless sharing the definition's is safe (see ``replica_module``); waits
    for the GPU sleep on a blocking event. Running out of device memory anywhere in a batch
    raises ``OutOfMemory`` with the batch's tensors already freed, so the balancer's split
    halves can use that memory.
    """

    def __init__(self, *, model_name: str, definition: ModelDefinition, device: DeviceSpec,
                 dtype: torch.dtype = torch.float32, cpu_threads: int = 1) -> None:
        self._definition = definition
        self._cpu_threads = cpu_threads
        self._measure_cpu = cpu_accounting.enabled()
        self._device = torch.device("cuda", device.index) if device.kind == "cuda" else \
            torch.device("cpu")
        self._dtype = dtype
        module = module_for(definition, self._device, dtype)
        if definition.traceable:
            module = trace_or_keep(module, definition.inputs, name=model_name,
                                   device=self._device, float_dtype=dtype)
        self._module = module
        self._stream: Any = None
        self._stream_done: Any = None  # a blocking event, reused for every wait on the stream
        self._activation_peak = ActivationPeak(CudaAllocatorStats(device.index),
                                               measurement_lock(device.name)) \
            if device.kind == "cuda" else None
        super().__init__(name=f"{model_name}@{device.name}", devices=[device.name])

    def status(self) -> WorkerStatus:
        peak = self._activation_peak
        return WorkerStatus(activation_peak_bytes=peak.peak_bytes if peak is not None else None)

    @contextlib.contextmanager
    def _thread_main_context(self) -> Iterator[None]:
        # NOTE: OpenMP's thread count is per calling thread; set here, not on the main thread, or
        # this thread runs a default-sized team whose idle members spin on the loop's core.
        torch.set_num_threads(self._cpu_threads)
        with torch.inference_mode():
            if self._device.type == "cuda":
                torch.cuda.set_device(self._device)
                self._stream = torch.cuda.Stream(self._device)
                self._stream_done = blocking_event()
                with torch.cuda.stream(self._stream):
                    yield
            else:
                yield

    def _sync(self) -> None:
        if self._stream is not None:
            wait_for_stream(self._stream, self._stream_done)

    def _execute(self, jobs: Sequence[Job]) -> BatchResult:
        try:
            return self._run_batch(jobs)
        except EvenflowError:
            raise
        except Exception as exc:  # a sticky CUDA error may surface at any sync or copy
            # Out of memory counts however torch wrapped it: a traced model's arrives as the
            # TorchScript interpreter's RuntimeError, which must split the batch all the same.
            error = classify_device_error(exc, device=str(self._device))
            if not isinstance(error, OutOfMemory):
                logger.debug("%s: batch raised", self._name, exc_info=exc)
        # Raised here, outside the handler, and not chained: the exception's traceback holds
        # the batch's frames and so its device tensors (inputs, activations), and the balancer
        # holds our error while it retries the halves (or answers the requests), so a
        # __cause__ or __context__ would keep them allocated all that time. The message stays.
        if isinstance(error, OutOfMemory):
            self._release_memory()
        raise error

    def _run_batch(self, jobs: Sequence[Job]) -> BatchResult:
        """Copy in, compute, copy out; every device allocation of the batch happens here, so an
        out-of-memory anywhere in it splits the batch, and what else it raises is classified
        (see ``_execute``)."""
        clock = time.thread_time if self._measure_cpu else cpu_accounting.no_clock
        peak = self._activation_peak
        with peak.measure(sum(job.num_samples for job in jobs)) if peak is not None \
                else contextlib.nullcontext():
            c0, t0 = clock(), time.perf_counter()
            inputs = batch_inputs(jobs, self._definition.inputs, self._device, self._dtype)
            self._sync()
            c1, t1 = clock(), time.perf_counter()
            raw_outputs = self._module(*inputs)
            self._sync()
            c2, t2 = clock(), time.perf_counter()
            per_job = outputs_per_job(raw_outputs, self._definition.outputs, jobs)
            c3, t3 = clock(), time.perf_counter()
        return BatchResult(per_job, BatchTiming(t1 - t0, t2 - t1, t3 - t2),
                           BatchTiming(c1 - c0, c2 - c1, c3 - c2) if self._measure_cpu
                           else None)

    def _release_memory(self) -> None:
        """After an out-of-memory, once the batch's tensors are dropped: let the failed batch's
        queued kernels finish, then hand the cached blocks back where that touches only this
        replica's device (``release_cached_memory``), so the retried halves (and other
        processes on the device) find the memory whole rather than fragmented."""
        if self._stream is not None:
            self._sync()
            release_cached_memory(self._device)


def release_cached_memory(device: torch.device) -> bool:
    """``torch.cuda.empty_cache()``, unless this process caches memory on another GPU too;
    whether it ran.

    It has no per-device form (torch 2.11: it empties every device's caching allocator), and
    each ``cudaFree`` it makes synchronizes its device, so in the thread host, where replicas on
    other GPUs share this process, it would stall their batches and throw their caches away.
    Skipping it costs this replica little: before raising out of memory the allocator already
    frees its own device's unused cached blocks and retries, so the retried halves find them
    anyway; emptying serves other processes on the device, which is what a worker process (one
    replica, one device) still does.
    """
    others = (index for index in range(torch.cuda.device_count()) if index != device.index)
    if any(torch.cuda.memory_reserved(index) for index in others):
        return False
    torch.cuda.empty_cache()
    return True


_DEVICE_LOCKS: dict[str, threading.Lock] = {}
_DEVICE_LOCKS_GUARD = threading.Lock()


def _device_lock(device: str) -> threading.Lock:
    """The lock that makes a simulated device run one batch at a time, whichever model's
    worker runs it (a real device is shared the same way)."""
    with _DEVICE_LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(device, threading.Lock())


class SimWorker(TorchWorker):
    """A simulated device: runs the module on the CPU, then sleeps until the batch has taken the
    model's ``sim_profile`` cost divided by this device's speed. Models served on the same
    ``simN`` share it: their batches take turns. The speed can change while
    serving (``set_speed``, the admin RPC) to reproduce a device that slows down."""

    def __init__(self, *, model_name: str, definition: ModelDefinition, device: DeviceSpec,
                 cpu_threads: int = 1) -> None:
        self.speed = device.speed
        self._device_lock = _device_lock(device.name)
        self._fault = ""  # "", "raise", "hang" or "die" (fault injection, see set_device_fault)
        self._fault_count = 0
        self._unhang = threading.Event()
        super().__init__(model_name=model_name, definition=definition,
                         device=DeviceSpec("cpu", 0, device.name), cpu_threads=cpu_threads)

    def set_speed(self, speed: float) -> float:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        previous, self.speed = self.speed, speed
        return previous

    async def set_device_speed(self, device: str, speed: float) -> float:
        if device not in self.devices:
            raise KeyError(device)
        return self.set_speed(speed)

    async def set_device_fault(self, device: str, fault: str, count: int = 1) -> None:
        """Inject a fault into this simulated device's next batches (tests and drills):
        ``raise`` (the next ``count`` batches raise), ``hang`` (the next batch blocks until
        ``clear``), ``die`` (the worker's thread exits in its next batch), ``clear``."""
        if device not in self.devices:
            raise KeyError(device)
        if fault not in ("raise", "hang", "die", "clear"):
            raise ValueError(f"unknown fault {fault!r}: raise, hang, die or clear")
        self._unhang.set()  # a batch hung by an earlier fault may go on
        self._fault, self._fault_count = ("", 0) if fault == "clear" else (fault, max(1, count))
        if fault in ("hang",):
            self._unhang = threading.Event()

    def _inject(self) -> None:
        """Runs in the worker thread at the start of a batch."""
        if not self._fault_count:
            return
        fault = self._fault
        self._fault_count -= 1
        if fault == "raise":
            raise BatchFailed(f"injected fault on {self.devices[0]}: the model raised")
        if fault == "hang":
            self._unhang.wait()
        elif fault == "die":
            raise ThreadExit(f"injected fault on {self.devices[0]}: the worker died")

    def _execute(self, jobs: Sequence[Job]) -> BatchResult:
        self._inject()
        with self._device_lock:  # one batch at a time per device, across models
            return self._simulate(jobs)

    def _simulate(self, jobs: Sequence[Job]) -> BatchResult:
        start = time.perf_counter()
        speed = self.speed
        set_thread_speed(speed)
        result = super()._execute(jobs)
        target_s = self._definition.sim_profile.cost_s(sum(j.num_samples for j in jobs)) / speed
        remaining_s = target_s - (time.perf_counter() - start)
        if remaining_s > 0:
            time.sleep(remaining_s)
        timing = result.timing
        compute_s = timing.compute_s + max(0.0, remaining_s)
        return BatchResult(result.outputs,
                           BatchTiming(timing.copy_in_s, compute_s, timing.copy_out_s),
                           result.cpu)

