"""evenflow's own services: balancer statistics, and the admin service for simulated devices."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from evenflow.balancer import DeviceNotFound, InvalidRequest, ModelNotFound, ReplicaSnapshot
from evenflow.balancer.placement.report import PlacementSnapshot
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc
from evenflow.server.edge.status import answers_errors
from evenflow.server.engine.served import ModelTable
from evenflow.server.observability.telemetry import GpuSample


def _replica(snapshot: ReplicaSnapshot) -> ef.ReplicaStats:
    return ef.ReplicaStats(
        name=snapshot.name, devices=snapshot.devices, busy_fraction=snapshot.busy_fraction,
        busy_s=snapshot.busy_s, queued_requests=snapshot.queued_requests,
        queued_samples=snapshot.queued_samples, outstanding_work_s=snapshot.outstanding_work_s,
        batch_size=snapshot.batch_size, fit_base_s=snapshot.fit_base_s,
        fit_per_sample_s=snapshot.fit_per_sample_s, fit_reliable=snapshot.fit_reliable,
        num_batches=snapshot.num_batches, num_samples=snapshot.num_samples,
        num_requests=snapshot.num_requests, num_stolen_requests=snapshot.num_stolen_requests,
        turn_wait_s=snapshot.turn_wait_s,
        running_requests=snapshot.running_requests,
        stages=[ef.PipelineStage(**stage) for stage in snapshot.stages],
        num_repartitions=snapshot.num_repartitions, healthy=snapshot.healthy,
        restarts=snapshot.restarts, location=snapshot.location,
        unusable_reason=snapshot.unusable_reason,
        batch_size_counts=snapshot.batch_size_counts)


class StatsServicer(ef_grpc.EvenflowStatsServicer):
    def __init__(self, *, models: ModelTable, gpu_samples: Callable[[], list[GpuSample]],
                 placement: Callable[[], PlacementSnapshot | None] = lambda: None) -> None:
        self._models = models
        self._gpu_samples = gpu_samples
        self._placement = placement
        self._started_s = time.monotonic()

    @answers_errors
    async def GetStats(self, request: ef.GetStatsRequest,
                       context: grpc.aio.ServicerContext) -> ef.GetStatsResponse:
        models = [m for m in self._models if not request.model_name or m.name == request.model_name]
        if request.model_name and not models:
            raise ModelNotFound(f"unknown model {request.model_name[:64]!r}")
        response = ef.GetStatsResponse(uptime_s=time.monotonic() - self._started_s)
        for model in models:
            snap = model.balancer.snapshot()
            response.models.append(ef.ModelBalancerStats(
                model_name=snap.model_name, policy=snap.policy, batch_policy=snap.batch_policy,
                latency_target_s=snap.latency_target_s, queued_requests=snap.queued_requests,
                num_rejected=snap.num_rejected, rejected_by_reason=snap.rejected_by_reason,
                dropped_by_reason=snap.dropped_by_reason,
                replicas=[_replica(r) for r in snap.replicas]))
        for gpu in self._gpu_samples():
            response.devices.append(ef.DeviceStats(
                name=gpu.name, utilization=gpu.utilization,
                memory_used_bytes=gpu.memory_used_bytes,
                memory_total_bytes=gpu.memory_total_bytes, sm_clock_mhz=gpu.sm_clock_mhz,
                throttle_reasons=gpu.throttle_reasons, temperature_c=gpu.temperature_c,
                unsupported=sorted(gpu.unsupported), stale=gpu.stale))
        response.placement.CopyFrom(placement_message(self._placement(), self._started_s))
        return response


def placement_message(snapshot: PlacementSnapshot | None, started_s: float) -> ef.Placement:
    """The placement as the stats RPC reports it; mode "all" and nothing else without a
    placer. Move times become seconds since ``started_s`` (the server's start)."""
    if snapshot is None:
        return ef.Placement(mode="all")
    return ef.Placement(
        mode=snapshot.mode,
        replicas=[ef.PlacedReplica(model=m, device=d, state=state)
                  for m, d, state in snapshot.replicas],
        moves=dict(snapshot.moves),
        recent=[ef.PlacementMove(at_s=r.at_s - started_s, kind=r.kind, model=r.model,
                                 device=r.device, reason=r.reason, took_s=r.took_s,
                                 outcome=r.outcome) for r in snapshot.recent],
        demand_per_s=dict(snapshot.demand_per_s),
        requests_per_s=dict(snapshot.requests_per_s),
        long_demand_per_s=dict(snapshot.long_demand_per_s),
        long_requests_per_s=dict(snapshot.long_requests_per_s),
        devices=[ef.PlacementDevice(device=d.device,
                                    memory_bytes=d.memory_bytes if d.limited else 0,
                                    reserved_bytes=max(d.reserved_bytes, 0))
                 for d in snapshot.devices],
        models=[ef.PlacementModel(model=m.model, memory_bytes=m.memory_bytes, load_s=m.load_s)
                for m in snapshot.models])


class AdminServicer(ef_grpc.EvenflowAdminServicer):
    """Changes simulated devices while serving; registered only with ``--admin``."""

    def __init__(self, *, models: ModelTable) -> None:
        self._models = models

    @answers_errors
    async def SetDeviceSpeed(self, request: ef.SetDeviceSpeedRequest,
                             context: grpc.aio.ServicerContext) -> ef.SetDeviceSpeedResponse:
        if request.speed <= 0:
            raise InvalidRequest("speed must be > 0")
        previous: float | None = None
        for model in self._models:  # every model's worker (or pipeline stage) on that device
            speed = await model.balancer.set_device_speed(request.device, request.speed)
            previous = speed if speed is not None else previous
        if previous is None:
            raise DeviceNotFound(f"no simulated device named {request.device[:64]!r}")
        return ef.SetDeviceSpeedResponse(previous_speed=previous or 0.0)

    @answers_errors
    async def SetDeviceFault(self, request: ef.SetDeviceFaultRequest,
                             context: grpc.aio.ServicerContext) -> ef.SetDeviceFaultResponse:
        found = False
        for model in self._models:  # every model's worker on that device
            if await model.balancer.set_device_fault(request.device, request.fault,
                                                     request.count):
                found = True
        if not found:
            raise DeviceNotFound(f"no simulated device named {request.device[:64]!r}")
        return ef.SetDeviceFaultResponse()
