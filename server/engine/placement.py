"""The engine's side of ``--placement auto``: what the placer needs to know of each device and
model (memory, speed, the batch cost before any is measured), and the placer itself."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from evenflow.balancer import WorkerStatus
from evenflow.balancer.capacity import DeviceCost, rate_within_per_s
from evenflow.balancer.placement.auto import AutoStrategy
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile
from evenflow.balancer.placement.placer import Placer, ReplicaLoader
from evenflow.balancer.timebase import LoopTime
from evenflow.server.config.server_config import ModelConfig, ServerConfig
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.devices import DeviceSpec

# A sim device declares no memory unless told to: placement is then bounded by replica counts.
UNLIMITED_BYTES = 1 << 62
# What a GPU's replicas may use of its memory: the CUDA context, the allocator's cache and
# other processes need the rest.
GPU_USABLE = 0.9


def device_memory_bytes(device: DeviceSpec, declared: Mapping[str, int]) -> int:
    if device.name in declared:
        return declared[device.name]
    if device.kind == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(device.index).total_memory * GPU_USABLE)
    if device.kind == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return UNLIMITED_BYTES


def device_infos(devices: Sequence[DeviceSpec], config: ServerConfig) -> list[DeviceInfo]:
    return [DeviceInfo(d.name, device_memory_bytes(d, config.device_memory_bytes))
            for d in devices]


def prior_cost(model: ModelConfig, definition: ModelDefinition) -> DeviceCost:
    """The batch cost at speed 1 before the model has run anywhere: a sim model's declared
    one, else the balancer's prior."""
    profile = model.sim_profile or (definition.sim_profile if model.source == "sim" else None)
    if profile is not None:
        return DeviceCost(profile.base_ms / 1000.0, profile.per_sample_ms / 1000.0)
    assert model.balancer is not None  # resolved
    return DeviceCost(model.balancer.prior_base_s, model.balancer.prior_per_sample_s)


def parameter_bytes(definition: ModelDefinition) -> int:
    """Parameters and buffers: a replica's footprint where none is declared or measured."""
    module = definition.module
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def replica_memory_bytes(declared_bytes: int | None, parameters_bytes: int,
                         statuses: Iterable[WorkerStatus]) -> int:
    """What one replica needs: the declared figure, else its parameters and buffers plus the
    largest activation peak its warmed-up workers measured (CUDA; none elsewhere)."""
    if declared_bytes:
        return declared_bytes
    peaks = [p for status in statuses if (p := status.activation_peak_bytes) is not None]
    return parameters_bytes + max(peaks, default=0)


def profile(model: ModelConfig, memory_bytes: int, devices: Sequence[DeviceSpec],
            prior: DeviceCost, load_s: float) -> ModelProfile:
    assert model.balancer is not None  # resolved
    balancer = model.balancer
    return ModelProfile(
        name=model.name, memory_bytes=memory_bytes,
        costs={d.name: DeviceCost(prior.base_s, prior.per_sample_s, d.speed) for d in devices},
        max_batch=balancer.max_batch, slo_s=balancer.slo_s or balancer.latency_target_s,
        load_s=load_s, min_replicas=model.min_replicas, max_replicas=model.max_replicas,
        pinned=frozenset(model.pinned))


def first_devices(template: ModelProfile, free_bytes: Mapping[str, int]) -> list[str]:
    """Where a model's first replicas go: its pinned devices, then the devices it serves
    fastest on among those with room, up to its floor and at least one (a model loaded is
    ready to serve; one with ``min_replicas = 0`` may still start with none when memory is
    full). The planner moves them from there."""
    chosen = sorted(template.pinned)
    wanted = max(template.min_replicas, len(chosen), 1)
    ranked = sorted((d for d in free_bytes if d not in chosen
                     and free_bytes[d] >= template.memory_bytes),
                    key=lambda d: -rate_within_per_s(template.costs[d], template.slo_s,
                                                     template.max_batch))
    return chosen + ranked[:max(0, wanted - len(chosen))]


def make_placer(devices: Sequence[DeviceSpec], config: ServerConfig,
                loader: ReplicaLoader) -> Placer:
    return Placer(devices=device_infos(devices, config),
                  speeds={d.name: d.speed for d in devices}, loader=loader,
                  strategy=AutoStrategy(), time_source=LoopTime(), mode="auto")
