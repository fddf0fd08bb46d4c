"""The ``ray`` worker host: each replica's worker is a Ray actor, on any node of a Ray cluster;
to the balancer it is a Worker like any other (its call overhead shows up in the latency it
measures). Needs the ``ray`` extra.

A batch crosses once each way, as one actor call: each input of the whole batch as one numpy
array (Ray's object store; zero-copy reads on the same node), each output of the whole batch
back, cut per request here. Errors come back as values (``ipc.errors``); an actor that dies
(its node lost, its process killed) fails the call with Ray's actor errors, which become
``WorkerLost``: the replica re-runs the batch elsewhere and ``restart`` places a new actor.
``cuda`` actors ask Ray for one GPU (Ray sets CUDA_VISIBLE_DEVICES, so the actor uses its
device 0); ``cpu`` and ``sim`` actors for one CPU each (``sim`` ones also for one ``evenflow_sim``
where the cluster offers that resource).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import ray
import ray.exceptions

from evenflow.balancer.errors import BatchFailed, WorkerLost
from evenflow.balancer.job import BatchResult, BatchTiming, Job, WorkerStatus
from evenflow.server.ipc import arrays
from evenflow.server.ipc.errors import WireError, from_wire, to_wire
from evenflow.server.workers.hosts import (
    HostedWorker,
    WorkerSpec,
    build_thread_worker,
    load_spec_definition,
)

logger = logging.getLogger(__name__)

SIM_RESOURCE = "evenflow_sim"  # a node's simulated devices (test clusters, drills)
_START_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 10.0
_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
         ray.exceptions.NodeDiedError, ray.exceptions.OwnerDiedError)

_started_here = [False]  # this process started a private Ray instance (``local``)


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto``, ``ray://...``, ``host:port``), or with
    ``local`` start a private instance on this machine, bound to 127.0.0.1 with no dashboard.
    Nothing happens when this process is already connected."""
    if ray.is_initialized():
        return
    if address == "local":
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=True, configure_logging=False)
        _started_here[0] = True
    else:
        ray.init(address=address, log_to_driver=True, configure_logging=False)


def disconnect() -> None:
    """Shut down the private instance ``connect("local")`` started (joined clusters stay)."""
    if _started_here[0] and ray.is_initialized():
        ray.shutdown()
        _started_here[0] = False


class ReplicaActor:
    """Runs in a Ray worker process: builds the replica's worker exactly as the thread host
    does and serves batches (async actor: controls run while a batch does)."""

    def __init__(self, spec_bytes: bytes) -> None:
        spec = msgspec.msgpack.decode(spec_bytes, type=WorkerSpec)
        if spec.devices[0].kind == "cuda":  # Ray exposes the one GPU it gave us as device 0
            spec = dataclasses.replace(spec, devices=tuple(
                dataclasses.replace(d, index=i) for i, d in enumerate(spec.devices)))
        self._worker = build_thread_worker(spec, load_spec_definition(spec))
        self._node = ray.get_runtime_context().get_node_id()

    def describe(self) -> tuple[str, list[dict[str, Any]], int]:
        status = self._worker.status()
        return self._node, [dict(s) for s in status.stages], status.num_repartitions

    async def run(self, sizes: list[int], inputs: list[np.ndarray]) -> tuple[Any, ...]:
        loop = asyncio.get_running_loop()
        job = Job(payload=inputs, num_samples=sum(sizes), arrival_s=0.0, deadline_s=math.inf,
                  future=loop.create_future())
        try:
            result = await self._worker.run([job])
        except Exception as exc:
            wire = to_wire(exc)
            return ("error", wire.kind, wire.message)
        timing, cpu = result.timing, result.cpu
        status = self._worker.status()
        return ("ok", list(result.outputs[0]),
                (timing.copy_in_s, timing.compute_s, timing.copy_out_s),
                (cpu.copy_in_s, cpu.compute_s, cpu.copy_out_s) if cpu is not None else None,
                [dict(s) for s in status.stages], status.num_repartitions)

    async def control(self, op: str, device: str, value: float, fault: str,
                      count: int) -> tuple[str, float, str]:
        try:
            if op == "speed":
                return ("ok", await self._worker.set_device_speed(device, value), "")
            await self._worker.set_device_fault(device, fault, count)
            return ("ok", 0.0, "")
        except Exception as exc:
            wire = to_wire(exc)
            return (wire.kind, 0.0, wire.message)

    async def close(self) -> None:
        await self._worker.close()


