"""The ``ray`` worker host: each replica's worker is a Ray actor, on any node of a Ray cluster;
to the balancer it is a Worker like any other (its call overhead shows up in the latency it
measures). Needs the ``ray`` extra.

A batch crosses once each way, as one actor call carrying the worker process's messages
(``ipc.worker_messages``, encoded; the actor answers them through the same ``endpoint``): the
``RunBatch`` with each input of the whole batch beside it as one numpy array (Ray's object
store; zero-copy reads on the same node), the reply with each output of the whole batch, cut
per request here. Errors come back as values (``ipc.errors``); an actor that dies
(its node lost, its process killed) fails the call with Ray's actor errors, which become
``WorkerLost``: the replica re-runs the batch elsewhere and ``restart`` places a new actor.
What each actor asks for is ``ray_resources.actor_resources``: a share of one GPU for a
``cuda`` replica (every model's replica on that device shares it, inside the device's own
placement group), one CPU per ``cpu`` device, a small CPU share per ``sim`` one. An actor (or a
device's placement group) the cluster cannot place within ``RayPlacement.timeout_s`` fails
start-up with ``PlacementTimeout``, naming the replica, its request and the cluster's
resources; while it waits, that is logged every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from typing import Any

import msgspec
import numpy as np
import ray
import ray.exceptions
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from evenflow.balancer.errors import BatchFailed, WorkerLost
from evenflow.server.processes.ipc import worker_messages as msg
from evenflow.server.workers.endpoint import WorkerEndpoint
from evenflow.server.workers.hosted import BatchReply, HostedWorker, worker_status
from evenflow.server.workers.ray_resources import (
    SIM_RESOURCE,
    ActorResources,
    RayPlacement,
    actor_devices,
    actor_resources,
    placement_report,
)
from evenflow.server.workers.thread_host import build_thread_worker, load_spec_definition
from evenflow.server.workers.worker_spec import WorkerSpec

logger = logging.getLogger(__name__)

__all__ = ["SIM_RESOURCE", "PlacementTimeout", "RayPlacement", "RayWorker", "connect",
           "disconnect"]

_START_TIMEOUT_S = 300.0  # building the worker once placed: loading and tracing the model
_PLACEMENT_LOG_EVERY_S = 10.0
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
    _pins.forget()


class PlacementTimeout(RuntimeError):
    """The cluster did not place a replica's actor (or its device's placement group) in time."""


class _GpuPins:
    """One placement group per cuda device, a bundle of one GPU, shared by the replicas of every
    model on that device: Ray packs fractional GPU requests onto whichever GPU has room, so
    without it one model's ``cuda:0`` and ``cuda:1`` replicas could share a GPU while another
    GPU idles. Removed when the last replica on the device closes."""

    def __init__(self) -> None:
        self._groups: dict[str, Any] = {}
        self._users: dict[str, int] = {}

    def acquire(self, device: str) -> None:
        if device not in self._groups:
            self._groups[device] = placement_group([{"GPU": 1.0}], name=f"evenflow:{device}")
            self._users[device] = 0
        self._users[device] += 1

    def group(self, device: str) -> Any:
        return self._groups[device]

    def release(self, device: str) -> None:
        self._users[device] -= 1
        if not self._users[device]:
            del self._users[device]
            with contextlib.suppress(Exception):  # the cluster may be gone already
                remove_placement_group(self._groups.pop(device))

    def forget(self) -> None:
        """After a shutdown: the groups went with the Ray session."""
        self._groups.clear()
        self._users.clear()


_pins = _GpuPins()


class ReplicaActor:
    """Runs in a Ray worker process: builds the replica's worker exactly as the thread host
    does and answers through the same endpoint as a worker process (async actor: controls run
    while a batch does). Requests and replies are ``ipc.worker_messages`` structs, msgpack-
    encoded; a batch's arrays travel beside them through Ray's object store."""

    def __init__(self, spec_bytes: bytes) -> None:
        # Nothing slow here: the first call answering tells the server the actor was placed.
        self._spec = msgspec.msgpack.decode(spec_bytes, type=WorkerSpec)
        self._node = ray.get_runtime_context().get_node_id()
        self._endpoint: WorkerEndpoint | None = None

    def node(self) -> str:
        return self._node

    def build(self) -> bytes:
        """Build the worker; its ``Ready``, encoded."""
        spec = dataclasses.replace(self._spec, devices=actor_devices(self._spec.devices))
        self._endpoint = WorkerEndpoint(build_thread_worker(spec, load_spec_definition(spec)))
        return msg.encoder.encode(self._endpoint.ready())

    def _built(self) -> WorkerEndpoint:
        if self._endpoint is None:
            raise RuntimeError("the actor's worker is not built")
        return self._endpoint

    async def run(self, request: bytes, inputs: list[np.ndarray]
                  ) -> tuple[bytes, list[np.ndarray]]:
        """A ``RunBatch``'s encoded reply, and the batch's outputs."""
        batch = msgspec.msgpack.decode(request, type=msg.RunBatch)
        reply, outputs = await self._built().run_batch(batch, inputs)
        return msg.encoder.encode(reply), outputs

    async def control(self, request: bytes) -> bytes:
        """A ``Control``'s encoded ``ControlDone``."""
        control = msgspec.msgpack.decode(request, type=msg.Control)
        return msg.encoder.encode(await self._built().control(control))

    async def close(self) -> None:
        if self._endpoint is not None:
            await self._endpoint.close()


_actor_class: list[Any] = []


def _remote_class() -> Any:
    if not _actor_class:
        _actor_class.append(ray.remote(ReplicaActor))
    return _actor_class[0]


