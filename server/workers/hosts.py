"""Where a model's workers run: threads of this process (``thread``) or one process per replica
(``process``). Either way the balancer drives them through the same ``Worker`` seam.

A replica is one device, or with ``pipeline.stages`` S > 1 a pipeline over S devices."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evenflow.balancer import BatchFailed, Worker, WorkerStatus
from evenflow.server.config.server_config import DTYPES, WORKER_HOSTS, PipelineConfig, ServerConfig
from evenflow.server.models.repository import BuiltinOptions, load_definition
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.pipeline.worker import PipelineWorker
from evenflow.server.workers.ray_resources import RayPlacement
from evenflow.server.workers.torch_worker import SimWorker, TorchWorker

# The names are stated once, in config (which must not import torch); each is a torch dtype.
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything needed to build one replica's worker, in this process or another (it travels
    to a worker process msgpack-encoded)."""

    model_name: str
    source: str
    devices: tuple[DeviceSpec, ...]
    builtins: BuiltinOptions
    pipeline: PipelineConfig
    dtype: str = "float32"
    cpu_threads: int = 1
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    log_level: str = "INFO"
    log_format: str = "text"

    @property
    def name(self) -> str:
        return f"{self.model_name}@{'+'.join(d.name for d in self.devices)}"


class HostedWorker:
    """What a worker run elsewhere (a worker process, a Ray actor) knows of itself without
    asking: its spec's name and devices, how many batches it takes at once, and the status its
    last answer carried; and how it restarts: ``_kill`` what runs (dead already, or hung past
    the watchdog), then ``start`` anew, which each host implements."""

    # A restart starts a new process, with a device context of its own: it recovers from a
    # sticky device error (DeviceLost) that a thread of the serving process could not.
    restart_renews_device = True

    def __init__(self, spec: WorkerSpec, max_in_flight: int) -> None:
        self._spec = spec
        self._name = spec.name
        self._devices = tuple(d.name for d in spec.devices)
        self._max_in_flight = max_in_flight
        self._status = WorkerStatus()
        self._closed = False

    async def start(self) -> None:
        raise NotImplementedError

    async def _kill(self) -> None:
        raise NotImplementedError

    def _close_once(self) -> bool:
        """Mark the worker closed; False when it already was (``close`` is idempotent)."""
        if self._closed:
            return False
        self._closed = True
        return True

    async def restart(self) -> None:
        if self._closed:
            raise BatchFailed(f"worker {self._name} is closed")
        await self._kill()
        await self.start()

    @property
    def name(self) -> str:
        return self._name

    @property
    def devices(self) -> Sequence[str]:
        return self._devices

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def status(self) -> WorkerStatus:
        return self._status


def device_groups(devices: list[DeviceSpec], stages: int) -> list[tuple[DeviceSpec, ...]]:
    """One group per replica: each device alone, or consecutive runs of ``stages`` devices."""
    if stages > 1 and len(devices) % stages:
        raise ValueError(f"{len(devices)} devices cannot form pipelines of {stages} stages")
    size = max(1, stages)
    return [tuple(devices[i:i + size]) for i in range(0, len(devices), size)]


def load_spec_definition(spec: WorkerSpec) -> ModelDefinition:
    """The model a spec names, with its tensor spec overridden where the configuration says."""
    definition = load_definition(spec.source, spec.builtins)
    if spec.inputs is not None or spec.outputs is not None:
        definition = dataclasses.replace(definition, inputs=spec.inputs or definition.inputs,
                                         outputs=spec.outputs or definition.outputs)
    return definition


def build_thread_worker(spec: WorkerSpec, definition: ModelDefinition) -> Worker:
    """The worker of one replica, running on threads of this process (blocking: it moves the
    module to its devices and traces it)."""
    dtype = TORCH_DTYPES[spec.dtype]
    devices = spec.devices
    if len(devices) > 1:
        return PipelineWorker(model_name=spec.model_name, definition=definition,
                              devices=devices, cpu_threads=spec.cpu_threads,
                              dtype=dtype if devices[0].kind == "cuda" else torch.float32,
                              partition=spec.pipeline.partition,
                              repartition=spec.pipeline.repartition)
    device = devices[0]
    if device.kind == "sim":
        return SimWorker(model_name=spec.model_name, definition=definition, device=device,
                         cpu_threads=spec.cpu_threads)
    return TorchWorker(model_name=spec.model_name, definition=definition, device=device,
                       dtype=dtype if device.kind == "cuda" else torch.float32,
                       cpu_threads=spec.cpu_threads)


async def build_workers(specs: list[WorkerSpec], definition: ModelDefinition,
                        host: str, ray_address: str = "local",
                        ray_placement: RayPlacement | None = None) -> list[Worker]:
    """Every replica's worker on ``host``; on failure, what was built is closed again.
    ``ray_placement``: with ``host="ray"``, how actors are placed (default: one replica per
    GPU, the default placement timeout)."""
    if host not in WORKER_HOSTS:
        raise ValueError(f"unknown worker host {host!r}: one of {WORKER_HOSTS}")
    workers: list[Worker] = []
    try:
        if host == "thread":
            for spec in specs:
                workers.append(await asyncio.to_thread(build_thread_worker, spec, definition))
        elif host == "process":
            from evenflow.server.workers.process_host import ProcessWorker

            processes = [ProcessWorker(spec) for spec in specs]
            workers.extend(processes)
            await asyncio.gather(*(p.start() for p in processes))
        else:
            try:
                from evenflow.server.workers import ray_host
            except ImportError as exc:
                raise ValueError("--workers ray needs Ray: pip install 'evenflow[ray]'") \
                    from exc
            await asyncio.to_thread(ray_host.connect, ray_address)
            placement = ray_placement or RayPlacement(ServerConfig().ray_placement_timeout_s)
            actors = [ray_host.RayWorker(spec, placement) for spec in specs]
            workers.extend(actors)
            await asyncio.gather(*(a.start() for a in actors))
    except BaseException:
        await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
        raise
    return workers