_actor_class: list[Any] = []


def _remote_class() -> Any:
    if not _actor_class:
        _actor_class.append(ray.remote(ReplicaActor))
    return _actor_class[0]


class RayWorker(HostedWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        # One batch more than the devices: the next one crosses (a call costs milliseconds)
        # while the current one runs; the actor runs them one after another. The price: a
        # request in that second batch is committed (no longer dropped at its deadline,
        # cancelled, stolen or bound late). Measured: 0.84 -> 1.01 of thread workers'
        # samples/s with 8-sample requests (benchmarks.ray_backend).
        super().__init__(spec, len(spec.devices) + 1)
        self._spec_bytes = msgspec.msgpack.encode(spec)
        self._actor: Any = None

    @property
    def actor(self) -> Any:
        """The Ray actor handle (None while none runs)."""
        return self._actor

    def _options(self) -> dict[str, Any]:
        devices = self._spec.devices
        gpus = sum(1 for d in devices if d.kind == "cuda")
        options: dict[str, Any] = {"num_gpus": gpus, "num_cpus": 0 if gpus else 1,
                                   "max_restarts": 0}
        sims = sum(1 for d in devices if d.kind == "sim")
        if sims and ray.cluster_resources().get(SIM_RESOURCE, 0) > 0:
            options["resources"] = {SIM_RESOURCE: sims}  # the cluster says where sims go
        return options

    async def start(self) -> None:
        """Place the actor and wait until its worker is built; raises what building raised."""
        actor = _remote_class().options(**self._options()).remote(self._spec_bytes)
        self._actor = actor
        try:
            node, stages, repartitions = await asyncio.wait_for(
                _await(actor.describe.remote()), _START_TIMEOUT_S)
        except BaseException:
            await self._kill()
            raise
        self._status = WorkerStatus(tuple(stages), repartitions, f"node {node[:12]}")
        logger.info("worker %s: Ray actor on node %s", self._name, node[:12])

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        if self._closed:
            raise BatchFailed(f"worker {self._name} is closed")
        actor = self._actor
        if actor is None:
            raise WorkerLost(f"worker {self._name}: no actor")
        sizes = [job.num_samples for job in jobs]
        inputs = arrays.join_jobs([job.payload for job in jobs])
        try:
            reply = await _await(actor.run.remote(sizes, inputs))
        except _LOST as exc:
            raise WorkerLost(f"worker {self._name}: its Ray actor is gone "
                             f"({type(exc).__name__})") from exc
        if reply[0] == "error":
            raise from_wire(WireError(reply[1], reply[2]))
        _, outputs, timing_s, cpu_s, stages, repartitions = reply
        self._status = WorkerStatus(tuple(stages), repartitions, self._status.location)
        return BatchResult(arrays.split_rows(outputs, sizes), BatchTiming(*timing_s),
                           BatchTiming(*cpu_s) if cpu_s is not None else None)

    async def _control(self, op: str, device: str, value: float = 0.0, fault: str = "",
                       count: int = 0) -> float:
        if device not in self._devices:
            raise KeyError(device)
        if self._actor is None:
            raise WorkerLost(f"worker {self._name}: no actor")
        try:
            kind, result, message = await _await(
                self._actor.control.remote(op, device, value, fault, count))
        except _LOST as exc:
            raise WorkerLost(f"worker {self._name}: its Ray actor is gone") from exc
        if kind != "ok":
            raise from_wire(WireError(kind, message))
        return float(result)

    async def set_device_speed(self, device: str, speed: float) -> float:
        return await self._control("speed", device, value=speed)

    async def set_device_fault(self, device: str, fault: str, count: int) -> None:
        await self._control("fault", device, fault=fault, count=count)

    async def close(self) -> None:
        if not self._close_once():
            return
        if self._actor is not None:
            with contextlib.suppress(*_LOST, TimeoutError):
                await asyncio.wait_for(_await(self._actor.close.remote()), _STOP_TIMEOUT_S)
        await self._kill()

    async def _kill(self) -> None:
        actor, self._actor = self._actor, None
        if actor is not None:
            with contextlib.suppress(*_LOST, ValueError):
                ray.kill(actor, no_restart=True)


async def _await(ref: Any) -> Any:
    """An ObjectRef awaited on this loop (uvloop included), through its concurrent future."""
    return await asyncio.wrap_future(ref.future())