class RayWorker(HostedWorker):
    def __init__(self, spec: WorkerSpec, placement: RayPlacement) -> None:
        # One batch more than the devices: the next one crosses (a call costs milliseconds)
        # while the current one runs; the actor runs them one after another. The price: a
        # request in that second batch is committed (no longer dropped at its deadline,
        # cancelled, stolen or bound late). Measured: 0.84 -> 1.01 of thread workers'
        # samples/s with 8-sample requests (benchmarks.ray_backend).
        super().__init__(spec, len(spec.devices) + 1)
        self._spec_bytes = msgspec.msgpack.encode(spec)
        self._placement = placement
        self._actor: Any = None
        self._pinned: str | None = None  # the cuda device whose placement group we hold

    @property
    def actor(self) -> Any:
        """The Ray actor handle (None while none runs)."""
        return self._actor

    def resources(self) -> ActorResources:
        offered = ray.cluster_resources().get(SIM_RESOURCE, 0) > 0
        return actor_resources(self._spec.devices, offered)

    async def start(self) -> None:
        """Place the actor and wait until its worker is built; raises what building raised, or
        ``PlacementTimeout`` when the cluster does not place it in time."""
        wants = await asyncio.to_thread(self.resources)
        self._check_open()
        options: dict[str, Any] = {"num_cpus": wants.num_cpus, "num_gpus": wants.num_gpus,
                                   "max_restarts": 0}
        if wants.resources:
            options["resources"] = dict(wants.resources)
        what = ""
        if wants.pinned_gpu is not None:
            if self._pinned is None:  # held until close (a restart places into it again)
                _pins.acquire(wants.pinned_gpu)
                self._pinned = wants.pinned_gpu
            group = _pins.group(wants.pinned_gpu)
            await self._placed(group.ready(), {"GPU": 1.0},
                               f" (the placement group of {wants.pinned_gpu})")
            self._check_open()
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=0)
            what = f" (inside the placement group of {wants.pinned_gpu}: one GPU)"
        actor = _remote_class().options(**options).remote(self._spec_bytes)
        self._actor = actor
        try:
            node = await self._placed(actor.node.remote(), wants.asks(), what)
            ready = msgspec.msgpack.decode(await asyncio.wait_for(
                _await(actor.build.remote()), _START_TIMEOUT_S), type=msg.Ready)
        except BaseException:
            await self._kill()
            raise
        self._status = worker_status(ready.status, f"node {node[:12]}")
        logger.info("worker %s: Ray actor on node %s", self._name, node[:12])

    def _check_open(self) -> None:
        # Closed while start waited (a sibling replica failed): place nothing more, so that
        # nothing is left behind that close already missed.
        if self._closed:
            raise BatchFailed(f"worker {self._name} was closed while it started")

    async def _placed(self, ref: Any, asks: dict[str, float], what: str) -> Any:
        """``ref``'s value once the cluster placed what it waits for; logs what is missing
        every few seconds, and raises ``PlacementTimeout`` past the placement timeout."""
        loop = asyncio.get_running_loop()
        timeout_s = self._placement.timeout_s
        deadline_s = loop.time() + timeout_s
        every_s = min(_PLACEMENT_LOG_EVERY_S, max(timeout_s / 4, 0.5))
        placed = asyncio.ensure_future(_await(ref))
        try:
            while True:
                left_s = deadline_s - loop.time()
                if left_s > 0:
                    done, _ = await asyncio.wait({placed}, timeout=min(every_s, left_s))
                    if done:
                        return placed.result()
                report = await asyncio.to_thread(_report, self._name, asks)
                if loop.time() >= deadline_s:
                    raise PlacementTimeout(f"not placed within {timeout_s:g} s "
                                           f"(--ray-placement-timeout-s): {report}{what}")
                logger.warning("waiting for Ray to place it (%.0f s left): %s%s",
                               deadline_s - loop.time(), report, what)
        finally:
            placed.cancel()

    def _running_actor(self) -> Any:
        if self._actor is None:
            raise WorkerLost(f"worker {self._name}: no actor")
        return self._actor

    async def _exchange(self, sizes: list[int], inputs: list[np.ndarray]
                        ) -> tuple[BatchReply, list[np.ndarray]]:
        request = msg.encoder.encode(msg.RunBatch(id=0, sizes=sizes, arrays=[]))
        try:
            reply, outputs = await _await(self._running_actor().run.remote(request, inputs))
        except _LOST as exc:
            raise WorkerLost(f"worker {self._name}: its Ray actor is gone "
                             f"({type(exc).__name__})") from exc
        return msgspec.msgpack.decode(reply, type=BatchReply), outputs

    async def _send_control(self, request: msg.Control) -> msg.ControlDone:
        try:
            done = await _await(self._running_actor().control.remote(
                msg.encoder.encode(request)))
        except _LOST as exc:
            raise WorkerLost(f"worker {self._name}: its Ray actor is gone") from exc
        return msgspec.msgpack.decode(done, type=msg.ControlDone)

    async def close(self) -> None:
        if not self._close_once():
            return
        if self._actor is not None:
            with contextlib.suppress(*_LOST, TimeoutError):
                await asyncio.wait_for(_await(self._actor.close.remote()), _STOP_TIMEOUT_S)
        await self._kill()
        if self._pinned is not None:
            _pins.release(self._pinned)
            self._pinned = None

    async def _kill(self) -> None:
        actor, self._actor = self._actor, None
        if actor is not None:
            with contextlib.suppress(*_LOST, ValueError):
                ray.kill(actor, no_restart=True)


def _report(replica: str, asks: dict[str, float]) -> str:
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    return placement_report(replica, asks, ray.cluster_resources(), ray.available_resources(),
                            nodes)


async def _await(ref: Any) -> Any:
    """An ObjectRef awaited on this loop (uvloop included), through its concurrent future."""
    return await asyncio.wrap_future(ref.future())
