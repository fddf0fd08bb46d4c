"""Device workers that run a torch module: ``cpu``, ``cuda`` and simulated (``sim``) devices."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from evenflow.balancer.errors import BatchFailed, OutOfMemory
from evenflow.balancer.job import BatchResult, BatchTiming, Job
from evenflow.server.models.sim import set_thread_speed
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.thread_worker import ThreadWorker
from evenflow.server.workers.tracing import trace_or_keep

_FLOAT_WIRE = {"FP32": torch.float32, "FP16": torch.float16, "FP64": torch.float64}


class TorchWorker(ThreadWorker):
    """Runs a module on one CPU or CUDA device.

    A batch's inputs are concatenated along the batch dimension, copied to the device (on CUDA,
    on the worker's own stream), run, copied back and split per job. Floating-point inputs are
    cast to ``dtype`` (``--dtype``) and outputs cast back to their wire datatype.
    """

    def __init__(self, *, model_name: str, definition: ModelDefinition, device: DeviceSpec,
                 dtype: torch.dtype = torch.float32, cpu_threads: int = 1) -> None:
        self._definition = definition
        self._cpu_threads = cpu_threads
        self._device = torch.device("cuda", device.index) if device.kind == "cuda" else \
            torch.device("cpu")
        self._dtype = dtype
        module = definition.module.to(self._device)
        if dtype != torch.float32:
            module = module.to(dtype)
        if definition.traceable:
            module = trace_or_keep(module, definition.inputs, name=model_name,
                                   device=self._device, float_dtype=dtype)
        self._module = module
        self._stream: Any = None
        super().__init__(name=f"{model_name}@{device.name}", devices=[device.name])

    @contextlib.contextmanager
    def _thread_main_context(self) -> Iterator[None]:
        # NOTE: OpenMP's thread count is per calling thread; set here, not on the main thread, or
        # this thread runs a default-sized team whose idle members spin on the loop's core.
        torch.set_num_threads(self._cpu_threads)
        with torch.inference_mode():
            if self._device.type == "cuda":
                torch.cuda.set_device(self._device)
                self._stream = torch.cuda.Stream(self._device)
                with torch.cuda.stream(self._stream):
                    yield
            else:
                yield

    def _sync(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def _execute(self, jobs: Sequence[Job]) -> BatchResult:
        t0 = time.perf_counter()
        inputs = [self._to_device(_concat([job.payload[i] for job in jobs]), spec.datatype)
                  for i, spec in enumerate(self._definition.inputs)]
        self._sync()
        t1 = time.perf_counter()
        try:
            raw_outputs = self._module(*inputs)
            self._sync()
        except torch.OutOfMemoryError as exc:
            raise OutOfMemory(f"out of memory on {self._device}: {exc}") from exc
        except Exception as exc:
            raise BatchFailed(f"model raised {type(exc).__name__}: {exc}") from exc
        t2 = time.perf_counter()
        outputs = [self._to_host(t, spec.datatype)
                   for t, spec in zip(self._order_outputs(raw_outputs), self._definition.outputs,
                                      strict=True)]
        per_job = _split(outputs, [job.num_samples for job in jobs])
        t3 = time.perf_counter()
        return BatchResult(per_job, BatchTiming(t1 - t0, t2 - t1, t3 - t2))

    def _to_device(self, array: np.ndarray, datatype: str) -> torch.Tensor:
        if datatype == "BF16":
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        tensor = tensor.to(self._device, non_blocking=True)
        if tensor.is_floating_point() and tensor.dtype != self._dtype:
            tensor = tensor.to(self._dtype)
        return tensor

    @staticmethod
    def _to_host(tensor: torch.Tensor, datatype: str) -> np.ndarray:
        if datatype == "BF16":
            return tensor.to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)
        wire_dtype = _FLOAT_WIRE.get(datatype)
        if wire_dtype is not None and tensor.dtype != wire_dtype:
            tensor = tensor.to(wire_dtype)
        return tensor.cpu().numpy()

    def _order_outputs(self, raw: Any) -> list[torch.Tensor]:
        specs = self._definition.outputs
        if isinstance(raw, torch.Tensor):
            raw = (raw,)
        elif isinstance(raw, dict):
            missing = [s.name for s in specs if s.name not in raw]
            if missing:
                raise BatchFailed(f"model output dict lacks {missing}")
            raw = [raw[s.name] for s in specs]
        if len(raw) != len(specs):
            raise BatchFailed(f"model returned {len(raw)} outputs; spec lists {len(specs)}")
        return list(raw)


class SimWorker(TorchWorker):
    """A simulated device: runs the module on the CPU, then sleeps until the batch has taken the
    model's ``sim_profile`` cost divided by this device's speed. The speed can change while
    serving (``set_speed``, the admin RPC) to reproduce a device that slows down."""

    def __init__(self, *, model_name: str, definition: ModelDefinition, device: DeviceSpec,
                 cpu_threads: int = 1) -> None:
        self.speed = device.speed
        super().__init__(model_name=model_name, definition=definition,
                         device=DeviceSpec("cpu", 0, device.name), cpu_threads=cpu_threads)

    def set_speed(self, speed: float) -> float:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        previous, self.speed = self.speed, speed
        return previous

    def _execute(self, jobs: Sequence[Job]) -> BatchResult:
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
                           BatchTiming(timing.copy_in_s, compute_s, timing.copy_out_s))


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    # Always a fresh, writable array: decoded inputs are read-only views of the request bytes.
    return np.concatenate(arrays) if len(arrays) > 1 else arrays[0].copy()


def _split(outputs: list[np.ndarray], sizes: list[int]) -> list[list[np.ndarray]]:
    if len(sizes) == 1:
        return [outputs]
    bounds = np.cumsum(sizes)[:-1]
    pieces = [np.split(array, bounds) for array in outputs]
    return [[piece[j] for piece in pieces] for j in range(len(sizes))]
