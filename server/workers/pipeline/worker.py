"""A pipeline replica: one model cut into stages on several devices, micro-batches in flight.

To the balancer it is one ``Worker`` that takes up to ``max_in_flight`` batches at once; its
batch time (what the latency model learns) is its slowest stage's time, which is what bounds its
throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import time
from collections.abc import Sequence
from typing import Any

import torch

from evenflow.balancer.errors import ShuttingDown, WorkerLost
from evenflow.balancer.job import BatchResult, BatchTiming, Job, WorkerStatus
from evenflow.balancer.partition import (
    StagePlan,
    even_split_per_device,
    plan_cost_per_device,
    plan_stages_per_device,
)
from evenflow.server.edge.event_loop import cancel_and_wait
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.device_errors import classify_device_error
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.pipeline.layers import (
    layer_costs_s,
    layer_memory_bytes,
    placed,
    split_into_layers,
)
from evenflow.server.workers.pipeline.stage import MicroBatch, Stage, in_stage_dtype
from evenflow.server.workers.tensors import batch_inputs, outputs_per_job
from evenflow.server.workers.tracing import example_inputs, trace_checked

logger = logging.getLogger(__name__)

_DRIFT_RATIO = 1.3  # stage times this far apart from the plan's proportions are drift
_MIN_BATCHES = 12  # between plans, before drift is judged
_MIN_GAIN = 0.9  # re-partition only if the new bottleneck is at most this fraction of today's


def _torch_device(device: DeviceSpec) -> torch.device:
    return torch.device("cuda", device.index) if device.kind == "cuda" else torch.device("cpu")


class PipelineWorker:
    """Stages on ``devices`` (stage i on device i), cut by the exact partitioner from each
    layer's cost on each device (``sim_profile`` of sim layers, else measured at
    ``profile_batch`` on that device, in that stage's dtype), within each device's free memory.

    Each stage runs its layers placed on its own device and dtype (``layers.placed``): the
    definition's module is never moved, so other replicas built from it keep theirs. ``dtype``
    is one for every stage, or one per stage (the thread host gives CUDA stages ``--dtype`` and
    CPU stages float32, as it does single-device replicas); each stage casts the floating
    activations it receives to its own dtype (``Stage``).

    Re-balancing: every batch reports each stage's time. When the stages' times drift from the
    plan's proportions (a device slowed down), the device speeds implied by the measurements
    feed a new plan; if it is clearly better, the worker stops taking batches, lets the ones in
    flight finish, places the layers that change device (from the definition's), and resumes.
    Queued requests wait in the replica's queue meanwhile, so none is lost or answered twice.
    """

    def __init__(self, *, model_name: str, definition: ModelDefinition,
                 devices: Sequence[DeviceSpec], cpu_threads: int = 1,
                 dtype: torch.dtype | Sequence[torch.dtype] = torch.float32,
                 partition: str = "optimal",
                 repartition: bool = True, profile_batch: int = 8) -> None:
        self._definition = definition
        self._devices = list(devices)
        self._torch_devices = [_torch_device(d) for d in devices]
        self._dtypes = [dtype] * len(devices) if isinstance(dtype, torch.dtype) else list(dtype)
        if len(self._dtypes) != len(devices):
            raise ValueError(f"{model_name}: {len(self._dtypes)} dtypes for {len(devices)} stages")
        self._partition = partition
        self._repartition_enabled = repartition and partition == "optimal"
        self._layers = split_into_layers(definition.module)  # the definition's: never moved
        if len(self._layers) < len(devices):
            raise ValueError(f"{model_name}: {len(self._layers)} layers cannot fill "
                             f"{len(devices)} stages")
        measured = layer_costs_s(definition, self._layers, self._torch_devices, self._dtypes,
                                 profile_batch)
        # A sim device is the CPU running slower (its sleeps scale by its speed); others: 1.
        self.stage_layer_costs_s = [[cost / d.speed for cost in row]
                                    for row, d in zip(measured, devices, strict=True)]
        # One size per layer, whichever stage holds it: counted in the dtype of the stages whose
        # memory is bounded (every CUDA stage gets the same one); a CPU stage's is unbounded.
        memory_dtype = next((dt for dt, device in zip(self._dtypes, self._torch_devices,
                                                      strict=True) if device.type == "cuda"),
                            self._dtypes[0])
        self._layer_memory = [layer_memory_bytes(layer, memory_dtype) for layer in self._layers]
        self._name = f"{model_name}@{'+'.join(d.name for d in devices)}"
        # Each device's speed relative to when it was profiled, re-estimated on drift.
        self._speeds = [1.0] * len(devices)
        self.plan = self._make_plan(self._speeds, held_bytes=[0] * len(devices))
        self._placements = self._place_layers(self.plan, [])
        self._max_in_flight = len(devices) + 1
        modules = self._stage_modules(self._placements)
        self._stages = [
            Stage(index=i, device=self._torch_devices[i], device_name=d.name, speed=d.speed,
                  module=modules[i], cpu_threads=cpu_threads, dtype=self._dtypes[i],
                  inbox_size=self._max_in_flight if i == 0 else 2)
            for i, d in enumerate(devices)]
        for stage, following in zip(self._stages, self._stages[1:], strict=False):
            stage.next = following
        self._open = asyncio.Event()
        self._open.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._in_flight = 0
        self._slots = asyncio.Semaphore(self._max_in_flight)  # stage 0's inbox never overflows
        self._closed = False
        self._stage_ratio = [1.0] * len(devices)
        self._measured_s = [0.0] * len(devices)
        self._batches_since_plan = 0
        self._repartition_task: asyncio.Task[None] | None = None
        self.num_repartitions = 0
        logger.info("%s: plan %s", self._name, self.plan.describe())

    @property
    def name(self) -> str:
        return self._name

    @property
    def devices(self) -> Sequence[str]:
        return [d.name for d in self._devices]

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def stage_modules(self) -> list[torch.nn.Module]:
        """The module each stage runs now (traced or eager), stage 0 first."""
        return [stage.module for stage in self._stages]

    def status(self) -> WorkerStatus:
        return WorkerStatus(tuple(self.stage_snapshot()), self.num_repartitions)

    def _capacity(self, held_bytes: Sequence[int]) -> list[float]:
        """Bytes each stage may hold: a device's free memory plus what the stage already holds
        there (its layers stay or make room when the pipeline is re-cut)."""
        capacity = []
        for device, held in zip(self._torch_devices, held_bytes, strict=True):
            if device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(device)
                capacity.append(float(free + held))
            else:
                capacity.append(math.inf)
        return capacity

    def _costs_at(self, speeds: Sequence[float]) -> list[list[float]]:
        return [[cost / speed for cost in row]
                for row, speed in zip(self.stage_layer_costs_s, speeds, strict=True)]

    def _make_plan(self, speeds: Sequence[float],
                   held_bytes: Sequence[int] | None = None) -> StagePlan:
        costs = self._costs_at(speeds)
        if self._partition == "even":
            return even_split_per_device(costs)
        held = self.plan.stage_memory_bytes if held_bytes is None else held_bytes
        return plan_stages_per_device(costs, layer_memory_bytes=self._layer_memory,
                                      device_memory_bytes=self._capacity(held))

    def _place_layers(self, plan: StagePlan, previous: Sequence[dict[int, torch.nn.Module]]
                      ) -> list[dict[int, torch.nn.Module]]:
        """Each stage's layers under ``plan``, by layer index, on the stage's device: a
        layer already placed on that device (by any stage of the previous plan) is kept, so a
        re-cut moves only the layers that change device; others are placed from the
        definition's. Each placement belongs to one stage of the plan."""
        placements: list[dict[int, torch.nn.Module]] = []
        for i, device in enumerate(self._torch_devices):
            here: dict[int, torch.nn.Module] = {}
            for j in plan.layers(i):
                kept = next((old[j] for k, old in enumerate(previous)
                             if j in old and self._torch_devices[k] == device), None)
                here[j] = kept if kept is not None else placed(self._layers[j], device,
                                                               self._dtypes[i])
            placements.append(here)
        return placements

    def _stage_modules(self, placements: Sequence[dict[int, torch.nn.Module]]
                       ) -> list[torch.nn.Module]:
        """One module per stage: its placed layers in order, traced where the trace is exact,
        each traced on the activations the stages before it give."""
        eager: list[torch.nn.Module] = [
            torch.nn.Sequential(*(layers[j] for j in sorted(layers))) for layers in placements]
        if not self._definition.traceable:
            return eager
        examples = [example_inputs(self._definition.inputs, batch, self._torch_devices[0],
                                   self._dtypes[0]) for batch in (2, 3)]
        if examples[0] is None or examples[1] is None:
            return eager
        traced_example: tuple[torch.Tensor, ...] = tuple(examples[0])
        check_example: tuple[torch.Tensor, ...] = tuple(examples[1])
        modules = []
        with torch.inference_mode(False), torch.no_grad():
            for i, (module, device, dtype) in enumerate(zip(eager, self._torch_devices,
                                                            self._dtypes, strict=True)):
                # What the stage receives: on its device, floats in its dtype (Stage._receive).
                traced_example = tuple(_received(t, device, dtype) for t in traced_example)
                check_example = tuple(_received(t, device, dtype) for t in check_example)
                modules.append(trace_checked(module, traced_example, check_example,
                                             name=f"{self._name}:{i}"))
                traced_example = _as_tuple(module(*traced_example))
                check_example = _as_tuple(module(*check_example))
        return modules

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        if self._closed:
            raise ShuttingDown(f"{self._name} is closed")
        await self._open.wait()  # closed while re-partitioning
        loop = asyncio.get_running_loop()
        # What the last stage delivers: per-job outputs, the stages' times, the copy-out time.
        future: asyncio.Future[tuple[list[Any], list[float], float]] = loop.create_future()
        specs = self._definition
        first, last = self._stages[0], self._stages[-1]
        prepared_s: list[float] = []

        def prepare() -> tuple[torch.Tensor, ...]:
            start = time.perf_counter()
            inputs = tuple(batch_inputs(jobs, specs.inputs, first.device, self._dtypes[0]))
            prepared_s.append(time.perf_counter() - start)
            return inputs

        def finish(batch: MicroBatch) -> None:  # on the last (or failing) stage's thread
            if batch.error is not None:
                outcome: Any = batch.error
            else:
                start = time.perf_counter()
                try:
                    per_job = outputs_per_job(batch.activations, specs.outputs, jobs)
                except Exception as exc:
                    # The copy out is where an asynchronous CUDA error (a device-side assert
                    # in the last stage's kernels) may surface: classified like a stage's.
                    outcome = classify_device_error(exc, device=last.device_name,
                                                    raiser=f"stage {last.index}")
                else:
                    outcome = (per_job, list(batch.stage_s), time.perf_counter() - start)
            with contextlib.suppress(RuntimeError):  # the loop closed while the batch ran
                loop.call_soon_threadsafe(_deliver, future, outcome)

        async with self._slots:
            self._in_flight += 1
            self._drained.clear()
            try:
                batch = MicroBatch(activations=(), finish=finish, prepare=prepare)
                try:
                    first.inbox.put_nowait(batch)
                except queue.Full:  # only after a cancelled run left its batch inside
                    await asyncio.to_thread(first.inbox.put, batch)
                per_job, stage_s, copy_out_s = await future
            finally:
                self._in_flight -= 1
                if not self._in_flight:
                    self._drained.set()
        copy_in_s = prepared_s[0] if prepared_s else 0.0
        stage_s[0] = max(0.0, stage_s[0] - copy_in_s)
        self._observe(stage_s)
        return BatchResult(per_job, BatchTiming(copy_in_s, max(stage_s), copy_out_s))

    def _observe(self, stage_s: list[float]) -> None:
        planned = self.plan.stage_costs_s
        ratios = [m / p if p > 0 else 1.0 for m, p in zip(stage_s, planned, strict=True)]
        mean = sum(ratios) / len(ratios)
        for i, ratio in enumerate(ratios):
            self._stage_ratio[i] = 0.8 * self._stage_ratio[i] + 0.2 * (ratio / mean)
            self._measured_s[i] = 0.8 * self._measured_s[i] + 0.2 * stage_s[i]
        self._batches_since_plan += 1
        if (self._repartition_enabled and self._repartition_task is None
                and self._batches_since_plan >= _MIN_BATCHES
                and max(self._stage_ratio) > _DRIFT_RATIO * min(self._stage_ratio)):
            speeds = [s / r for s, r in zip(self._speeds, self._stage_ratio, strict=True)]
            top = max(speeds)
            speeds = [s / top for s in speeds]
            candidate = self._make_plan(speeds)
            current = plan_cost_per_device(self.plan, self._costs_at(speeds))
            if candidate.bottleneck_s < _MIN_GAIN * current:
                self._repartition_task = asyncio.create_task(self._repartition(speeds,
                                                                               candidate))
            else:
                self._batches_since_plan = 0

    async def _repartition(self, speeds: list[float], plan: StagePlan) -> None:
        self._open.clear()
        try:
            await self._drained.wait()
            before = self.plan.describe()
            placements = await asyncio.to_thread(self._place_layers, plan, self._placements)
            modules = await asyncio.to_thread(self._stage_modules, placements)
            for stage, module in zip(self._stages, modules, strict=True):
                stage.module = module  # every stage is idle: nothing is in flight
            self.plan, self._speeds, self._placements = plan, speeds, placements
            self._stage_ratio = [1.0] * len(self._stages)
            self._batches_since_plan = 0
            self.num_repartitions += 1
            logger.warning("%s: stage times drifted (speeds relative to the profile now %s); "
                           "re-partitioned\n  before: %s"
                           "\n  after:  %s", self._name, [f"{s:.2f}" for s in speeds], before,
                           plan.describe())
        finally:
            self._repartition_task = None
            self._open.set()

    async def set_device_speed(self, device: str, speed: float) -> float:
        """Simulated devices only: change a stage's device speed while serving."""
        for stage, spec in zip(self._stages, self._devices, strict=True):
            if spec.name == device and spec.kind == "sim":
                previous, stage.speed = stage.speed, speed
                return previous
        raise KeyError(device)

    async def set_device_fault(self, device: str, fault: str, count: int) -> None:
        raise KeyError(device)  # faults are injected into single-device sim workers only

    def stage_snapshot(self) -> list[dict[str, Any]]:
        return [{"device": spec.name, "first_layer": self.plan.bounds[i],
                 "last_layer": self.plan.bounds[i + 1] - 1,
                 "planned_s": self.plan.stage_costs_s[i], "measured_s": self._measured_s[i],
                 "memory_bytes": self.plan.stage_memory_bytes[i]}
                for i, spec in enumerate(self._devices)]

    async def restart(self) -> None:
        """Not yet: a pipeline's stage threads and their hand-offs are rebuilt only by a
        re-partition; a lost pipeline replica stays out of routing (its retries are logged)."""
        raise WorkerLost(f"{self._name}: pipeline replicas cannot be restarted yet")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._repartition_task)
        self._stages[0].stop()  # the stop travels down the pipeline behind the work
        for stage in self._stages:
            await asyncio.to_thread(stage.join)


def _received(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return in_stage_dtype(tensor.to(device), dtype)


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _deliver(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
